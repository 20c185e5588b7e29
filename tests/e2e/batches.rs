//! `[nats] publish_mode = "atomic-batch"`: one PostgreSQL transaction = one
//! JetStream atomic batch on nats-server 2.12.1+, split at the batch limit; a batch the stream
//! already holds is not stored twice; older servers fall back to per-message with one warning.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::Publisher;
use relay_nats::{JetStreamPublisher, PublishMode};
use tokio_util::bytes::Bytes;

use crate::support::*;

const BATCH_MODE: &str = "publish_mode = \"atomic-batch\"\ncreate_stream = true";

/// Whether the test's nats-server takes `Nats-Msg-Id` inside atomic batches.
pub(crate) fn batches_supported(env: &Env) -> bool {
    env.nats.version_at_least((2, 12, 1))
}

/// The `Nats-Batch-Id` prefix of a message's transaction: its commit LSN as `X-Y` (hex).
fn lsn_id(m: &Received) -> String {
    let lsn = parse_lsn(m.header("Outbox-Commit-Lsn")).expect("lsn");
    format!("{:X}-{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// Asserts that `m` is in the batch of `first` (one id) and that the id names part `part` of
/// the transaction committed at `lsn`: `<lsn>-<part>-<run>-<n>`.
fn assert_in_batch(m: &Received, first: &Received, lsn: &str, part: usize) {
    let id = m.header("Nats-Batch-Id");
    assert_eq!(id, first.header("Nats-Batch-Id"), "one batch: {m:?}");
    assert!(
        id.starts_with(&format!("{lsn}-{part}-")),
        "batch id {id:?} names the transaction {lsn}, part {part}"
    );
}

/// Transactions of rows and a logical message each arrive as one batch (`Nats-Batch-Id`
/// `<commit LSN>-<part>-<run>-<n>`, sequences from 1, the commit header on the last), a one-row
/// transaction as a plain message; a 2,500-event
/// transaction arrives as batches of 1,000, 1,000 and 500 with one `Outbox-Tx-Index` sequence.
/// On a server before 2.12.1 the relay says so once and publishes per message.
#[tokio::test(flavor = "multi_thread")]
async fn each_transaction_is_one_atomic_batch_split_at_the_limit() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config_full(BATCH_MODE, "\n[[messages]]\nprefix = \"outbox\"\n");
    let relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;
    let mut db = env.db().await?;

    let tx = db.transaction().await?;
    let a = insert_event(&tx, "Order", "A", "{}").await?;
    tx.execute(
        "SELECT outbox_relay.emit_event('outbox', 'msg-1', 'outbox.msg.one', '{}')",
        &[],
    )
    .await?;
    let b = insert_event(&tx, "Order", "B", "{}").await?;
    tx.commit().await?;
    let single = insert_event(&db, "Order", "Single", "{}").await?;
    db.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         SELECT gen_random_uuid(), 'Bulk', g::text, 'Written', jsonb_build_object('g', g) \
         FROM generate_series(1, 2500) g",
        &[],
    )
    .await?;
    let got = wait_for_messages(&js, 2504, Duration::from_secs(60), Some(&relay)).await?;
    assert_eq!(got.len(), 2504, "one copy each");
    let ids: Vec<&str> = got[..4].iter().map(Received::id).collect();
    assert_eq!(ids, [a.as_str(), "msg-1", b.as_str(), single.as_str()]);

    if !batches_supported(&env) {
        relay
            .wait_log("publishing each message on its own", Duration::from_secs(5))
            .await?;
        assert!(
            got.iter().all(|m| !m.headers.contains_key("Nats-Batch-Id")),
            "no batch headers on nats-server {}",
            env.nats.version()
        );
        println!(
            "nats-server {}: fell back to per-message publishing",
            env.nats.version()
        );
        return Ok(());
    }
    relay
        .wait_log("publishing each transaction as one atomic batch", WAIT)
        .await?;
    // The first transaction: one batch of three.
    for (i, m) in got[..3].iter().enumerate() {
        assert_in_batch(m, &got[0], &lsn_id(&got[0]), 0);
        assert_eq!(
            m.header("Nats-Batch-Sequence"),
            (i + 1).to_string(),
            "{m:?}"
        );
        let commit = if i == 2 { "1" } else { "" };
        assert_eq!(m.header("Nats-Batch-Commit"), commit, "{m:?}");
    }
    // A transaction of one message goes on its own: atomic without a batch, and a batch costs
    // the server a staging store.
    assert_eq!(got[3].header("Nats-Batch-Id"), "", "{:?}", got[3]);
    assert_eq!(got[3].header("Nats-Batch-Commit"), "");
    // The large one: parts of 1,000, 1,000 and 500, in order.
    let bulk = &got[4..];
    let base = lsn_id(&bulk[0]);
    for (i, m) in bulk.iter().enumerate() {
        let (part, sequence) = (i / 1000, i % 1000 + 1);
        assert_in_batch(m, &bulk[part * 1000], &base, part);
        assert_eq!(
            m.header("Nats-Batch-Sequence"),
            sequence.to_string(),
            "message {i}"
        );
        assert_eq!(m.header("Outbox-Tx-Index"), i.to_string(), "message {i}");
        let last = sequence == 1000 || i == bulk.len() - 1;
        assert_eq!(m.header("Nats-Batch-Commit") == "1", last, "message {i}");
    }
    Ok(())
}

const WAIT: Duration = Duration::from_secs(30);

fn event(id: &str, commit_lsn: u64) -> Arc<OutboundMessage> {
    Arc::new(OutboundMessage {
        subject: format!("outbox.batch.{id}"),
        event_id: id.to_owned(),
        headers: vec![("Outbox-Tx-Index".into(), "0".into())],
        shared_headers: 0,
        payload: Bytes::from(format!("payload of {id}")),
        table: "public.outbox".into(),
        commit_lsn: Lsn(commit_lsn),
        commit_time_micros: 0,
    })
}

/// The same batch sent twice (a transaction read again): the server refuses the second one
/// whole, the publisher sends its messages one by one and JetStream answers each as a
/// duplicate; the stream keeps one copy of each. A batch holding one stored id and one new id
/// stores only the new one.
#[tokio::test(flavor = "multi_thread")]
async fn a_re_sent_batch_is_not_stored_twice() -> Result<()> {
    let env = Env::start().await?;
    if !batches_supported(&env) {
        println!(
            "nats-server {}: no atomic batches, nothing to re-send",
            env.nats.version()
        );
        return Ok(());
    }
    let client = async_nats::connect(env.nats.url()).await?;
    let js = async_nats::jetstream::new(client.clone());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        allow_atomic_publish: true,
        ..Default::default()
    })
    .await?;
    let publisher = JetStreamPublisher::with_default_limits(client, STREAM, WAIT, 64)
        .with_publish_mode(
            PublishMode::AtomicBatch,
            relay_nats::StreamTakes::BATCHES,
            64,
        );
    assert!(publisher.framing().atomic_batches());

    let send = |ids: &'static [&'static str], lsn: u64| {
        let publisher = publisher.clone();
        async move {
            publisher.begin_transaction(Lsn(lsn));
            let mut acks = Vec::new();
            for id in ids {
                acks.push(
                    publisher
                        .send(&event(id, lsn), None)
                        .await
                        .expect("handed over"),
                );
            }
            publisher.end_transaction();
            let mut receipts = Vec::new();
            for ack in acks {
                receipts.push(
                    tokio::time::timeout(WAIT, ack)
                        .await
                        .expect("acked in time")
                        .expect("stored"),
                );
            }
            receipts
        }
    };
    let first = send(&["b-1", "b-2", "b-3"], 0x100).await;
    assert_eq!(
        first
            .iter()
            .map(|r| (r.stream_seq, r.duplicate))
            .collect::<Vec<_>>(),
        [(1, false), (2, false), (3, false)]
    );
    let again = send(&["b-1", "b-2", "b-3"], 0x100).await;
    assert_eq!(
        again
            .iter()
            .map(|r| (r.stream_seq, r.duplicate))
            .collect::<Vec<_>>(),
        [(1, true), (2, true), (3, true)],
        "the re-sent batch is answered from the stored copies"
    );
    let mixed = send(&["b-3", "b-4"], 0x200).await;
    assert_eq!(
        mixed
            .iter()
            .map(|r| (r.stream_seq, r.duplicate))
            .collect::<Vec<_>>(),
        [(3, true), (4, false)]
    );
    let stored = read_stream(&env.jetstream().await?).await?;
    let ids: Vec<&str> = stored.iter().map(Received::id).collect();
    assert_eq!(ids, ["b-1", "b-2", "b-3", "b-4"], "one copy each");
    assert_eq!(stored[2].header("Nats-Batch-Commit"), "1");
    assert_eq!(
        stored[3].header("Nats-Batch-Id"),
        "",
        "b-4 was sent on its own"
    );
    Ok(())
}

/// Fault row M2: the kill -9 loop of `messages` with `publish_mode = "atomic-batch"`.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_loop_in_atomic_batch_mode_delivers_every_committed_event_once() -> Result<()> {
    let env = Env::start().await?;
    let scenario = if batches_supported(&env) {
        "M2 kill -9 loop, atomic batches (10 kills)"
    } else {
        "M2 kill -9 loop, atomic-batch mode falling back to per-message (10 kills)"
    };
    crate::messages::kill9_loop(&env, BATCH_MODE, scenario).await
}

/// `restore` publishes as the relay does: in atomic-batch mode each transaction of the window
/// comes back as one batch (the same batch ids), so consumers of a restored stream never see
/// half a transaction either; on a server before 2.12.1 it says so and publishes per message.
#[tokio::test(flavor = "multi_thread")]
async fn restore_in_atomic_batch_mode_brings_each_transaction_back_as_one_batch() -> Result<()> {
    use crate::restore::{
        checkpoint_past, describe, events, exactly_once_in_order, insert, relay_cmd,
    };
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let mut db = env.db().await?;
    let config = env.config_full(
        &format!("{BATCH_MODE}\nduplicate_window = \"1s\""),
        "replay_retention = \"1GB\"",
    );
    let relay = Relay::start_streaming(&config).await?;
    let window = insert(&mut db, 9, 3, "batch").await?;
    let stored = wait_for_messages(&js, 9, WAIT, Some(&relay)).await?;
    let evs = events(&stored);
    checkpoint_past(&env, evs.iter().map(|e| e.lsn).max().unwrap_or_default()).await?;

    // Gone from the stream and past the duplicate window: only the restore brings them back.
    js.get_stream(STREAM).await?.purge().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let out = relay_cmd(&config, &["restore", "--from-lsn", &evs[0].lsn_text]);
    assert!(out.status.success(), "{}", describe(&out));
    let restored = read_stream(&js).await?;
    exactly_once_in_order(&restored, &window);
    let log = String::from_utf8_lossy(&out.stderr);
    if !batches_supported(&env) {
        assert!(log.contains("publishing each message on its own"), "{log}");
        assert!(
            restored
                .iter()
                .all(|m| m.header("Nats-Batch-Id").is_empty())
        );
        return Ok(());
    }
    assert!(
        log.contains("publishing each transaction as one atomic batch"),
        "{log}"
    );
    for (i, m) in restored.iter().enumerate() {
        let (first, sequence) = (&restored[i - i % 3], i % 3 + 1);
        assert_in_batch(m, first, &lsn_id(first), 0);
        assert_eq!(
            m.header("Nats-Batch-Sequence"),
            sequence.to_string(),
            "{m:?}"
        );
        assert_eq!(m.header("Nats-Batch-Commit") == "1", sequence == 3, "{m:?}");
    }
    Ok(())
}
