use std::collections::VecDeque;

use super::*;

/// A stream of events from a list, then its end.
struct Listed(VecDeque<SourceEvent>);

impl ChangeSource for Listed {
    async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        Ok(self.0.pop_front())
    }

    fn confirm(&mut self, _lsn: Lsn) {}
}

fn begin(commit: u64) -> SourceEvent {
    SourceEvent::Begin {
        xid: 1,
        final_lsn: Lsn(commit),
        commit_time_micros: 0,
    }
}

fn commit(commit: u64) -> SourceEvent {
    SourceEvent::Commit {
        commit_lsn: Lsn(commit),
        end_lsn: Lsn(commit + 8),
    }
}

fn keepalive(at: u64) -> SourceEvent {
    SourceEvent::KeepAlive { wal_end: Lsn(at) }
}

/// Every event the window hands out, and the position it reports.
async fn read(events: Vec<SourceEvent>, end: u64) -> (Vec<SourceEvent>, u64) {
    let reached = Arc::new(AtomicU64::new(0));
    let mut window = WindowSource::new(Listed(events.into()), Lsn(end), reached.clone());
    let mut out = Vec::new();
    while let Some(event) = window.next().await.unwrap() {
        out.push(event);
    }
    (out, reached.load(Ordering::Relaxed))
}

#[tokio::test]
async fn ends_before_the_first_transaction_committed_at_the_end() {
    let events = vec![begin(100), commit(100), begin(200), commit(200), begin(300)];
    let (out, reached) = read(events, 200).await;
    assert_eq!(
        out,
        vec![begin(100), commit(100)],
        "a commit at the end is past it"
    );
    assert_eq!(reached, 200, "the window is complete");
}

#[tokio::test]
async fn a_keepalive_past_the_end_ends_it_only_between_transactions() {
    // Inside the transaction the keepalive is handed on; after its Commit the next one ends it.
    let events = vec![
        begin(100),
        keepalive(500),
        commit(100),
        keepalive(500),
        begin(150),
    ];
    let (out, reached) = read(events, 200).await;
    assert_eq!(out, vec![begin(100), keepalive(500), commit(100)]);
    assert_eq!(reached, 200);
}

#[tokio::test]
async fn a_keepalive_before_the_end_and_a_stream_that_ends_early_keep_the_last_commit() {
    let events = vec![begin(100), commit(100), keepalive(150)];
    let (out, reached) = read(events, 200).await;
    assert_eq!(out.len(), 3, "everything before the end is handed on");
    assert_eq!(
        reached, 100,
        "the window is not complete: the last commit read"
    );
}
