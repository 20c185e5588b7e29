//! The servers, their reset between runs, the backlog writer and shared JetStream helpers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage, stream};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use relay_testkit::{NatsServer, PgOptions, PostgresServer};
use tokio_postgres::Client;

use crate::Args;

use super::{BASE_SLOT, BROKER_WINDOW, DB, PUBLICATION, STREAM};

pub(super) struct Env {
    pub(super) pg: PostgresServer,
    pub(super) nats: NatsServer,
    pub(super) client: Client,
    pub(super) js: jetstream::Context,
    pub(super) relay_bin: PathBuf,
    pub(super) log_dir: PathBuf,
    _tmp: tempfile::TempDir,
}

pub(super) async fn start(args: &Args, relay_bin: &Path) -> Result<Env> {
    let settings = [
        ("shared_buffers", "256MB"),
        ("max_wal_size", "8GB"),
        ("checkpoint_timeout", "30min"),
        ("max_replication_slots", "20"),
        ("logical_decoding_work_mem", "64MB"),
        ("autovacuum", "off"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let bin_dir = std::env::var_os("RELAY_TEST_PG_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let p = PathBuf::from("/usr/lib/postgresql/15/bin");
            p.is_dir().then_some(p)
        });
    let (pg, nats) = tokio::try_join!(
        PostgresServer::start_with(PgOptions { settings, bin_dir }),
        NatsServer::start()
    )?;
    pg.create_database(DB).await?;
    let client = pg.connect(DB).await?;
    client
        .batch_execute(include_str!("../../../../migrations/0001_outbox.sql"))
        .await?;
    client
        .batch_execute(include_str!(
            "../../../../migrations/0002_relay_checkpoint.sql"
        ))
        .await?;
    // The polling baseline's marker and index, on the one table everybody uses.
    client
        .batch_execute(&format!(
            "ALTER TABLE outbox ADD COLUMN published_at timestamptz;
             CREATE INDEX outbox_unpublished ON outbox (created_at, id) WHERE published_at IS NULL;
             CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert');"
        ))
        .await?;
    let nc = async_nats::connect(nats.url()).await?;
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(10))
        .max_ack_inflight(BROKER_WINDOW * 2)
        .build(nc);
    let tmp = tempfile::Builder::new().prefix("relay-bench-").tempdir()?;
    let log_dir = match &args.log_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    Ok(Env {
        pg,
        nats,
        client,
        js,
        relay_bin: relay_bin.to_path_buf(),
        log_dir,
        _tmp: tmp,
    })
}

/// Empties the table, drops every slot and checkpoint and the stream; creates the base slot.
pub(super) async fn reset(env: &Env) -> Result<()> {
    let _ = env.js.delete_stream(STREAM).await;
    // One statement per call: a multi-statement query is one transaction, and a slot cannot be
    // created in a transaction that wrote.
    for sql in [
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots".to_owned(),
        "TRUNCATE outbox".to_owned(),
        "DELETE FROM outbox_relay.checkpoint".to_owned(),
        "CHECKPOINT".to_owned(),
        format!("SELECT pg_create_logical_replication_slot('{BASE_SLOT}', 'pgoutput')"),
    ] {
        env.client
            .batch_execute(&sql)
            .await
            .with_context(|| format!("resetting the bench table and slots: {sql}"))?;
    }
    Ok(())
}

/// The pid of the walsender streaming `slot`, while one does.
pub(super) async fn walsender_pid(env: &Env, slot: &str) -> Result<Option<u32>> {
    let row = env
        .client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL",
            &[&slot],
        )
        .await?;
    Ok(row.map(|r| r.get::<_, i32>(0) as u32))
}

pub(super) async fn copy_slot(env: &Env, to: &str) -> Result<()> {
    env.client
        .execute(
            "SELECT pg_copy_logical_replication_slot($1, $2)",
            &[&BASE_SLOT, &to],
        )
        .await
        .with_context(|| format!("copying slot {BASE_SLOT} to {to}"))?;
    Ok(())
}

pub(super) async fn drop_slot(env: &Env, name: &str) {
    let _ = env
        .client
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await;
}

pub(super) async fn insert_lsn(client: &impl tokio_postgres::GenericClient) -> Result<u64> {
    let row = client
        .query_one("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint", &[])
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// INSERT of rows `from..=to`, each with a ~300-byte jsonb payload stamped with the
/// row's insert time (`clock_timestamp()`, µs since the Unix epoch) in `ts`.
pub(super) fn insert_sql(from: u64, to: u64) -> String {
    insert_sql_into("outbox", "Order", from, to)
}

/// [`insert_sql`] into `table`, with `aggregate` as the aggregate type (the subject's second
/// token: `outbox.{aggregate}.OrderCreated`), so a consumer can tell one load from another.
pub(super) fn insert_sql_into(table: &str, aggregate: &str, from: u64, to: u64) -> String {
    format!(
        "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) \
         SELECT gen_random_uuid(), '{aggregate}', g::text, 'OrderCreated', {PAYLOAD_SQL} \
         FROM generate_series({from}, {to}) g"
    )
}

/// The ~300-byte jsonb payload of event `g` (a column of `generate_series(…) g`), stamped with
/// its write time in `ts`: the same for the table outbox and the emit-message outbox.
pub(super) const PAYLOAD_SQL: &str = "jsonb_build_object(\
           'ts', (extract(epoch from clock_timestamp()) * 1000000)::bigint, \
           'order_id', g, 'customer', 'customer-' || (g % 1000), 'currency', 'EUR', 'amount', 1999, \
           'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (g % 97), 'qty', 1, 'price', 1999)), \
           'note', repeat('x', 120))";

/// Writes `rows` rows in transactions of `per_tx`; returns (an LSN inside the last transaction,
/// the WAL insert position after it, seconds).
pub(super) async fn write_backlog(env: &Env, rows: u64, per_tx: u64) -> Result<(u64, u64, f64)> {
    write_backlog_with(env, rows, per_tx, insert_sql).await
}

/// [`write_backlog`] with `rows_sql(from, to)`, the statement that writes events `from..=to`
/// (an INSERT, or the emit-message outbox's `SELECT outbox_relay.emit_event(…)`).
pub(super) async fn write_backlog_with(
    env: &Env,
    rows: u64,
    per_tx: u64,
    rows_sql: impl Fn(u64, u64) -> String,
) -> Result<(u64, u64, f64)> {
    let started = Instant::now();
    let per_tx = per_tx.clamp(1, rows);
    let txs = rows.div_ceil(per_tx);
    // Many transactions per round trip: explicit BEGIN/COMMIT pairs in one simple query.
    let per_batch = (2_000 / per_tx).max(1);
    let mut next = 1_u64;
    let mut tx_done = 0_u64;
    while tx_done + 1 < txs {
        let n = per_batch.min(txs - 1 - tx_done);
        let mut sql = String::with_capacity(n as usize * 600);
        for _ in 0..n {
            let to = (next + per_tx - 1).min(rows);
            sql.push_str("BEGIN;");
            sql.push_str(&rows_sql(next, to));
            sql.push_str(";COMMIT;");
            next = to + 1;
        }
        env.client.batch_execute(&sql).await?;
        tx_done += n;
    }
    let mut client = env.pg.connect(DB).await?;
    let tx = client.transaction().await?;
    tx.batch_execute(&rows_sql(next, rows)).await?;
    let inside = insert_lsn(&tx).await?;
    tx.commit().await?;
    let end = insert_lsn(&client).await?;
    Ok((inside, end, started.elapsed().as_secs_f64()))
}

pub(super) async fn stream_messages(env: &Env, name: &str) -> Result<u64> {
    let mut s = env.js.get_stream(name).await?;
    Ok(s.info().await?.state.messages)
}

/// How many copies of each `Nats-Msg-Id` the stream holds (every message's headers, read with
/// an ordered consumer). A message without the header counts under `""`.
pub(super) async fn stream_id_copies(env: &Env, name: &str) -> Result<HashMap<String, u32>> {
    stream_header_values(env, name, outbox_contract::HEADER_MSG_ID).await
}

/// How many of the stream's messages carry each value of `header` (every message's headers,
/// read with an ordered consumer). A message without the header counts under `""`.
pub(super) async fn stream_header_values(
    env: &Env,
    name: &str,
    header: &str,
) -> Result<HashMap<String, u32>> {
    let mut stream = env.js.get_stream(name).await?;
    let state = stream.info().await?.state.clone();
    let mut counts = HashMap::new();
    if state.messages == 0 {
        return Ok(counts);
    }
    let reader = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            headers_only: true,
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow!("reading stream {name}: {e}"))?;
    let mut messages = reader
        .messages()
        .await
        .map_err(|e| anyhow!("reading stream {name}: {e}"))?;
    while let Some(msg) = tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .with_context(|| format!("reading stream {name}: nothing for 10 s"))?
    {
        let msg = msg.map_err(|e| anyhow!("reading stream {name}: {e}"))?;
        let value = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(header))
            .map_or("", |v| v.as_str());
        *counts.entry(value.to_owned()).or_default() += 1;
        let seq = msg.info().map_err(|e| anyhow!("{e}"))?.stream_sequence;
        if seq >= state.last_sequence {
            break;
        }
    }
    Ok(counts)
}

pub(super) async fn create_stream(env: &Env, name: &str, subjects: &str) -> Result<()> {
    let _ = env.js.delete_stream(name).await;
    env.js
        .create_stream(stream::Config {
            name: name.into(),
            subjects: vec![subjects.into()],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow!("creating stream {name}: {e}"))?;
    Ok(())
}

pub(super) fn headers(id: &str, aggregate_id: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("Nats-Msg-Id", id);
    h.insert("Nats-Expected-Stream", STREAM);
    h.insert("Outbox-Aggregate-Type", "Order");
    h.insert("Outbox-Aggregate-Id", aggregate_id);
    h.insert("Outbox-Event-Type", "OrderCreated");
    h
}

/// Publishes messages `0..count` (`message(i)`: subject and message) with at most `window` acks
/// outstanding; every ack must be positive.
pub(super) async fn publish_pipelined<S: async_nats::subject::ToSubject>(
    js: &jetstream::Context,
    count: u64,
    window: usize,
    mut message: impl FnMut(u64) -> (S, PublishMessage),
) -> Result<()> {
    type Ack = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>;
    let mut acks = FuturesUnordered::new();
    for i in 0..count {
        if acks.len() >= window
            && let Some(r) = acks.next().await
        {
            let r: Ack = r;
            r.map_err(|e| anyhow!("JetStream ack: {e}"))?;
        }
        let (subject, msg) = message(i);
        let ack = js
            .send_publish(subject, msg)
            .await
            .map_err(|e| anyhow!("JetStream publish: {e}"))?;
        acks.push(ack.into_future());
    }
    while let Some(r) = acks.next().await {
        let r: Ack = r;
        r.map_err(|e| anyhow!("JetStream ack: {e}"))?;
    }
    Ok(())
}
