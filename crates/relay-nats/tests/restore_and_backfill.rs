//! The publishers and stream reads `restore` and `backfill` build on, against a real
//! nats-server: a duplicate of a purged copy is reported as not restored (never counted as
//! restored), and the event ids the stream holds for a table are read back.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use bytes::Bytes;
use relay_core::Lsn;
use relay_core::id_digest::id_digest;
use relay_core::message::{HEADER_TABLE, OutboundMessage};
use relay_core::stage::Publisher as _;
use relay_nats::{
    JetStreamPublisher, NatsSettings, PublishMode, RestoreCheck, StreamIds, StreamTakes, stream_ids,
};
use relay_testkit::NatsServer;

const STREAM: &str = "OUTBOX";

fn event(id: &str, table: &str) -> Arc<OutboundMessage> {
    Arc::new(OutboundMessage {
        subject: "outbox.x".into(),
        event_id: id.into(),
        headers: vec![(HEADER_TABLE.into(), table.into())],
        shared_headers: 0,
        payload: Bytes::from_static(b"{}"),
        table: table.into(),
        commit_lsn: Lsn(0x10),
        commit_time_micros: 0,
    })
}

async fn publisher(server: &NatsServer) -> Result<JetStreamPublisher> {
    let settings = NatsSettings {
        url: server.url(),
        stream: STREAM.into(),
        create_stream: true,
        stream_subjects: vec!["outbox.>".into()],
        ..Default::default()
    };
    let connection = relay_nats::connect(&settings).await?;
    let publisher = JetStreamPublisher::new(&connection, STREAM, Duration::from_secs(5), 64);
    relay_nats::prepare_stream(publisher.jetstream(), &settings, &[], &[]).await?;
    Ok(publisher.with_publish_mode(PublishMode::PerMessage, StreamTakes::BATCHES, 64))
}

#[tokio::test]
async fn a_duplicate_of_a_purged_copy_is_reported_not_restored() -> Result<()> {
    let server = NatsServer::start().await?;
    let plain = publisher(&server).await?;
    let (restoring, check) = RestoreCheck::attach(plain.clone(), STREAM.into());

    // Stored, then purged: the server still remembers the id for its duplicate window.
    plain
        .send(&event("gone", "public.outbox"), None)
        .await?
        .await?;
    let context = plain.jetstream().context();
    context.get_stream(STREAM).await?.purge().await?;
    let receipt = restoring
        .send(&event("gone", "public.outbox"), None)
        .await?
        .await?;
    ensure!(
        receipt.duplicate,
        "the precondition: JetStream dropped the re-send"
    );

    // Stored and still held: a duplicate that is restored.
    restoring
        .send(&event("kept", "public.outbox"), None)
        .await?
        .await?;
    let again = restoring
        .resend(&event("kept", "public.outbox"), None)
        .await?
        .await?;
    ensure!(again.duplicate, "the second copy of `kept` is a duplicate");

    let not_stored = check.clone().take_not_stored();
    ensure!(
        not_stored == ["gone"],
        "only the purged event is not restored: {not_stored:?}"
    );
    ensure!(check.take_not_stored().is_empty(), "taken once");
    Ok(())
}

#[tokio::test]
async fn the_event_ids_of_a_table_are_read_from_the_stream_up_to_a_limit() -> Result<()> {
    let server = NatsServer::start().await?;
    let publisher = publisher(&server).await?;
    for (id, table) in [
        ("a1", "public.outbox"),
        ("a2", "public.outbox"),
        ("b1", "shop.outbox"),
    ] {
        publisher.send(&event(id, table), None).await?.await?;
    }
    let read = stream_ids(publisher.jetstream(), STREAM, "public.outbox", 10).await?;
    let StreamIds::Read(ids) = read else {
        anyhow::bail!("three messages are within a limit of ten: {read:?}");
    };
    ensure!(
        ids.len() == 2,
        "the other table's event is left out: {ids:?}"
    );
    ensure!(ids.contains(&id_digest("a1")) && ids.contains(&id_digest("a2")));

    let over = stream_ids(publisher.jetstream(), STREAM, "public.outbox", 2).await?;
    ensure!(
        matches!(over, StreamIds::TooLarge(3)),
        "three messages are over a limit of two: {over:?}"
    );
    Ok(())
}
