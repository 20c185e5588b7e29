//! The position anchor passed to the store with each checkpoint (`docs/replay.md`): lowest
//! sequence, earliest commit, and the guarantee the position lookup builds on.

use super::*;
use crate::stage::PositionAnchor;

/// Transaction `n` (commit LSN n*1000-10, end n*1000, commit time n seconds) with `ids`.
fn timed_tx(n: u64, ids: &[&str]) -> Vec<SourceEvent> {
    let mut v = tx(n, ids);
    v[0] = SourceEvent::Begin {
        xid: n as u32,
        final_lsn: Lsn(n * 1000 - 10),
        commit_time_micros: n as i64 * 1_000_000,
    };
    v
}

fn commit_lsn(n: u64) -> Lsn {
    Lsn(n * 1000 - 10)
}

/// The lookup of `docs/replay.md` over the recorded anchors: the anchor with the largest commit
/// LSN below `x`, then the lowest sequence of it and every later anchor (1 without one).
fn start_for(anchors: &[PositionAnchor], x: Lsn) -> u64 {
    let Some(lo) = anchors
        .iter()
        .filter(|a| a.commit_lsn < x)
        .map(|a| a.commit_lsn)
        .max()
    else {
        return 1;
    };
    anchors
        .iter()
        .filter(|a| a.commit_lsn >= lo)
        .map(|a| a.stream_seq)
        .min()
        .unwrap_or(1)
        .max(1)
}

/// The anchors as a store records them: one with `floor_unknown` takes the lower of its
/// sequence and the previous anchor's (0 without one).
fn as_stored(saves: &[(Lsn, Option<PositionAnchor>)]) -> Vec<PositionAnchor> {
    let mut out: Vec<PositionAnchor> = Vec::new();
    for mut anchor in saves.iter().filter_map(|(_, a)| a.clone()) {
        if anchor.floor_unknown {
            let previous = out.last().map_or(0, |a| a.stream_seq);
            anchor.stream_seq = anchor.stream_seq.min(previous);
        }
        out.push(anchor);
    }
    out
}

fn recorded(h: &Harness) -> Vec<PositionAnchor> {
    as_stored(&h.anchors.lock().unwrap())
}

#[tokio::test(start_paused = true)]
async fn the_anchor_has_the_lowest_sequence_and_the_earliest_commit_behind_the_checkpoint() {
    let broker = FakeBroker::storing_on_ack();
    {
        let mut b = broker.0.lock().unwrap();
        // a is slow: this broker stores a message when it acks it, so b and c land first.
        b.delays.insert("a".into(), Duration::from_millis(30));
    }
    let mut events = preamble();
    events.extend(timed_tx(1, &["a", "b"]));
    events.extend(timed_tx(2, &["c"]));
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(500),
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, broker, config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(2000));
    let anchors = h.anchors.lock().unwrap().clone();
    let (lsn, anchor) = anchors.last().expect("a save").clone();
    assert_eq!(lsn, Lsn(2000));
    let anchor = anchor.expect("an anchor for a checkpoint past events");
    assert_eq!(&*anchor.stream, "OUTBOX");
    assert_eq!(
        anchor.commit_lsn,
        commit_lsn(1),
        "earliest commit behind it"
    );
    assert_eq!(anchor.commit_time_micros, 1_000_000);
    assert_eq!(stream_ids(&h), ["b", "c", "a"]);
    assert_eq!(anchor.stream_seq, 1);
    assert!(!anchor.floor_unknown);
}

#[tokio::test(start_paused = true)]
async fn an_event_acked_beyond_the_checkpoint_lowers_the_anchor_of_that_checkpoint() {
    // b is lost on its first send and re-sent after a backoff, so the checkpoint waits at tx 1
    // while e (tx 3) is already acked at a sequence lower than b's. Keying anchors on "acks since
    // the last checkpoint" would give tx 2 the anchor (b, 3) and lose e at 2. (A broker that
    // stores out of order, as without the commit-order condition.)
    let broker = FakeBroker::storing_on_ack();
    broker
        .0
        .lock()
        .unwrap()
        .faults
        .insert("b".into(), [Fault::FailBeforeWrite].into());
    let mut events = preamble();
    events.extend(timed_tx(1, &["a"]));
    events.extend(timed_tx(2, &["b"]));
    events.extend(timed_tx(3, &["e"]));
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(20),
        retry_initial: Duration::from_millis(100),
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, broker, config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(3000));
    assert_eq!(stream_ids(&h), ["a", "e", "b"]);
    let passed: Vec<PositionAnchor> = h
        .anchors
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(_, a)| a.clone())
        .collect();
    assert_eq!(passed.len(), 2, "{passed:?}");
    let first = &passed[0];
    assert_eq!((first.commit_lsn, first.stream_seq), (commit_lsn(1), 1));
    assert!(
        first.floor_unknown,
        "b, in flight, was sent before any sequence was known"
    );
    assert_eq!(
        (passed[1].commit_lsn, passed[1].stream_seq),
        (commit_lsn(2), 2),
        "e (seq 2) was acked before this checkpoint and is behind it"
    );
    assert!(!passed[1].floor_unknown);
    assert_eq!(start_for(&recorded(&h), commit_lsn(3)), 2);
}

#[tokio::test(start_paused = true)]
async fn an_event_found_in_the_stream_at_start_up_positions_the_anchor_by_its_copy() {
    // Not published again, so never acked in this session: its sequence comes from the scan.
    let broker = FakeBroker::default();
    let mut events = preamble();
    events.extend(timed_tx(1, &["old"]));
    events.extend(timed_tx(2, &["new"]));
    {
        // The copy a previous session stored, at sequence 1.
        let mut b = broker.0.lock().unwrap();
        b.ids.insert("old".into());
        let copy = OutboundMessage {
            subject: "outbox.Order.Created".into(),
            event_id: "old".into(),
            headers: Vec::new(),
            shared_headers: 0,
            payload: bytes::Bytes::new(),
            table: "public.outbox".into(),
            commit_lsn: commit_lsn(1),
            commit_time_micros: 1_000_000,
        };
        b.stream.push(copy);
    }
    let (result, h) = run_script_skipping_at(
        events,
        broker,
        PipelineConfig::default(),
        false,
        [("old".to_string(), 1)].into(),
    )
    .await;
    assert_eq!(result.unwrap().confirmed, Lsn(2000));
    assert_eq!(stream_ids(&h), ["old", "new"]);
    let anchors = recorded(&h);
    let last = anchors.last().expect("anchor");
    assert_eq!((last.commit_lsn, last.stream_seq), (commit_lsn(1), 1));
}

/// Checks the lookup against `stream` with `anchors`: for every commit LSN `x` of `txs`, every
/// event in the stream committed at or after `x` has a copy at or after the message the lookup
/// finds (the first one at or after the anchors' start committed at or after `x`).
fn check_lookup(anchors: &[PositionAnchor], stream: &[(Lsn, String)], txs: u64, what: &str) {
    for t in 1..=txs {
        let x = commit_lsn(t);
        let start = start_for(anchors, x);
        let found = stream
            .iter()
            .enumerate()
            .skip(start as usize - 1)
            .find(|(_, (lsn, _))| *lsn >= x)
            .map_or(stream.len() + 1, |(i, _)| i + 1);
        for (lsn, id) in stream.iter().filter(|(lsn, _)| *lsn >= x) {
            let copy = stream
                .iter()
                .rposition(|(_, i)| i == id)
                .map(|i| i + 1)
                .unwrap_or_default();
            assert!(
                copy >= found,
                "{what}: from {x} the lookup starts at {start} and finds {found}, but {id} \
                 ({lsn}) is at {copy}; stream {stream:?}; anchors {anchors:?}"
            );
        }
    }
}

/// Every event committed at or after any commit LSN `x` has a copy at or after the sequence the
/// lookup returns for `x`, whatever the ack order and faults: lost acks (the broker stored the
/// message; the re-send is a duplicate of an earlier copy), lost sends (re-sent later, after
/// events committed after it), slow acks. Checked at every checkpoint, against the stream as it
/// was then (events not yet behind any checkpoint included), and at the end.
#[tokio::test(start_paused = true)]
async fn the_lookup_over_the_anchors_finds_every_event_from_any_position() {
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    for round in 0..30 {
        let broker = FakeBroker::default();
        let mut events = preamble();
        let mut count = 0;
        for t in 1..=40u64 {
            let ids: Vec<String> = (0..(next() % 4)).map(|i| format!("e{t}-{i}")).collect();
            for id in &ids {
                count += 1;
                let mut b = broker.0.lock().unwrap();
                b.delays
                    .insert(id.clone(), Duration::from_millis(next() % 120));
                let fault = match next() % 10 {
                    0 => Some(Fault::FailAfterWrite),
                    1 => Some(Fault::FailBeforeWrite),
                    _ => None,
                };
                if let Some(f) = fault {
                    b.faults.insert(id.clone(), [f].into());
                }
            }
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            events.extend(timed_tx(t, &refs));
        }
        // A small window spreads the run over many checkpoints.
        let config = PipelineConfig {
            checkpoint_interval: Duration::from_millis(10 + next() % 40),
            retry_initial: Duration::from_millis(50),
            max_in_flight: 2 + next() as usize % 6,
            ..PipelineConfig::default()
        };
        let (result, h) = run_script(events, broker, config, false).await;
        assert_eq!(result.unwrap().confirmed, Lsn(40_000), "round {round}");
        let saves = h.anchors.lock().unwrap().clone();
        let streams = h.streams.lock().unwrap().clone();
        assert!(saves.len() > 3, "round {round}: several checkpoints");
        for (i, stream) in streams.iter().enumerate() {
            let anchors = as_stored(&saves[..=i]);
            check_lookup(&anchors, stream, 40, &format!("round {round}, save {i}"));
        }
        let final_stream = streams.last().expect("saved");
        assert_eq!(
            final_stream.len(),
            count,
            "round {round}: every event stored"
        );
    }
}
