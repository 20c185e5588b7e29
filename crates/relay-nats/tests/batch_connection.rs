//! Which connection a message takes in the batch modes, read off the server's own connection
//! list (`/connz`): what a batch does not take goes out between the batches, so on the batches'
//! connection (the server orders nothing across two connections): async-nats' for atomic
//! batches, the lean one for fast batches; re-sends take the lean one. Deterministic where the
//! e2e fast_batch test saw the reorder only under load.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::Publisher as _;
use relay_nats::{JetStreamPublisher, NatsSettings, PublishMode};
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

/// Messages the lean and the async-nats connection have published so far, from the
/// monitoring endpoint.
async fn published_by(monitor: u16) -> Result<(u64, u64)> {
    let (connz, body) = connz(monitor).await?;
    let count = |name: &str| -> Result<u64> {
        let conns = connz["connections"].as_array().context("no connections")?;
        let mine: Vec<_> = conns.iter().filter(|c| c["name"] == name).collect();
        // The lean connection is made on first use: none yet is none published.
        ensure!(mine.len() <= 1, "one connection named {name:?}: {body}");
        mine.first()
            .map_or(Ok(0), |c| c["in_msgs"].as_u64().context("in_msgs"))
    };
    Ok((count(LEAN_NAME)?, count(NATS_NAME)?))
}

/// A publisher in `mode` made as the relay makes it (`outbox-relay` broker.rs), and the
/// server's monitoring port.
async fn publisher(server: &NatsServer, mode: PublishMode) -> Result<JetStreamPublisher> {
    let settings = NatsSettings {
        url: server.url(),
        stream: STREAM.into(),
        create_stream: true,
        stream_subjects: vec!["outbox.>".into()],
        publish_mode: mode,
        ..Default::default()
    };
    let connection = relay_nats::connect(&settings).await?;
    let publisher = JetStreamPublisher::new(&connection, STREAM, Duration::from_secs(5), 64);
    ensure!(publisher.publishes_lean(), "the lean path is on");
    let report = relay_nats::prepare_stream(publisher.jetstream(), &settings, &[], &[]).await?;
    Ok(publisher.with_publish_mode(mode, report.allows(mode), 64))
}

#[tokio::test]
async fn in_batch_modes_batches_and_messages_alone_share_one_connection_and_resends_take_the_lean_one()
-> Result<()> {
    let monitor = free_port();
    let server = NatsServer::start_with(NatsOptions {
        config: Some(format!("http: \"127.0.0.1:{monitor}\"\n")),
        ..Default::default()
    })
    .await?;
    for mode in [PublishMode::AtomicBatch, PublishMode::FastBatch] {
        let publisher = publisher(&server, mode).await?;
        let before = published_by(monitor).await?;
        // A one-message transaction (never batched), then a two-message one (a batch where
        // the server takes the mode); each is stored before its acks resolve.
        for (lsn, ids) in [(0x10, vec!["alone"]), (0x20, vec!["b1", "b2"])] {
            publisher.begin_transaction(Lsn(lsn));
            let mut acks = Vec::new();
            for id in ids {
                acks.push(
                    publisher
                        .send(&event(&format!("{mode:?}-{id}"), lsn))
                        .await?,
                );
            }
            publisher.end_transaction();
            for ack in acks {
                ack.await?;
            }
        }
        let after = published_by(monitor).await?;
        let (lean, nats) = (after.0 - before.0, after.1 - before.1);
        // Atomic batches with message ids from 2.12.1, fast batches from 2.14.0.
        let server_takes = match mode {
            PublishMode::AtomicBatch => server.version_at_least((2, 12, 1)),
            _ => server.version_at_least((2, 14, 0)),
        };
        let framing = publisher.batches() || publisher.fast_batches();
        ensure!(
            framing == server_takes,
            "{mode:?} in effect: {framing}, on nats-server {}",
            server.version()
        );
        let counts = format!("{mode:?}: lean {lean}, async-nats {nats} messages");
        match (mode, server_takes) {
            // Atomic batches and what they do not take: async-nats' connection only.
            (PublishMode::AtomicBatch, true) => ensure!(lean == 0 && nats >= 3, "{counts}"),
            // Fast batches and what they do not take: the lean connection (three messages and
            // the batch's commit); on async-nats' only the message that confirms the batch's
            // answer subscription at the server before the batch begins.
            (_, true) => ensure!(lean == 4 && nats == 1, "{counts}"),
            // Without the mode the publisher publishes per message: the lean path.
            (_, false) => ensure!(lean == 3 && nats == 0, "{counts}"),
        }
        // A re-send is out of order by nature: the lean path.
        let resend = publisher
            .resend(&event(&format!("{mode:?}-alone"), 0x10))
            .await?;
        let receipt = resend.await?;
        ensure!(
            receipt.duplicate,
            "{mode:?}: the re-send is dropped by its id"
        );
        let resent = published_by(monitor).await?;
        ensure!(
            resent.0 == after.0 + 1,
            "{mode:?}: the re-send went on the lean connection: {after:?} -> {resent:?}"
        );
        drop(publisher);
        // The next mode's publisher: a fresh stream, and its own connections, once this one's
        // are gone (its tasks hold the clients until they end).
        let client = async_nats::connect(server.url()).await?;
        async_nats::jetstream::new(client)
            .delete_stream(STREAM)
            .await?;
        connections_closed(monitor).await?;
    }
    Ok(())
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
