//! Commit-order conditions on a replicated stream (three nats-servers, R3), made as the relay
//! makes its publisher (`relay-runtime::broker`: `with_publish_mode` with what the stream takes).
//!
//! On nats-server 2.14 and later a refused `Nats-Expected-Last-Msg-Id` on a replicated stream
//! fails the stream on every replica ("last msgid mismatch": no leader, again at every
//! restart), so there every condition must name a sequence. Here another writer's message
//! lands between two events, so the second event's condition no longer holds: it must be
//! refused out of turn, stored nothing, and leave the stream working, in every publish mode,
//! on old servers and new.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PublishErrorKind, Publisher as _};
use relay_nats::{JetStreamPublisher, NatsSettings, PublishMode, StreamTakes};
use relay_testkit::NatsCluster;

const ACK_TIMEOUT: Duration = Duration::from_secs(5);

fn event(id: &str, commit_lsn: u64) -> Arc<OutboundMessage> {
    Arc::new(OutboundMessage {
        subject: "outbox.x".into(),
        event_id: id.into(),
        headers: vec![("Outbox-Tx-Index".into(), "0".into())],
        shared_headers: 0,
        payload: Bytes::from_static(b"{}"),
        table: "public.outbox".into(),
        commit_lsn: Lsn(commit_lsn),
        commit_time_micros: 0,
    })
}

#[tokio::test]
async fn a_refused_condition_never_fails_a_replicated_stream() -> Result<()> {
    let cluster = NatsCluster::start(3).await?;
    let addrs = cluster
        .urls()
        .iter()
        .map(|u| u.parse())
        .collect::<Result<Vec<async_nats::ServerAddr>, _>>()?;
    let client = async_nats::connect(addrs.as_slice()).await?;
    let js = async_nats::jetstream::new(client);
    let version = cluster.nodes()[0].version();
    for (i, mode) in [
        PublishMode::PerMessage,
        PublishMode::AtomicBatch,
        PublishMode::FastBatch,
    ]
    .into_iter()
    .enumerate()
    {
        let stream = format!("OUTBOX_{i}");
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("outbox{i}.>")],
            num_replicas: 3,
            allow_atomic_publish: mode == PublishMode::AtomicBatch,
            allow_batch_publish: mode == PublishMode::FastBatch,
            ..Default::default()
        })
        .await
        .with_context(|| format!("create R3 stream {stream}"))?;
        refused_in_turn(&cluster, &js, &stream, i, mode)
            .await
            .with_context(|| format!("{mode:?} on nats-server {version}"))?;
    }
    no_replica_failed(&cluster)
}

/// Publishes `a1`; another writer's message; `b1` naming `a1`, then the two-message
/// transaction `c1, c2` naming `b1`: both refused out of turn, nothing stored. Then re-sends
/// them as the pipeline does once everything before is stored, and checks that the stream
/// answers and holds everything in order.
async fn refused_in_turn(
    cluster: &NatsCluster,
    js: &async_nats::jetstream::Context,
    stream: &str,
    i: usize,
    mode: PublishMode,
) -> Result<()> {
    let settings = NatsSettings {
        url: cluster.url(),
        stream: stream.into(),
        stream_subjects: vec![format!("outbox{i}.>")],
        publish_mode: mode,
        ..Default::default()
    };
    let connection = relay_nats::connect(&settings).await?;
    let publisher = JetStreamPublisher::new(&connection, stream, ACK_TIMEOUT, 64);
    let report = relay_nats::prepare_stream(publisher.jetstream(), &settings, &[], &[]).await?;
    let by_sequence = report.order_by_sequence;
    ensure!(
        by_sequence
            == cluster.nodes()[0].version_at_least(relay_nats::MSG_ID_CONDITION_FAILS_REPLICAS),
        "ordered by sequence: {by_sequence}"
    );
    let publisher = publisher.with_publish_mode(mode, StreamTakes::from(&report), 64);
    if by_sequence {
        ensure!(
            !publisher.framing().fast_batches(),
            "fast batches on a sequence-ordered stream"
        );
    }
    let subject = |id: &str, lsn| {
        let mut msg = Arc::unwrap_or_clone(event(id, lsn));
        msg.subject = format!("outbox{i}.x");
        msg.event_id = format!("{stream}-{id}");
        Arc::new(msg)
    };
    let transaction = |lsn: u64, msgs: Vec<(Arc<OutboundMessage>, Option<String>)>| {
        let publisher = publisher.clone();
        async move {
            publisher.begin_transaction(Lsn(lsn));
            let mut acks = Vec::new();
            for (msg, after) in &msgs {
                acks.push(publisher.send(msg, after.as_deref()).await);
            }
            publisher.end_transaction();
            let mut outcomes = Vec::new();
            for ack in acks {
                outcomes.push(match ack {
                    Ok(ack) => ack.await,
                    Err(e) => Err(e),
                });
            }
            outcomes
        }
    };
    let (a1, b1, c1, c2) = (
        subject("a1", 0x10),
        subject("b1", 0x20),
        subject("c1", 0x30),
        subject("c2", 0x30),
    );
    let first = transaction(0x10, vec![(a1.clone(), None)]).await;
    ensure!(first[0].is_ok(), "a1: {first:?}");
    js.publish(
        format!("outbox{i}.other"),
        Bytes::from_static(b"other writer"),
    )
    .await?
    .await
    .context("the other writer's message")?;
    // b1 names a1 as its unsettled predecessor; c1 and c2 follow b1.
    let refused = transaction(0x20, vec![(b1.clone(), Some(a1.event_id.clone()))]).await;
    let refused_txn = transaction(
        0x30,
        vec![
            (c1.clone(), Some(b1.event_id.clone())),
            (c2.clone(), Some(c1.event_id.clone())),
        ],
    )
    .await;
    for outcome in refused.iter().chain(&refused_txn) {
        match outcome {
            Err(e) if e.kind == PublishErrorKind::OutOfTurn => {}
            other => anyhow::bail!("expected out of turn, got {other:?}"),
        }
    }
    // The pipeline's round: the first not stored alone, unconditional; the rest in order.
    for (msg, after) in [(&b1, None), (&c1, Some(&b1)), (&c2, Some(&c1))] {
        let ack = publisher
            .resend(msg, after.map(|m| m.event_id.as_str()))
            .await?
            .await
            .with_context(|| format!("re-send of {}", msg.event_id))?;
        ensure!(!ack.duplicate, "{} was stored before", msg.event_id);
    }
    let mut handle = tokio::time::timeout(ACK_TIMEOUT, js.get_stream(stream))
        .await
        .context("the stream answers")??;
    let info = handle.info().await?;
    ensure!(info.state.messages == 5, "stream state {:?}", info.state);
    let mut ids = Vec::new();
    for seq in 1..=5 {
        let stored = handle.get_raw_message(seq).await?;
        ids.push(
            stored
                .headers
                .get("Nats-Msg-Id")
                .map_or_else(|| "(other writer)".to_owned(), |v| v.to_string()),
        );
    }
    let expected: Vec<String> = ["a1", "", "b1", "c1", "c2"]
        .iter()
        .map(|id| {
            if id.is_empty() {
                "(other writer)".to_owned()
            } else {
                format!("{stream}-{id}")
            }
        })
        .collect();
    ensure!(ids == expected, "stored order {ids:?}");
    Ok(())
}

/// A stream that fills up under pipelined events: the event the limit refuses is refused when
/// a replica applies it, after the next one was already accepted on its condition. The next
/// one must be refused in turn, and the stream must keep its leader and take the re-sends once
/// the limit is raised.
#[tokio::test]
async fn a_full_replicated_stream_refuses_in_turn_and_keeps_working() -> Result<()> {
    let cluster = NatsCluster::start(3).await?;
    let addrs = cluster
        .urls()
        .iter()
        .map(|u| u.parse())
        .collect::<Result<Vec<async_nats::ServerAddr>, _>>()?;
    let js = async_nats::jetstream::new(async_nats::connect(addrs.as_slice()).await?);
    let version = cluster.nodes()[0].version();
    for (i, mode) in [
        PublishMode::PerMessage,
        PublishMode::AtomicBatch,
        PublishMode::FastBatch,
    ]
    .into_iter()
    .enumerate()
    {
        let stream = format!("FULL_{i}");
        let config = async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("full{i}.>")],
            num_replicas: 3,
            max_messages: 2,
            discard: async_nats::jetstream::stream::DiscardPolicy::New,
            allow_atomic_publish: mode == PublishMode::AtomicBatch,
            allow_batch_publish: mode == PublishMode::FastBatch,
            ..Default::default()
        };
        js.create_stream(config.clone())
            .await
            .with_context(|| format!("create R3 stream {stream}"))?;
        full_in_turn(&cluster, &js, config, mode)
            .await
            .with_context(|| format!("{mode:?} on nats-server {version}"))?;
    }
    no_replica_failed(&cluster)
}

fn no_replica_failed(cluster: &NatsCluster) -> Result<()> {
    for node in cluster.nodes() {
        let log = node.log();
        ensure!(
            !log.contains("critical write error"),
            "a replica failed the stream:\n{}",
            log.lines()
                .filter(|l| l.contains("[ERR]") || l.contains("[WRN]"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}

async fn full_in_turn(
    cluster: &NatsCluster,
    js: &async_nats::jetstream::Context,
    mut config: async_nats::jetstream::stream::Config,
    mode: PublishMode,
) -> Result<()> {
    let stream = config.name.clone();
    let prefix = config.subjects[0].trim_end_matches(".>").to_owned();
    let settings = NatsSettings {
        url: cluster.url(),
        stream: stream.clone(),
        stream_subjects: config.subjects.clone(),
        publish_mode: mode,
        ..Default::default()
    };
    let connection = relay_nats::connect(&settings).await?;
    let publisher = JetStreamPublisher::new(&connection, &stream, ACK_TIMEOUT, 64);
    let report = relay_nats::prepare_stream(publisher.jetstream(), &settings, &[], &[]).await?;
    let publisher = publisher.with_publish_mode(mode, StreamTakes::from(&report), 64);
    let msg = |id: &str, lsn: u64| {
        let mut msg = Arc::unwrap_or_clone(event(id, lsn));
        msg.subject = format!("{prefix}.x");
        msg.event_id = format!("{stream}-{id}");
        Arc::new(msg)
    };
    let ids = ["a1", "b1", "c1", "d1", "e1"];
    let msgs: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| msg(id, 0x10 * (n as u64 + 1)))
        .collect();
    // a1 stored first; then b1..e1 pipelined, each one-message transaction naming the one
    // before it while that one is unsettled.
    let a1 = publisher.send(&msgs[0], None).await?.await;
    ensure!(a1.is_ok(), "a1: {a1:?}");
    let mut acks = Vec::new();
    for n in 1..msgs.len() {
        publisher.begin_transaction(msgs[n].commit_lsn);
        let after = (n > 1).then(|| msgs[n - 1].event_id.as_str());
        acks.push(publisher.send(&msgs[n], after).await);
        publisher.end_transaction();
    }
    let mut outcomes = Vec::new();
    for ack in acks {
        outcomes.push(match ack {
            Ok(ack) => ack.await.map(|r| r.stream_seq),
            Err(e) => Err(e),
        });
    }
    ensure!(outcomes[0].is_ok(), "b1 fits: {outcomes:?}");
    ensure!(
        outcomes[1..]
            .iter()
            .all(|o| o.as_ref().is_err_and(|e| matches!(
                e.kind,
                PublishErrorKind::StreamFull | PublishErrorKind::OutOfTurn
            ))),
        "c1.. refused for room or in turn: {outcomes:?}"
    );
    let mut handle = tokio::time::timeout(ACK_TIMEOUT, js.get_stream(&stream))
        .await
        .context("the full stream answers")??;
    let state = tokio::time::timeout(ACK_TIMEOUT, handle.info())
        .await
        .context("the full stream answers its info")??
        .state
        .clone();
    ensure!(state.messages == 2, "full at 2: {state:?}");
    config.max_messages = -1;
    js.update_stream(config).await.context("raise the limit")?;
    // The pipeline's round once there is room: the first alone, the rest in order.
    for n in 2..msgs.len() {
        let after = (n > 2).then(|| msgs[n - 1].event_id.as_str());
        let ack = publisher
            .resend(&msgs[n], after)
            .await?
            .await
            .with_context(|| format!("re-send of {}", msgs[n].event_id))?;
        ensure!(!ack.duplicate, "{} was stored before", msgs[n].event_id);
    }
    let mut stored = Vec::new();
    for seq in 1..=ids.len() as u64 {
        let raw = handle.get_raw_message(seq).await?;
        stored.push(raw.headers.get("Nats-Msg-Id").map(ToString::to_string));
    }
    let expected: Vec<_> = msgs.iter().map(|m| Some(m.event_id.clone())).collect();
    ensure!(stored == expected, "stored order {stored:?}");
    Ok(())
}
