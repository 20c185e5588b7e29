//! Which connection a message takes, read off the server's own connection list (`/connz`): in
//! every publish mode, every message (batched, published alone between batches, re-sent), every
//! batch commit and every answer go on one connection, so the server stores them in the order
//! the pipeline handed them over (it orders nothing across two connections). That connection
//! is the lean one, or async-nats' with `publish_path = "async-nats"`; async-nats' connection
//! otherwise only manages (the stream check, the duplicate check). Deterministic where the e2e
//! fast_batch test saw a reorder across two connections only under load.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::Publisher as _;
use relay_nats::{JetStreamPublisher, NatsSettings, PublishMode, PublishPath, StreamTakes};
use relay_testkit::{NatsOptions, NatsServer, free_port};

const STREAM: &str = "OUTBOX";
/// The lean connection's `CONNECT` name (`wire::connect`); async-nats' is "outbox-relay".
const LEAN_NAME: &str = "outbox-relay (lean publish)";
const NATS_NAME: &str = "outbox-relay";

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

/// Messages the lean and the async-nats connection have published and received so far, from
/// the monitoring endpoint.
async fn published_by(monitor: u16) -> Result<(Counts, Counts)> {
    let (connz, body) = connz(monitor).await?;
    let count = |name: &str| -> Result<Counts> {
        let conns = connz["connections"].as_array().context("no connections")?;
        let mine: Vec<_> = conns.iter().filter(|c| c["name"] == name).collect();
        // The lean connection is made on first use: none yet is none published.
        ensure!(mine.len() <= 1, "one connection named {name:?}: {body}");
        let Some(conn) = mine.first() else {
            return Ok(Counts::default());
        };
        Ok(Counts {
            published: conn["in_msgs"].as_u64().context("in_msgs")?,
            answers: conn["out_msgs"].as_u64().context("out_msgs")?,
        })
    };
    Ok((count(LEAN_NAME)?, count(NATS_NAME)?))
}

/// What one connection sent to the server (`in_msgs`) and received from it (`out_msgs`).
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    published: u64,
    answers: u64,
}

impl std::ops::Sub for Counts {
    type Output = Self;
    fn sub(self, before: Self) -> Self {
        Self {
            published: self.published - before.published,
            answers: self.answers - before.answers,
        }
    }
}

/// A publisher in `mode` on `path` made as the relay makes it (`relay-runtime::broker`).
async fn publisher(
    server: &NatsServer,
    mode: PublishMode,
    path: PublishPath,
) -> Result<JetStreamPublisher> {
    let settings = NatsSettings {
        url: server.url(),
        stream: STREAM.into(),
        create_stream: true,
        stream_subjects: vec!["outbox.>".into()],
        publish_mode: mode,
        publish_path: path,
        ..Default::default()
    };
    let connection = relay_nats::connect(&settings).await?;
    let publisher = JetStreamPublisher::new(&connection, STREAM, Duration::from_secs(5), 64);
    ensure!(
        publisher.publishes_lean() == (path == PublishPath::Lean),
        "{path:?}: the lean path is on: {}",
        publisher.publishes_lean()
    );
    let report = relay_nats::prepare_stream(publisher.jetstream(), &settings, &[], &[]).await?;
    Ok(publisher.with_publish_mode(mode, StreamTakes::from(&report), 64))
}

#[tokio::test]
async fn every_mode_publishes_and_reads_every_answer_on_one_connection() -> Result<()> {
    let monitor = free_port();
    let server = NatsServer::start_with(NatsOptions {
        config: Some(format!("http: \"127.0.0.1:{monitor}\"\n")),
        ..Default::default()
    })
    .await?;
    for path in [PublishPath::Lean, PublishPath::AsyncNats] {
        for mode in [
            PublishMode::PerMessage,
            PublishMode::AtomicBatch,
            PublishMode::FastBatch,
        ] {
            one_connection(&server, monitor, mode, path)
                .await
                .with_context(|| format!("{mode:?} on {path:?}"))?;
        }
    }
    Ok(())
}

/// Publishes a one-message transaction, a two-message one and a re-send in `mode` on `path`,
/// and checks that they, their commits and their answers all went on one connection.
async fn one_connection(
    server: &NatsServer,
    monitor: u16,
    mode: PublishMode,
    path: PublishPath,
) -> Result<()> {
    let publisher = publisher(server, mode, path).await?;
    let before = published_by(monitor).await?;
    // A one-message transaction (never batched), then a two-message one (a batch where the
    // server takes the mode); each is stored before its acks resolve.
    for (lsn, ids) in [(0x10, vec!["alone"]), (0x20, vec!["b1", "b2"])] {
        publisher.begin_transaction(Lsn(lsn));
        let mut acks = Vec::new();
        for id in ids {
            acks.push(
                publisher
                    .send(&event(&format!("{mode:?}-{path:?}-{id}"), lsn), None)
                    .await?,
            );
        }
        publisher.end_transaction();
        for ack in acks {
            ack.await?;
        }
    }
    // Atomic batches with message ids from 2.12.1, fast batches from 2.14.0.
    let server_takes = match mode {
        PublishMode::PerMessage => false,
        PublishMode::AtomicBatch => server.version_at_least((2, 12, 1)),
        PublishMode::FastBatch => server.version_at_least((2, 14, 0)),
    };
    let framing = publisher.framing().atomic_batches() || publisher.framing().fast_batches();
    ensure!(
        framing == server_takes,
        "batching in effect: {framing}, on nats-server {}",
        server.version()
    );
    let sent = published_by(monitor).await?;
    let (lean, nats) = (sent.0 - before.0, sent.1 - before.1);
    let counts = format!("lean {lean:?}, async-nats {nats:?}");
    let (publishing, managing) = match path {
        PublishPath::Lean => (lean, nats),
        PublishPath::AsyncNats => (nats, lean),
    };
    // Three messages; a fast batch adds its commit.
    let messages = match (mode, server_takes) {
        (PublishMode::FastBatch, true) => 4,
        _ => 3,
    };
    ensure!(publishing.published == messages, "{counts}");
    // A PubAck per message published alone; an atomic batch's commit one; a fast batch its flow
    // ack(s) and its PubAck.
    ensure!(publishing.answers >= 2, "the answers came on it: {counts}");
    ensure!(
        managing.published == 0 && managing.answers == 0,
        "nothing published or answered on the other connection: {counts}"
    );
    eprintln!(
        "{mode:?} on {path:?}, nats-server {}: {counts}",
        server.version()
    );
    // A re-send is out of order by nature, but goes on the same connection too (its duplicate
    // check reads the stored copy through async-nats: management).
    let resend = publisher
        .resend(&event(&format!("{mode:?}-{path:?}-alone"), 0x10), None)
        .await?;
    ensure!(resend.await?.duplicate, "the re-send is dropped by its id");
    let resent = published_by(monitor).await?;
    let publishing_after = match path {
        PublishPath::Lean => resent.0 - sent.0,
        PublishPath::AsyncNats => resent.1 - sent.1,
    };
    ensure!(
        publishing_after.published >= 1 && publishing_after.answers >= 1,
        "the re-send went on the publishing connection: {sent:?} -> {resent:?}"
    );
    if path == PublishPath::Lean {
        ensure!(
            publishing_after.published == 1,
            "one re-send on the lean connection: {sent:?} -> {resent:?}"
        );
    }
    drop(publisher);
    // The next publisher: a fresh stream, and its own connections, once this one's are gone
    // (its tasks hold the clients until they end).
    let client = async_nats::connect(server.url()).await?;
    async_nats::jetstream::new(client)
        .delete_stream(STREAM)
        .await?;
    connections_closed(monitor).await
}

/// The server's connection list, parsed and as text (for failure messages).
async fn connz(monitor: u16) -> Result<(serde_json::Value, String)> {
    let body = reqwest::get(format!("http://127.0.0.1:{monitor}/connz"))
        .await
        .context("GET /connz")?
        .text()
        .await?;
    let connz = serde_json::from_str(&body).context("parsing /connz")?;
    Ok((connz, body))
}

/// Waits until the server has no client connection left.
async fn connections_closed(monitor: u16) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (connz, body) = connz(monitor).await?;
        if connz["num_connections"].as_u64() == Some(0) {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "connections still open after 10 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Commit order: a transaction whose first event names a predecessor that is not the stream's
/// last message (here another writer stored one after it, as a lost predecessor would leave the
/// stream behind) is refused out of turn with nothing of it stored; per message (and a message
/// on its own in the batch modes) by `Nats-Expected-Last-Msg-Id`, in an atomic or a fast batch
/// by `Nats-Expected-Last-Sequence` on its first message, from the batch before it.
#[tokio::test]
async fn a_transaction_after_a_predecessor_that_is_not_the_streams_last_is_refused_unstored()
-> Result<()> {
    let server = NatsServer::start().await?;
    let jetstream = async_nats::jetstream::new(async_nats::connect(server.url()).await?);
    for mode in [
        PublishMode::PerMessage,
        PublishMode::AtomicBatch,
        PublishMode::FastBatch,
    ] {
        for path in [PublishPath::Lean, PublishPath::AsyncNats] {
            refused_out_of_turn(&server, &jetstream, mode, path)
                .await
                .with_context(|| format!("{mode:?} on {path:?}"))?;
            jetstream.delete_stream(STREAM).await?;
        }
    }
    Ok(())
}

async fn refused_out_of_turn(
    server: &NatsServer,
    jetstream: &async_nats::jetstream::Context,
    mode: PublishMode,
    path: PublishPath,
) -> Result<()> {
    let publisher = publisher(server, mode, path).await?;
    let id = |name: &str| format!("{mode:?}-{path:?}-{name}");
    // A two-event transaction, stored: a batch where the server takes the mode.
    publisher.begin_transaction(Lsn(0x10));
    let first = publisher.send(&event(&id("a1"), 0x10), None).await?;
    let second = publisher
        .send(&event(&id("a2"), 0x10), Some(&id("a1")))
        .await?;
    publisher.end_transaction();
    let stored = second.await?.stream_seq;
    first.await?;
    let mut stream = jetstream.get_stream(STREAM).await?;
    if publisher.framing().atomic_batches() {
        // The second batch below names where the first ends: the commit's sequence.
        ensure!(stored == 2, "the first batch ends at sequence {stored}");
    }
    // Another writer's message lands after it.
    jetstream
        .publish("outbox.foreign", Bytes::from_static(b"{}"))
        .await?
        .await?;
    // The next transaction's first event names a2 as its unsettled predecessor: the condition
    // on its first message (a batch's by sequence) is refused, and nothing of it is stored.
    publisher.begin_transaction(Lsn(0x20));
    let b1 = publisher
        .send(&event(&id("b1"), 0x20), Some(&id("a2")))
        .await?;
    let b2 = publisher
        .send(&event(&id("b2"), 0x20), Some(&id("b1")))
        .await?;
    publisher.end_transaction();
    match b1.await {
        Err(e) if e.kind == relay_core::stage::PublishErrorKind::OutOfTurn => {}
        other => anyhow::bail!("b1: out of turn expected, got {other:?}"),
    }
    // A fast batch that ends at its first message may leave the second's outcome unknown:
    // either way it is not stored (checked below) and the pipeline re-sends it.
    match b2.await {
        Err(e) if e.kind == relay_core::stage::PublishErrorKind::OutOfTurn => {}
        Err(e)
            if publisher.framing().fast_batches()
                && e.kind == relay_core::stage::PublishErrorKind::Unknown => {}
        other => anyhow::bail!("b2: out of turn expected, got {other:?}"),
    }
    let state = stream.info().await?.state.clone();
    ensure!(
        state.messages == 3 && state.last_sequence == 3,
        "nothing of the refused transaction stored: {state:?}"
    );
    eprintln!(
        "{mode:?} on {path:?}, nats-server {}: refused out of turn, batches {}",
        server.version(),
        publisher.framing().atomic_batches() || publisher.framing().fast_batches()
    );
    Ok(())
}
