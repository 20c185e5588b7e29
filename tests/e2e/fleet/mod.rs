//! A fleet: many pipelines (database, slot, stream) in one relay process, each isolated.

mod faults;
mod reload;
mod takeover;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use tokio_postgres::NoTls;

use crate::support::*;

/// One pipeline's database and slot, as the test sees them.
#[derive(Debug, Clone)]
pub struct PipelineDb {
    pub url: String,
    pub slot: String,
}

impl PipelineDb {
    pub async fn client(&self) -> Result<tokio_postgres::Client> {
        let (client, conn) = tokio_postgres::connect(&self.url, NoTls).await?;
        tokio::spawn(conn);
        Ok(client)
    }

    async fn lsn(&self, sql: &str) -> Result<Option<u64>> {
        let row = self.client().await?.query_opt(sql, &[&self.slot]).await?;
        Ok(row
            .and_then(|r| r.get::<_, Option<i64>>(0))
            .map(|v| v as u64))
    }

    /// The stored checkpoint of the slot.
    pub async fn checkpoint(&self) -> Result<Option<u64>> {
        self.lsn("SELECT (confirmed_lsn - '0/0')::bigint FROM outbox_relay.checkpoint WHERE slot_name = $1")
            .await
    }

    /// The slot's confirmed position.
    pub async fn slot_confirmed(&self) -> Result<Option<u64>> {
        self.lsn("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1")
            .await
    }

    /// Whether the slot still exists.
    pub async fn slot_exists(&self) -> Result<bool> {
        Ok(self
            .client()
            .await?
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await?
            .is_some())
    }
}

/// What a writer committed: event ids in commit order (one transaction each), and the WAL
/// position right after each commit.
#[derive(Debug, Default, Clone)]
pub struct Written {
    pub ids: Vec<String>,
    pub after: Vec<u64>,
}

/// Inserts one event per transaction into a pipeline's outbox every `every`, until stopped;
/// paused while `paused` is set (a server the test stops gets no writes, so every write the
/// writer counts was acknowledged as committed).
pub struct Writer {
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Written>>,
}

impl Writer {
    pub fn start(db: &PipelineDb, aggregate: &'static str, every: Duration) -> Self {
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let db = db.clone();
        let (p, s) = (paused.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut written = Written::default();
            let mut client = None;
            while !s.load(Ordering::Relaxed) {
                tokio::time::sleep(every).await;
                if p.load(Ordering::Relaxed) {
                    client = None;
                    continue;
                }
                if client.is_none() {
                    client = Some(db.client().await?);
                }
                let c = client.as_ref().context("client")?;
                let id = insert_event(c, aggregate, "Happened", "{}").await?;
                let after: i64 = c
                    .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
                    .await?
                    .get(0);
                written.ids.push(id);
                written.after.push(after as u64);
            }
            Ok(written)
        });
        Self { paused, stop, task }
    }

    pub fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    pub async fn stop(self) -> Result<Written> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// The ids of stream `stream`'s messages whose subject starts with `prefix`, in stream order.
pub async fn ids_in_stream(
    js: &async_nats::jetstream::Context,
    stream: &str,
    prefix: &str,
) -> Result<Vec<String>> {
    Ok(read_stream_named(js, stream)
        .await?
        .into_iter()
        .filter(|m| m.subject.starts_with(prefix))
        .map(|m| m.id().to_owned())
        .collect())
}

/// How many of stream `stream`'s messages have a subject starting with `prefix`.
pub async fn count_in_stream(
    js: &async_nats::jetstream::Context,
    stream: &str,
    prefix: &str,
) -> Result<usize> {
    Ok(ids_in_stream(js, stream, prefix).await?.len())
}

/// Waits until every id of `written` is in the stream under `prefix`, then asserts each is
/// there once, in commit order, and nothing else is.
pub async fn assert_delivered_once_in_order(
    js: &async_nats::jetstream::Context,
    stream: &str,
    prefix: &str,
    written: &[String],
    relay: &Relay,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let ids = loop {
        let ids = ids_in_stream(js, stream, prefix).await?;
        let have: std::collections::HashSet<&String> = ids.iter().collect();
        if written.iter().all(|id| have.contains(id)) {
            break ids;
        }
        if Instant::now() > deadline {
            let missing = written.iter().filter(|id| !have.contains(id)).count();
            bail!(
                "{missing} of {} events of {prefix} never reached {stream}; log:\n{}",
                written.len(),
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    ensure!(
        ids == written,
        "{prefix} in {stream}: {} messages for {} events; once each and in commit order expected",
        ids.len(),
        written.len()
    );
    Ok(())
}

/// A metric of one pipeline (`name{pipeline="<pipeline>"}`), `None` while missing.
pub async fn pipeline_metric(addr: &str, name: &str, pipeline: &str) -> Option<f64> {
    scrape(addr)
        .await
        .ok()?
        .get(&format!("{name}{{pipeline=\"{pipeline}\"}}"))
        .copied()
}

/// Waits until the pipeline's metric satisfies `cond`.
pub async fn wait_pipeline_metric(
    addr: &str,
    name: &str,
    pipeline: &str,
    within: Duration,
    cond: impl Fn(f64) -> bool,
    relay: &Relay,
) -> Result<f64> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = pipeline_metric(addr, name, pipeline).await
            && cond(v)
        {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!(
                "{name}{{pipeline=\"{pipeline}\"}} is {:?} after {within:?}; log:\n{}",
                pipeline_metric(addr, name, pipeline).await,
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `[http]` document at `path`, as JSON.
pub async fn get_json(addr: &str, path: &str) -> Result<serde_json::Value> {
    let body = http_get(addr, path).await?.1;
    serde_json::from_str(&body).with_context(|| format!("{path}: {body}"))
}

/// A pipeline entry of the fleet's `/status`.
pub async fn pipeline_status(addr: &str, name: &str) -> Result<serde_json::Value> {
    let status = get_json(addr, "/status").await?;
    status["pipelines"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name).cloned())
        .with_context(|| format!("no pipeline {name} in /status: {status}"))
}

/// Migrations applied to a new database `name` of `pg`.
pub async fn database_with_outbox(pg: &relay_testkit::PostgresServer, name: &str) -> Result<()> {
    pg.create_database(name).await?;
    let client = pg.connect(name).await?;
    for sql in migrations() {
        client.batch_execute(&sql).await?;
    }
    Ok(())
}
