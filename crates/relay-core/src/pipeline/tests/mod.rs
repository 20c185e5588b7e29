//! The loop against in-memory fakes: a scripted source, a broker that stores by `Nats-Msg-Id`
//! with injectable faults and ack delays, and a store that checks the delivery rule on every
//! save.

mod anchors;
mod fakes;
mod held;
mod messages;
mod order;
mod shutdown;
mod trail;

use pgoutput::{Insert, Update};

use super::*;
use crate::route::RouteError;
use crate::stage::{SourceError, StoreError};
use fakes::*;

#[tokio::test(start_paused = true)]
async fn publishes_in_commit_order_and_confirms_the_last_commit() {
    let mut events = preamble();
    events.extend(tx(1, &["a", "b"]));
    // A transaction touching only another table.
    events.push(begin(2));
    events.push(SourceEvent::Message(LogicalMessage::Insert(Insert {
        relation_id: OTHER,
        new: row(&["9"]),
    })));
    events.push(commit(2));
    // Insert then update of an outbox row in one transaction: the insert is published.
    events.extend(tx(3, &["c"]));
    events.insert(
        events.len() - 1,
        SourceEvent::Message(LogicalMessage::Update(Update {
            relation_id: OUTBOX,
            old: None,
            new: row(&["c", "x", "x", "x", "x"]),
        })),
    );
    let (result, h) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    let outcome = result.unwrap();
    assert_eq!(outcome.confirmed, Lsn(3000));
    assert_eq!(stream_ids(&h), ["a", "b", "c"]);
    assert_eq!(h.saved.lock().unwrap().last(), Some(&Lsn(3000)));
    assert_eq!(h.confirmed.lock().unwrap().last(), Some(&Lsn(3000)));
    assert_eq!(h.stats.changes_skipped.load(Ordering::Relaxed), 2);
    let broker = h.broker.0.lock().unwrap();
    assert_eq!(broker.stream[2].header("Outbox-Tx-Index"), Some("0"));
    assert_eq!(broker.stream[1].header("Outbox-Tx-Index"), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn out_of_order_acks_never_let_a_checkpoint_pass_an_unacked_event() {
    let broker = FakeBroker::default();
    let mut events = preamble();
    let mut n = 0;
    for t in 1..=40u64 {
        let ids: Vec<String> = (0..(t % 4)).map(|i| format!("e{t}-{i}")).collect();
        for id in &ids {
            n += 1;
            // Scattered ack delays: acks come back in an order unrelated to commit order.
            let delay = Duration::from_millis((n * 7919) % 97 * 10);
            broker.0.lock().unwrap().delays.insert(id.clone(), delay);
        }
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        events.extend(tx(t, &refs));
    }
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(50),
        ..PipelineConfig::default()
    };
    // CheckingStore asserts the rule on every save.
    let (result, h) = run_script(events, broker, config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(40_000));
    assert_eq!(stream_ids(&h).len(), n as usize);
    let saved = h.saved.lock().unwrap().clone();
    assert!(saved.len() > 2, "several checkpoints: {saved:?}");
    assert!(
        saved.windows(2).all(|w| w[0] < w[1]),
        "monotonic: {saved:?}"
    );
    assert_eq!(
        *h.confirmed.lock().unwrap(),
        saved,
        "confirm follows every save, in order"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_ack_is_republished_and_deduplicated() {
    let broker = FakeBroker::default();
    broker
        .0
        .lock()
        .unwrap()
        .faults
        .insert("b".into(), [Fault::FailAfterWrite].into());
    let mut events = preamble();
    events.extend(tx(1, &["a", "b", "c"]));
    let (result, h) = run_script(events, broker, PipelineConfig::default(), false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(1000));
    assert_eq!(stream_ids(&h), ["a", "b", "c"], "one copy of b");
    assert_eq!(h.stats.duplicates.load(Ordering::Relaxed), 1);
    assert_eq!(h.stats.publish_retries.load(Ordering::Relaxed), 1);
    assert_eq!(h.broker.0.lock().unwrap().sends, 4);
}

#[tokio::test(start_paused = true)]
async fn a_forged_ack_past_the_streams_last_sequence_is_never_checkpointed() {
    let broker = FakeBroker::default();
    broker
        .0
        .lock()
        .unwrap()
        .faults
        .insert("b".into(), [Fault::Forged].into());
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.extend(tx(2, &["b"]));
    events.extend(tx(3, &["c"]));
    let (result, h) = run_script(events, broker, PipelineConfig::default(), false).await;
    let error = result.unwrap_err();
    assert!(
        matches!(
            error,
            PipelineError::AcksNotHeld {
                highest_seq: 999_999,
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(stream_ids(&h), ["a", "c"], "b was never stored");
    let saved = h.saved.lock().unwrap().clone();
    assert!(
        saved.iter().all(|lsn| *lsn < Lsn(2000)),
        "a checkpoint moved past b, which the stream does not hold: {saved:?}"
    );
    assert!(
        h.confirmed
            .lock()
            .unwrap()
            .iter()
            .all(|lsn| *lsn < Lsn(2000)),
        "the slot heard of a position past b"
    );
    assert_eq!(h.stats.acks_not_held.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_event_stops_the_relay_before_its_transaction() {
    let broker = FakeBroker::default();
    broker
        .0
        .lock()
        .unwrap()
        .faults
        .insert("bad".into(), [Fault::Reject].into());
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.extend(tx(2, &["b", "bad"]));
    events.extend(tx(3, &["c"]));
    let (result, h) = run_script(events, broker, PipelineConfig::default(), false).await;
    match result {
        Err(PipelineError::Publish { event_id, .. }) => assert_eq!(event_id, "bad"),
        other => panic!("expected a publish error, got {other:?}"),
    }
    let saved = h.saved.lock().unwrap().clone();
    assert!(
        saved.iter().all(|l| *l <= Lsn(1000)),
        "nothing past tx 1: {saved:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_row_that_cannot_be_routed_stops_before_its_transaction() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.extend(tx(2, &[""])); // empty event id
    let (result, h) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    assert!(matches!(
        result,
        Err(PipelineError::Route {
            error: RouteError::MissingEventId { .. },
            ..
        })
    ));
    assert_eq!(h.saved.lock().unwrap().last(), Some(&Lsn(1000)));
}

#[tokio::test(start_paused = true)]
async fn keepalives_advance_only_while_nothing_is_in_flight() {
    let broker = FakeBroker::with_delay("slow", Duration::from_secs(3));
    let mut events = preamble();
    events.push(SourceEvent::KeepAlive { wal_end: Lsn(500) });
    events.extend(tx(1, &["slow"]));
    // The server is far ahead (other tables' WAL), but "slow" is not acked yet.
    events.push(SourceEvent::KeepAlive { wal_end: Lsn(9000) });
    events.push(SourceEvent::KeepAlive { wal_end: Lsn(9500) });
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(10),
        idle_checkpoint_interval: Duration::from_millis(50),
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, broker, config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(1000));
    let saved = h.saved.lock().unwrap().clone();
    assert_eq!(
        saved.first(),
        Some(&Lsn(500)),
        "idle keepalive is confirmed"
    );
    assert!(
        !saved.iter().any(|l| *l > Lsn(1000)),
        "keepalive behind an unacked event: {saved:?}"
    );

    // With nothing in flight the same keepalive is confirmed.
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(SourceEvent::KeepAlive { wal_end: Lsn(9000) });
    let (result, _) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    assert_eq!(result.unwrap().confirmed, Lsn(9000));
}

#[tokio::test(start_paused = true)]
async fn the_in_flight_window_is_bounded() {
    let broker = FakeBroker::default();
    let mut events = preamble();
    let ids: Vec<String> = (0..500).map(|i| format!("e{i}")).collect();
    for id in &ids {
        let mut s = broker.0.lock().unwrap();
        s.delays.insert(id.clone(), Duration::from_millis(50));
    }
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    events.extend(tx(1, &refs));
    let config = PipelineConfig {
        max_in_flight: 32,
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, broker, config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(1000));
    let max = h.broker.0.lock().unwrap().max_outstanding;
    assert!(max <= 32 && max > 1, "max outstanding {max}");
    assert_eq!(stream_ids(&h), ids);
}

#[tokio::test(start_paused = true)]
async fn a_source_failure_drains_and_checkpoints_the_acked_prefix() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(begin(2));
    events.push(outbox_insert("b")); // transaction 2 never commits: the stream breaks
    let (result, h) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        true,
    )
    .await;
    assert!(matches!(result, Err(PipelineError::Source(_))));
    // "b" waits for its transaction's Commit, which never comes: never sent (read and
    // published after the restart).
    assert_eq!(h.broker.0.lock().unwrap().outstanding, 0);
    assert_eq!(h.broker.0.lock().unwrap().sends, 1, "only a was sent");
    assert_eq!(
        h.saved.lock().unwrap().last(),
        Some(&Lsn(1000)),
        "not past the open tx"
    );
}

#[tokio::test(start_paused = true)]
async fn keepalive_only_progress_is_stored_at_the_idle_interval() {
    // Every checkpoint write is WAL itself; storing each keepalive at checkpoint_interval would
    // keep an idle database writing forever.
    let mut events = preamble();
    for i in 1..=30u64 {
        events.push(SourceEvent::KeepAlive {
            wal_end: Lsn(i * 100),
        });
    }
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(10),
        idle_checkpoint_interval: Duration::from_secs(1),
        ..PipelineConfig::default()
    };
    // 30 keepalives 100 ms apart: about 3 s, so about 3 idle checkpoints plus the final one.
    let (result, h) = run_script(events, FakeBroker::default(), config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(3000));
    let saved = h.saved.lock().unwrap().clone();
    assert!((2..=5).contains(&saved.len()), "{saved:?}");
    assert_eq!(
        saved.last(),
        Some(&Lsn(3000)),
        "final position stored at shutdown"
    );
}

#[tokio::test(start_paused = true)]
async fn events_already_in_the_stream_are_not_published_again() {
    let mut events = preamble();
    events.extend(tx(1, &["a", "b", "c"]));
    let (result, h) = run_script_skipping(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
        ["b".to_owned()].into(),
    )
    .await;
    assert_eq!(result.unwrap().confirmed, Lsn(1000));
    assert_eq!(stream_ids(&h), ["a", "c"]);
    assert_eq!(h.stats.already_published.load(Ordering::Relaxed), 1);
    // The Tx-Index stays the row's position in its transaction.
    let broker = h.broker.0.lock().unwrap();
    assert_eq!(broker.stream[1].header("Outbox-Tx-Index"), Some("2"));
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_subject_takes_unroutable_rows_and_the_relay_continues() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.extend(tx(2, &[""])); // empty event id
    events.extend(tx(3, &["b"]));
    let config = PipelineConfig {
        dead_letter_subject: Some("outbox.dlq".into()),
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, FakeBroker::default(), config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(3000));
    let broker = h.broker.0.lock().unwrap();
    let dead = &broker.stream[1];
    assert_eq!(dead.subject, "outbox.dlq");
    assert_eq!(dead.event_id, format!("dlq:public.outbox:{}:0", Lsn(1990)));
    assert!(dead.header(HEADER_DLQ_REASON).unwrap().contains("event id"));
    assert_eq!(dead.header("Outbox-Table"), Some("public.outbox"));
    let row: serde_json::Value = serde_json::from_slice(&dead.payload).unwrap();
    assert_eq!(row["aggregatetype"], "Order");
    assert_eq!(broker.stream[2].event_id, "b");
    assert_eq!(h.stats.dead_lettered.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn an_event_id_collision_stops_before_its_transaction() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.extend(tx(2, &["a"])); // identical: a re-send, no collision
    events.push(begin(3));
    events.push(SourceEvent::Message(LogicalMessage::Insert(Insert {
        relation_id: OUTBOX,
        new: row(&["a", "Order", "1", "Created", r#"{"other":1}"#]),
    })));
    events.push(commit(3));
    let (result, h) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    assert!(
        matches!(
            result,
            Err(PipelineError::Route {
                error: RouteError::IdCollision { .. },
                ..
            })
        ),
        "{result:?}"
    );
    assert!(h.saved.lock().unwrap().iter().all(|l| *l <= Lsn(2000)));
}

#[tokio::test(start_paused = true)]
async fn a_renamed_outbox_table_stops_before_its_transaction_even_with_a_dead_letter_subject() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    // ALTER TABLE outbox RENAME TO outbox_old: pgoutput announces the same OID under the new
    // name before the next row, inside that row's transaction.
    let mut renamed = tx(2, &["b"]);
    renamed.insert(
        1,
        relation(
            OUTBOX,
            "outbox_old",
            &["id", "aggregatetype", "aggregateid", "type", "payload"],
        ),
    );
    events.extend(renamed);
    events.extend(tx(3, &[])); // later WAL the checkpoint must not reach
    let config = PipelineConfig {
        dead_letter_subject: Some("outbox.dlq".into()),
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, FakeBroker::default(), config, false).await;
    assert!(
        matches!(
            result,
            Err(PipelineError::Schema {
                xid: Some(2),
                error: RouteError::OutboxRenamed { .. },
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(stream_ids(&h), ["a"], "nothing of the renamed table's rows");
    assert_eq!(h.saved.lock().unwrap().last(), Some(&Lsn(1000)));
    assert_eq!(h.confirmed.lock().unwrap().last(), Some(&Lsn(1000)));
    assert_eq!(h.stats.dead_lettered.load(Ordering::Relaxed), 0);
    assert_eq!(h.stats.changes_skipped.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_renamed_mapped_column_stops_with_a_schema_error_or_dead_letters_when_asked() {
    let columns_then = ["id", "agg_type", "aggregateid", "type", "payload"];
    let script = || {
        let mut events = preamble();
        events.extend(tx(1, &["a"]));
        let mut renamed = tx(2, &["b"]);
        renamed.insert(1, relation(OUTBOX, "outbox", &columns_then));
        events.extend(renamed);
        events
    };
    let (result, h) = run_script(
        script(),
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    assert!(
        matches!(
            result,
            Err(PipelineError::Schema {
                error: RouteError::ColumnRenamed { .. },
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(h.saved.lock().unwrap().last(), Some(&Lsn(1000)));
    let config = PipelineConfig {
        dead_letter_subject: Some("outbox.dlq".into()),
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(script(), FakeBroker::default(), config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(2000));
    let broker = h.broker.0.lock().unwrap();
    assert_eq!(broker.stream[1].subject, "outbox.dlq");
    assert!(
        broker.stream[1]
            .header(HEADER_DLQ_REASON)
            .unwrap()
            .contains("renamed to `agg_type`")
    );
}

#[tokio::test(start_paused = true)]
async fn a_begin_arriving_as_a_plain_message_is_a_protocol_error_not_a_skip() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(SourceEvent::Message(LogicalMessage::Begin(
        pgoutput::Begin {
            final_lsn: Lsn(1990),
            commit_time: 0,
            xid: 9,
        },
    )));
    events.extend(tx(2, &["b"]));
    let (result, h) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    assert!(
        matches!(
            result,
            Err(PipelineError::Protocol(FrontierError::Unframed("Begin")))
        ),
        "{result:?}"
    );
    assert_eq!(h.stats.changes_skipped.load(Ordering::Relaxed), 0);
    assert_eq!(h.saved.lock().unwrap().last(), Some(&Lsn(1000)));
}
