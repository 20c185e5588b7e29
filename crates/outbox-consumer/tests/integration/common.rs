//! Shared set-up: servers, streams, publishing relay-format messages, polling.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _};
use outbox_consumer::{BoxError, ConsumerBuilder, Event, Handler, handler_fn};
use pgoutput::{Column, Insert, Relation, TupleData, TupleValue};
use relay_core::Lsn;
use relay_core::message::{HEADER_MSG_ID, OutboundMessage, TxContext};
use relay_core::route::{OutboxTableConfig, Router};
use relay_core::stage::Publisher as _;
use relay_nats::JetStreamPublisher;
use relay_testkit::{NatsServer, PostgresServer};
use tokio_postgres::Transaction;

pub const DB: &str = "consumer";
/// The stream the relay publishes into (and pins with `Nats-Expected-Stream`).
pub const STREAM: &str = "OUTBOX";

#[derive(Debug)]
pub struct Env {
    pub pg: PostgresServer,
    /// Kept so the server lives as long as the test.
    #[allow(dead_code)]
    pub nats: NatsServer,
    pub js: jetstream::Context,
    pub db: tokio_postgres::Client,
    /// The relay's own publisher: test events carry exactly the relay's wire headers.
    pub relay: JetStreamPublisher,
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
        let client = async_nats::connect(nats.url()).await?;
        let relay = JetStreamPublisher::with_default_limits(
            client.clone(),
            STREAM,
            Duration::from_secs(5),
            64,
        );
        let js = jetstream::new(client);
        js.create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["outbox.>".into()],
            duplicate_window: dup_window,
            ..Default::default()
        })
        .await
        .context("creating stream OUTBOX")?;
        let env = Self {
            pg,
            nats,
            js,
            db,
            relay,
        };
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

    /// Publishes one event exactly as the relay does: routed by relay-core's router (default
    /// mapping) and sent by relay-nats' publisher, so every header the relay sets is on the
    /// wire, `Nats-Expected-Stream` included. `id: None` publishes the same headers without
    /// `Nats-Msg-Id` (something the relay never sends: a foreign or damaged message).
    /// Returns (stream sequence, duplicate flag).
    pub async fn publish(
        &self,
        id: Option<&str>,
        subject: &str,
        payload: &str,
    ) -> anyhow::Result<(u64, bool)> {
        self.publish_with(id, subject, payload, &[]).await
    }

    /// [`Self::publish`] with `extra` headers after the relay's own (as the relay adds
    /// `Outbox-Schema` to an event checked against a contract).
    pub async fn publish_with(
        &self,
        id: Option<&str>,
        subject: &str,
        payload: &str,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<(u64, bool)> {
        let mut msg = relay_message(id.unwrap_or("no-id"), subject, payload)?;
        msg.headers.extend(
            extra
                .iter()
                .map(|(name, value)| ((*name).into(), (*value).into())),
        );
        if id.is_some() {
            let receipt = self
                .relay
                .send(&Arc::new(msg), None)
                .await
                .map_err(|e| anyhow!("relay publish: {e}"))?
                .await
                .map_err(|e| anyhow!("relay publish ack: {e}"))?;
            return Ok((receipt.stream_seq, receipt.duplicate));
        }
        let headers: HeaderMap = self
            .relay
            .headers(&msg)
            .iter()
            .filter(|(name, _)| name.as_ref() as &str != HEADER_MSG_ID)
            .flat_map(|(name, values)| values.iter().map(move |v| (name.clone(), v.clone())))
            .collect();
        let ack = self
            .js
            .publish_with_headers(msg.subject, headers, msg.payload)
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

/// The message the relay publishes for one row of a Debezium-shaped `public.outbox` table,
/// built by relay-core's router with the default mapping. `subject` must have the default
/// template's shape, `outbox.<aggregatetype>.<type>`.
pub fn relay_message(id: &str, subject: &str, payload: &str) -> anyhow::Result<OutboundMessage> {
    // 2026-11-29T11:38:44.123456Z, in µs since 2000-01-01.
    let commit_time = (1_795_952_324 - 946_684_800) * 1_000_000 + 123_456;
    relay_message_at(id, subject, payload, Lsn(0x16B3748), commit_time)
}

/// [`relay_message`] of a transaction committed at `commit_lsn`, `commit_time` (µs since
/// 2000-01-01 UTC).
pub fn relay_message_at(
    id: &str,
    subject: &str,
    payload: &str,
    commit_lsn: Lsn,
    commit_time: i64,
) -> anyhow::Result<OutboundMessage> {
    const RELATION: u32 = 16384;
    let Some(("outbox", aggregate_type, event_type)) = subject
        .split_once('.')
        .and_then(|(p, rest)| rest.split_once('.').map(|(a, t)| (p, a, t)))
    else {
        bail!("subject {subject:?} is not outbox.<aggregatetype>.<type>");
    };
    let column = |name: &str, type_oid: u32| Column {
        flags: 0,
        name: name.into(),
        type_oid,
        type_modifier: -1,
    };
    let text = |v: &str| TupleValue::Text(Bytes::copy_from_slice(v.as_bytes()));
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")])?;
    router.on_relation(
        Relation {
            id: RELATION,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                column("id", 25),
                column("aggregatetype", 1043),
                column("aggregateid", 1043),
                column("type", 1043),
                column("payload", 3802),
                column("tracingspancontext", 1043),
            ],
        },
        None,
    )?;
    let insert = Insert {
        relation_id: RELATION,
        new: TupleData {
            values: vec![
                text(id),
                text(aggregate_type),
                text("7"),
                text(event_type),
                text(payload),
                TupleValue::Null,
            ],
        },
    };
    let tx = TxContext::new(771, commit_lsn, commit_time);
    router
        .route_insert(&insert, &tx, 0)?
        .context("the router skipped an outbox row")
}

/// Reads every message of stream `DLQ` (up to `n + 1`, so an extra copy shows).
pub async fn dead_letters(env: &Env, n: usize) -> anyhow::Result<Vec<async_nats::Message>> {
    let stream = env.js.get_stream("DLQ").await?;
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config::default())
        .await?;
    let mut batch = consumer
        .fetch()
        .max_messages(n + 1)
        .expires(Duration::from_millis(500))
        .messages()
        .await?;
    let mut out = Vec::new();
    while let Some(m) = batch.next().await {
        out.push(m.map_err(|e| anyhow!(e))?.message);
    }
    Ok(out)
}

/// The first value of header `name` of `m`.
pub fn header<'a>(m: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
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
