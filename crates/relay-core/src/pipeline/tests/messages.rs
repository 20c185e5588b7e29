//! Logical decoding messages (`pg_logical_emit_message`) through the loop: ordered with the rows
//! of their transaction, refused or dead-lettered like bad rows, non-transactional ones as
//! transactions of their own that the frontier cannot pass before their ack.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use pgoutput::Message;

use super::fakes::*;
use super::*;
use crate::route::{MessageRouteConfig, OutboxTableConfig};

fn emit(transactional: bool, lsn: u64, prefix: &str, content: &str) -> SourceEvent {
    SourceEvent::Message(LogicalMessage::Message(Message {
        transactional,
        lsn: Lsn(lsn),
        prefix: prefix.into(),
        content: Bytes::copy_from_slice(content.as_bytes()),
    }))
}

fn envelope(id: &str) -> String {
    format!(r#"{{"id": "{id}", "subject": "outbox.msg.{id}", "payload": {{"n": 1}}}}"#)
}

/// Runs `events` with `[[messages]]` `configs`; the checking store knows each transaction's
/// events (rows and messages of configured prefixes), and each non-transactional message as a
/// transaction that a restart past the start of its record skips (its LSN is the record's end,
/// so a save at or past that LSN needs it acked).
async fn run_messages(
    events: Vec<SourceEvent>,
    configs: &[MessageRouteConfig],
    config: PipelineConfig,
    broker: FakeBroker,
) -> (Result<RunOutcome, PipelineError>, Harness) {
    let prefixes: Vec<&str> = configs.iter().map(|c| c.prefix.as_str()).collect();
    let mut txs = Vec::new();
    let mut current = Vec::new();
    let id_of = |m: &Message| {
        serde_json::from_slice::<serde_json::Value>(&m.content)
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_owned))
    };
    for e in &events {
        match e {
            SourceEvent::Begin { .. } => current.clear(),
            SourceEvent::Message(LogicalMessage::Insert(i)) if i.relation_id == OUTBOX => {
                if let Some(pgoutput::TupleValue::Text(id)) = i.new.values.first() {
                    current.push(String::from_utf8_lossy(id).into_owned());
                }
            }
            SourceEvent::Message(LogicalMessage::Message(m))
                if prefixes.contains(&m.prefix.as_str()) =>
            {
                // A bad envelope's stand-in is its dead letter.
                let id = id_of(m).unwrap_or_else(|| format!("dlq:message:{}:{}", m.prefix, m.lsn));
                if m.transactional {
                    current.push(id);
                } else {
                    txs.push((Lsn(m.lsn.0 - 1), vec![id]));
                }
            }
            SourceEvent::Commit { commit_lsn, .. } => txs.push((*commit_lsn, current.clone())),
            _ => {}
        }
    }
    let saved = Arc::new(Mutex::new(Vec::new()));
    let confirmed = Arc::new(Mutex::new(Vec::new()));
    let anchors = Arc::new(Mutex::new(Vec::new()));
    let streams = Arc::new(Mutex::new(Vec::new()));
    let stats = Arc::new(PipelineStats::default());
    let source = ScriptedSource {
        events: events.into(),
        confirmed: confirmed.clone(),
        then_fail: false,
        keepalive_due: None,
    };
    let store = CheckingStore {
        broker: broker.clone(),
        txs,
        saved: saved.clone(),
        anchors: anchors.clone(),
        streams: streams.clone(),
    };
    let router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")])
        .unwrap()
        .with_messages(configs)
        .unwrap();
    let mut pipeline = Pipeline::new(
        source,
        broker.clone(),
        store,
        router,
        Lsn(1),
        config,
        stats.clone(),
    );
    pipeline.skip_published(HashMap::new());
    let result = pipeline.run(std::future::pending()).await;
    (
        result,
        Harness {
            broker,
            saved,
            anchors,
            streams,
            confirmed,
            stats,
        },
    )
}

fn outbox() -> Vec<MessageRouteConfig> {
    vec![MessageRouteConfig::with_defaults("outbox")]
}

#[tokio::test(start_paused = true)]
async fn messages_and_rows_of_a_transaction_are_published_in_order_with_one_index() {
    let mut events = preamble();
    events.push(begin(1));
    events.push(emit(true, 900, "outbox", &envelope("m1")));
    events.push(outbox_insert("r1"));
    events.push(emit(true, 920, "someone-else", "not even json"));
    events.push(emit(true, 930, "outbox", &envelope("m2")));
    events.push(commit(1));
    events.extend(tx(2, &["r2"]));
    let (result, h) = run_messages(
        events,
        &outbox(),
        PipelineConfig::default(),
        FakeBroker::default(),
    )
    .await;
    assert_eq!(result.unwrap().confirmed, Lsn(2000));
    assert_eq!(stream_ids(&h), ["m1", "r1", "m2", "r2"]);
    let broker = h.broker.0.lock().unwrap();
    let index: Vec<_> = broker
        .stream
        .iter()
        .map(|m| m.header("Outbox-Tx-Index").unwrap_or("-").to_owned())
        .collect();
    assert_eq!(index, ["0", "1", "2", "0"]);
    assert_eq!(broker.stream[0].header("Outbox-Xid"), Some("1"));
    assert_eq!(broker.stream[0].header("Outbox-Commit-Lsn"), Some("0/3DE"));
    assert_eq!(
        broker.stream[0].header("Outbox-Message-Prefix"),
        Some("outbox")
    );
    assert_eq!(broker.stream[0].subject, "outbox.msg.m1");
    assert_eq!(h.stats.messages_skipped.load(Ordering::Relaxed), 1);
    assert_eq!(h.stats.events_received.load(Ordering::Relaxed), 4);
}

#[tokio::test(start_paused = true)]
async fn without_messages_configured_every_message_is_skipped_and_counted() {
    let mut events = preamble();
    events.push(begin(1));
    events.push(emit(true, 900, "outbox", &envelope("m1")));
    events.push(outbox_insert("r1"));
    events.push(commit(1));
    events.push(emit(false, 1500, "outbox", &envelope("n1")));
    let (result, h) = run_messages(
        events,
        &[],
        PipelineConfig::default(),
        FakeBroker::default(),
    )
    .await;
    assert_eq!(result.unwrap().confirmed, Lsn(1000));
    assert_eq!(stream_ids(&h), ["r1"]);
    assert_eq!(h.stats.messages_skipped.load(Ordering::Relaxed), 2);
}

#[tokio::test(start_paused = true)]
async fn a_bad_envelope_stops_before_its_transaction_naming_prefix_and_lsn() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(begin(2));
    events.push(outbox_insert("b"));
    events.push(emit(true, 1900, "outbox", r#"{"subject": "outbox.x"}"#));
    events.push(commit(2));
    let (result, h) = run_messages(
        events,
        &outbox(),
        PipelineConfig::default(),
        FakeBroker::default(),
    )
    .await;
    let err = result.unwrap_err();
    let PipelineError::Route {
        xid, commit_lsn, ..
    } = &err
    else {
        panic!("expected a route error, got {err:?}");
    };
    assert_eq!((*xid, *commit_lsn), (2, Lsn(1990)));
    let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(chain.contains("prefix `outbox` at LSN 0/76C"), "{chain}");
    assert!(chain.contains("no `id`"), "{chain}");
    let saved = h.saved.lock().unwrap().clone();
    assert!(saved.iter().all(|l| *l <= Lsn(1000)), "{saved:?}");
}

#[tokio::test(start_paused = true)]
async fn a_bad_envelope_goes_to_the_dead_letter_subject_when_one_is_set() {
    let mut events = preamble();
    events.push(begin(1));
    events.push(emit(true, 900, "outbox", "not json"));
    events.push(emit(true, 950, "outbox", &envelope("good")));
    events.push(commit(1));
    let config = PipelineConfig {
        dead_letter_subject: Some("outbox.dlq".into()),
        ..PipelineConfig::default()
    };
    let (result, h) = run_messages(events, &outbox(), config, FakeBroker::default()).await;
    assert_eq!(result.unwrap().confirmed, Lsn(1000));
    assert_eq!(stream_ids(&h), ["dlq:message:outbox:0/384", "good"]);
    let broker = h.broker.0.lock().unwrap();
    assert_eq!(&broker.stream[0].payload[..], b"not json");
    assert_eq!(broker.stream[0].header("Outbox-Tx-Index"), Some("0"));
    assert_eq!(broker.stream[1].header("Outbox-Tx-Index"), Some("1"));
    assert_eq!(h.stats.dead_lettered.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_non_transactional_message_is_refused_by_default_before_anything_past_it() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(emit(false, 1500, "outbox", &envelope("n1")));
    events.extend(tx(2, &["b"]));
    let (result, h) = run_messages(
        events,
        &outbox(),
        PipelineConfig::default(),
        FakeBroker::default(),
    )
    .await;
    let err = result.unwrap_err();
    let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(chain.contains("non-transactional"), "{chain}");
    assert!(chain.contains("at LSN 0/5DC"), "{chain}");
    assert_eq!(stream_ids(&h), ["a"]);
    let saved = h.saved.lock().unwrap().clone();
    assert_eq!(saved.last(), Some(&Lsn(1000)), "{saved:?}");
}

#[tokio::test(start_paused = true)]
async fn an_allowed_non_transactional_message_holds_the_frontier_until_its_ack() {
    let allowed = vec![MessageRouteConfig {
        allow_non_transactional: true,
        ..MessageRouteConfig::with_defaults("outbox")
    }];
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(emit(false, 1500, "outbox", &envelope("n1")));
    events.push(SourceEvent::KeepAlive { wal_end: Lsn(1800) });
    events.extend(tx(2, &["b"]));
    let (result, h) = run_messages(
        events,
        &allowed,
        PipelineConfig::default(),
        FakeBroker::default(),
    )
    .await;
    assert_eq!(result.unwrap().confirmed, Lsn(2000));
    assert_eq!(stream_ids(&h), ["a", "n1", "b"]);
    let broker = h.broker.0.lock().unwrap();
    assert_eq!(broker.stream[1].header("Outbox-Xid"), Some("0"));
    assert_eq!(broker.stream[1].header("Outbox-Commit-Lsn"), Some("0/5DC"));
    assert_eq!(broker.stream[1].header("Outbox-Tx-Index"), Some("0"));
}

#[tokio::test(start_paused = true)]
async fn a_slow_ack_of_a_non_transactional_message_keeps_every_checkpoint_before_it() {
    let allowed = vec![MessageRouteConfig {
        allow_non_transactional: true,
        ..MessageRouteConfig::with_defaults("outbox")
    }];
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(emit(false, 1500, "outbox", &envelope("slow")));
    events.push(SourceEvent::KeepAlive { wal_end: Lsn(1800) });
    events.extend(tx(2, &["b"]));
    events.extend(tx(3, &["c"]));
    let broker = FakeBroker::with_delay("slow", Duration::from_secs(3));
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(50),
        ..PipelineConfig::default()
    };
    let (result, h) = run_messages(events, &allowed, config, broker).await;
    assert_eq!(result.unwrap().confirmed, Lsn(3000));
    let saved = h.saved.lock().unwrap().clone();
    // Saves before the slow ack stop at tx 1; the CheckingStore asserted the rule on each.
    assert!(saved.contains(&Lsn(1000)), "{saved:?}");
    assert!(
        !saved.contains(&Lsn(1800)),
        "keepalive behind an unacked message: {saved:?}"
    );
    assert_eq!(saved.last(), Some(&Lsn(3000)));
}

/// pgoutput reports a logical message at the end of its WAL record, where the next record
/// starts; when that is the commit record of the next transaction (`BEGIN; INSERT …;
/// SELECT pg_logical_emit_message(false, …); COMMIT`), a checkpoint one past the message's LSN
/// would make a restart skip that whole transaction. The checkpoint stops at the message's LSN
/// until the transaction's events are acknowledged.
#[tokio::test(start_paused = true)]
async fn a_non_transactional_message_right_before_a_commit_record_never_lets_a_save_skip_it() {
    let allowed = vec![MessageRouteConfig {
        allow_non_transactional: true,
        ..MessageRouteConfig::with_defaults("outbox")
    }];
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    events.push(emit(false, 1500, "outbox", &envelope("n1")));
    // Transaction 2's commit record starts where the message's record ends.
    events.push(SourceEvent::Begin {
        xid: 2,
        final_lsn: Lsn(1500),
        commit_time_micros: 0,
    });
    events.push(outbox_insert("slow"));
    events.push(SourceEvent::Commit {
        commit_lsn: Lsn(1500),
        end_lsn: Lsn(2000),
    });
    let broker = FakeBroker::with_delay("slow", Duration::from_secs(3));
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(50),
        ..PipelineConfig::default()
    };
    // The CheckingStore fails any save past 1500 before "slow" is acknowledged.
    let (result, h) = run_messages(events, &allowed, config, broker).await;
    assert_eq!(result.unwrap().confirmed, Lsn(2000));
    let saved = h.saved.lock().unwrap().clone();
    // The precondition: a checkpoint was stored while "slow" was still outstanding, at the
    // message's own LSN.
    assert!(saved.contains(&Lsn(1500)), "{saved:?}");
    assert_eq!(saved.last(), Some(&Lsn(2000)), "{saved:?}");
    assert_eq!(stream_ids(&h), ["a", "n1", "slow"]);
}
