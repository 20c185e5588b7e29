//! Shared set-up: servers, streams, publishing relay-format messages, polling.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use futures::FutureExt as _;
use outbox_consumer::{BoxError, ConsumerBuilder, Event, Handler, handler_fn};
use relay_testkit::{NatsServer, PostgresServer};
use tokio_postgres::Transaction;

pub const DB: &str = "consumer";

#[derive(Debug)]
pub struct Env {
    pub pg: PostgresServer,
    /// Kept so the server lives as long as the test.
    #[allow(dead_code)]
    pub nats: NatsServer,
    pub js: jetstream::Context,
    pub db: tokio_postgres::Client,
}

impl Env {
    /// Servers, database `consumer` with the `applied` table, stream `OUTBOX` (`outbox.>`,
    /// duplicate window `dup_window`) and stream `DLQ` (`dlq.>`).
    pub async fn start(dup_window: Duration) -> anyhow::Result<Self> {
        Self::start_with(dup_window, true).await
    }

    pub async fn start_with(dup_window: Duration, dlq_stream: bool) -> anyhow::Result<Self> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let (pg, nats) = tokio::join!(PostgresServer::start(), NatsServer::start());
        let (pg, nats) = (pg?, nats?);
        pg.create_database(DB).await?;
        let db = pg.connect(DB).await?;
        db.batch_execute(
            "CREATE TABLE applied (
                 n        bigserial PRIMARY KEY,
                 service  text NOT NULL,
                 event_id text NOT NULL,
                 delivered bigint NOT NULL
             )",
        )
        .await?;
        let js = jetstream::new(async_nats::connect(nats.url()).await?);
        js.create_stream(stream::Config {
            name: "OUTBOX".into(),
            subjects: vec!["outbox.>".into()],
            duplicate_window: dup_window,
            ..Default::default()
        })
        .await
        .context("creating stream OUTBOX")?;
        let env = Self { pg, nats, js, db };
        if dlq_stream {
            env.create_dlq_stream().await?;
        }
        Ok(env)
    }

    pub async fn create_dlq_stream(&self) -> anyhow::Result<()> {
        self.js
            .create_stream(stream::Config {
                name: "DLQ".into(),
                subjects: vec!["dlq.>".into()],
                ..Default::default()
            })
            .await
            .context("creating stream DLQ")?;
        Ok(())
    }

    pub fn pg_config(&self) -> tokio_postgres::Config {
        self.pg
            .url(DB)
            .parse()
            .unwrap_or_else(|e| panic!("bad url: {e}"))
    }

    /// A builder for `service` with test-friendly timings.
    pub fn builder(&self, service: &str) -> ConsumerBuilder {
        outbox_consumer::Consumer::builder(self.js.clone(), self.pg_config(), service)
            .stream("OUTBOX")
            .subjects(["outbox.>"])
            .ack_wait(Duration::from_secs(1))
            .backoff(Duration::from_millis(50), Duration::from_millis(200))
            .dead_letter_subject(format!("dlq.{service}"))
    }

    /// Publishes one message in the relay's format; `id: None` omits `Nats-Msg-Id`.
    /// Returns (stream sequence, duplicate flag).
    pub async fn publish(
        &self,
        id: Option<&str>,
        subject: &str,
        payload: &str,
    ) -> anyhow::Result<(u64, bool)> {
        let mut h = HeaderMap::new();
        if let Some(id) = id {
            h.insert("Nats-Msg-Id", id);
        }
        h.insert("Outbox-Commit-Lsn", "0/16B3748");
        h.insert("Outbox-Xid", "771");
        h.insert("Outbox-Commit-Time", "2026-11-29T11:38:44.123456Z");
        h.insert("Outbox-Table", "public.outbox");
        h.insert("Outbox-Tx-Index", "0");
        h.insert("Outbox-Aggregate-Type", "Order");
        h.insert("Outbox-Aggregate-Id", "7");
        h.insert(
            "Outbox-Event-Type",
            subject.rsplit('.').next().unwrap_or_default(),
        );
        let ack = self
            .js
            .publish_with_headers(subject.to_owned(), h, payload.to_owned().into())
            .await?
            .await?;
        Ok((ack.sequence, ack.duplicate))
    }

    /// `SELECT count(*)` of `sql` (a query returning one bigint).
    pub async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(self.db.query_one(sql, &[]).await?.get(0))
    }

    /// Event ids applied by `service`, in application order.
    pub async fn applied(&self, service: &str) -> anyhow::Result<Vec<String>> {
        Ok(self
            .db
            .query(
                "SELECT event_id FROM applied WHERE service = $1 ORDER BY n",
                &[&service],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// Waits until `service` has applied `n` rows (or times out).
    pub async fn wait_applied(&self, service: &str, n: usize) -> anyhow::Result<Vec<String>> {
        let mut last = Vec::new();
        for _ in 0..300 {
            last = self.applied(service).await?;
            if last.len() >= n {
                // Give a wrongly duplicated apply a moment to show up.
                tokio::time::sleep(Duration::from_millis(300)).await;
                return self.applied(service).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("{service}: {} of {n} events applied: {last:?}", last.len())
    }
}

/// Records every applied event into `applied` (in the consumer's transaction).
pub fn recording_handler(service: &'static str) -> impl Handler {
    handler_fn(move |tx, ev| record(tx, ev, service).boxed())
}

pub async fn record(tx: &Transaction<'_>, ev: &Event, service: &str) -> Result<(), BoxError> {
    let delivered = i64::try_from(ev.delivered)?;
    tx.execute(
        "INSERT INTO applied (service, event_id, delivered) VALUES ($1, $2, $3)",
        &[&service, &ev.id, &delivered],
    )
    .await?;
    Ok(())
}

/// Waits until `cond` returns true, polling every 50 ms, up to `secs` seconds.
pub async fn wait_for<F, Fut>(secs: u64, what: &str, mut cond: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    for _ in 0..secs * 20 {
        if cond().await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("timed out waiting for {what}")
}

/// A shutdown signal for `run` and its trigger.
pub fn shutdown() -> (
    Arc<tokio::sync::Notify>,
    impl Future<Output = ()> + Send + 'static,
) {
    let n = Arc::new(tokio::sync::Notify::new());
    let n2 = Arc::clone(&n);
    (n, async move { n2.notified().await })
}
