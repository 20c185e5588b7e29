//! Example downstream service: writes a notification for the purchaser and the supplier of
//! every `order-created` event, exactly once.
//!
//! ```text
//! DATABASE_URL=postgres://app@127.0.0.1/orders_notify NATS_URL=nats://127.0.0.1:4222 \
//!     cargo run -p outbox-consumer --example order_notifications
//! ```
//!
//! Needs the relay's stream (`OUTBOX_STREAM`, default `OUTBOX`) and a stream capturing the
//! dead-letter subject `dlq.order-notifications`.

mod service;

use anyhow::Context as _;
use outbox_consumer::{Consumer, Ordering};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let database_url = std::env::var("DATABASE_URL").context("DATABASE_URL is not set")?;
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let stream = std::env::var("OUTBOX_STREAM").unwrap_or_else(|_| "OUTBOX".into());

    let pg_config: tokio_postgres::Config = database_url.parse().context("DATABASE_URL")?;
    {
        let (client, conn) = pg_config.connect(tokio_postgres::NoTls).await?;
        let conn = tokio::spawn(conn);
        outbox_consumer::ensure_ledger(&client).await?;
        client.batch_execute(service::SCHEMA).await?;
        drop(client);
        let _ = conn.await;
    }

    let nats = async_nats::connect(&nats_url).await?;
    let jetstream = async_nats::jetstream::new(nats);
    let consumer = Consumer::builder(jetstream, pg_config, "order-notifications")
        .stream(stream)
        .subjects(["outbox.Order.>"])
        .ordering(Ordering::Strict)
        .max_deliver(5)
        .dead_letter_subject("dlq.order-notifications")
        .build()?;
    let stats = consumer.stats();
    consumer
        .run(service::NotifyOnOrderCreated, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    tracing::info!(stats = ?stats.snapshot(), "stopped");
    Ok(())
}
