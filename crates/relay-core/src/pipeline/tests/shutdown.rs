//! A clean stop that comes inside a transaction reads on to its commit, so the transaction can
//! be confirmed and the next start reads nothing of it again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::fakes::*;
use super::*;
use crate::route::OutboxTableConfig;

/// Yields its script; asks for shutdown just before yielding event number `shutdown_at`; after
/// the script, waits forever (a live stream with nothing new).
struct GatedSource {
    events: VecDeque<SourceEvent>,
    yielded: usize,
    shutdown_at: usize,
    shutdown: Arc<Notify>,
}

impl ChangeSource for GatedSource {
    async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        if self.yielded == self.shutdown_at {
            self.shutdown.notify_one();
            // Let the loop see the shutdown before this event.
            tokio::task::yield_now().await;
        }
        match self.events.pop_front() {
            Some(e) => {
                self.yielded += 1;
                Ok(Some(e))
            }
            None => std::future::pending().await,
        }
    }
    fn confirm(&mut self, _lsn: Lsn) {}
}

#[derive(Default, Clone)]
struct RecordingStore(Arc<Mutex<Vec<Lsn>>>);

impl CheckpointStore for RecordingStore {
    async fn load(&mut self) -> Result<Option<Lsn>, StoreError> {
        Ok(self.0.lock().unwrap().last().copied())
    }
    async fn save(&mut self, lsn: Lsn) -> Result<(), StoreError> {
        self.0.lock().unwrap().push(lsn);
        Ok(())
    }
}

async fn stop_inside_transaction(
    drain_timeout: Duration,
    commit_arrives: bool,
) -> (RunOutcome, Vec<String>) {
    let mut events: VecDeque<SourceEvent> = preamble().into();
    events.extend(tx(1, &["a"]));
    events.extend(tx(2, &["b", "c"]));
    if !commit_arrives {
        // The rest of the transaction never comes (a stalled server).
        events.pop_back();
    }
    // Shutdown arrives after Begin(2) and "b", before "c" (and Commit(2)).
    let shutdown_at = preamble().len() + 3 + 2;
    let shutdown = Arc::new(Notify::new());
    let source = GatedSource {
        events,
        yielded: 0,
        shutdown_at,
        shutdown: shutdown.clone(),
    };
    let broker = FakeBroker::default();
    let store = RecordingStore::default();
    let config = PipelineConfig {
        drain_timeout,
        ..PipelineConfig::default()
    };
    let router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    let mut pipeline = Pipeline::new(
        source,
        broker.clone(),
        store,
        router,
        Lsn(1),
        config,
        Arc::default(),
    );
    let outcome = pipeline
        .run(async move { shutdown.notified().await })
        .await
        .unwrap();
    let ids = broker
        .0
        .lock()
        .unwrap()
        .stream
        .iter()
        .map(|m| m.event_id.clone())
        .collect();
    (outcome, ids)
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_inside_a_transaction_reads_on_to_its_commit() {
    let (outcome, ids) = stop_inside_transaction(Duration::from_secs(20), true).await;
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(
        outcome.confirmed,
        Lsn(2000),
        "the open transaction is confirmed: nothing of it is read again"
    );
}

#[tokio::test(start_paused = true)]
async fn reading_on_to_the_commit_is_bounded_by_the_drain_timeout() {
    let (outcome, ids) = stop_inside_transaction(Duration::from_secs(2), false).await;
    // Without its Commit nothing of the transaction was handed to the publisher.
    assert_eq!(ids, ["a"]);
    assert_eq!(
        outcome.confirmed,
        Lsn(1000),
        "without its commit the transaction is not confirmed"
    );
}

/// The source fails inside a transaction (whose event would be slow to be acknowledged): its
/// events wait for a Commit that will not be read and cannot move the frontier, so the drain
/// ends as soon as everything before the transaction is acknowledged, not after
/// `drain_timeout`, and stores the position before it.
#[tokio::test(start_paused = true)]
async fn a_failure_inside_a_transaction_does_not_wait_out_the_drain_for_its_acks() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(begin(2));
    events.push(outbox_insert("b"));
    let broker = FakeBroker::with_delay("b", Duration::from_secs(60));
    let config = PipelineConfig {
        drain_timeout: Duration::from_secs(20),
        ..PipelineConfig::default()
    };
    let started = tokio::time::Instant::now();
    let (result, h) = run_script(events, broker, config, true).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(PipelineError::Source(_))),
        "{result:?}"
    );
    assert!(took < Duration::from_secs(1), "the drain waited {took:?}");
    let saved = h.saved.lock().unwrap().clone();
    assert_eq!(saved.last(), Some(&Lsn(1000)), "{saved:?}");
    // The open transaction's event waited for its Commit: never sent, read again after the
    // restart.
    assert_eq!(h.broker.0.lock().unwrap().outstanding, 0);
    assert_eq!(h.broker.0.lock().unwrap().sends, 1, "only a was sent");
}
