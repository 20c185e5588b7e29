//! `outbox-relay position --lsn X | --time T` on a large stream.
//!
//! The stream is filled with raw JetStream publishes shaped like the relay's messages (its
//! headers: `Nats-Msg-Id`, `Outbox-Commit-Lsn`, `Outbox-Xid`, `Outbox-Commit-Time`,
//! `Outbox-Table`, `Outbox-Tx-Index`, the default mapping's), in transactions of
//! [`TX_EVENTS`] events with increasing commit LSNs and commit time = the time of publishing (so
//! commit times track the stream's store times, as with a relay). `outbox_relay.position_map`
//! gets one anchor per `--position-anchor-every` messages, as the relay writes one per stored
//! checkpoint (each anchor: the first commit of its range and that commit's first sequence).
//!
//! `outbox-relay trace` is timed on the same stream: outbox rows for a few of its events, each
//! with its transaction's commit time as `created_at`, traced as processes (wall time), with
//! the map and with the map pruned; every answer must name the event's sequence.
//!
//! Then each lookup is timed twice: in this process (the query alone: the map's start as
//! `relay_postgres::checkpoint::map_start` reads it, then `outbox_position::locate`, the code
//! the command runs) and as the `outbox-relay position … --json` process (wall time: start-up,
//! connections, the map's summary). Every answer is checked against the sequence the fill put
//! there. First with the map, then with the map pruned to its newest row, so the lookups fall
//! back to the stream search (bisection by `Outbox-Commit-Lsn` for an LSN, the store time for a
//! time).

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, anyhow, bail};
use async_nats::HeaderMap;
use async_nats::jetstream::{message::PublishMessage, stream};
use outbox_contract as contract;
use outbox_position::{Hint, Limits, Lsn, Target};
use relay_postgres::checkpoint::{MapTarget, map_start};

use crate::Args;
use crate::measure::quantile;

use super::relay::relay_config_with;
use super::setup::{Env, publish_pipelined, reset};
use super::{BROKER_WINDOW, STREAM, say};

/// Events per synthetic transaction.
const TX_EVENTS: u64 = 10;
/// Commit LSN of the first transaction, and the distance between two.
const LSN_BASE: u64 = 0x1_0000_0000;
const LSN_STEP: u64 = 0x100;
const SLOT: &str = "relay_position";
/// In-process lookups per kind (fewer for the stream search, which reads more).
const QUERIES_MAP: usize = 20;
const QUERIES_STREAM: usize = 5;
/// `outbox-relay position` processes per kind.
const PROCESSES: usize = 3;

/// Lookups of one kind.
#[derive(Debug, Clone)]
pub struct LookupStat {
    /// E.g. "--lsn, position map".
    pub label: String,
    /// How the answers were found (`method` of `--json`) and how much they read, at most.
    pub method: String,
    pub max_scanned: u64,
    pub max_gets: u32,
    pub queries: usize,
    pub query_p50_ms: f64,
    pub query_max_ms: f64,
    pub processes: usize,
    pub process_p50_ms: f64,
    pub process_max_ms: f64,
    /// Answers (in-process or by the command) that differ from the sequence the fill put there.
    pub wrong: usize,
}

/// `outbox-relay trace` of events in the same stream, their rows' time known.
#[derive(Debug, Clone)]
pub struct TraceStat {
    pub label: String,
    pub runs: usize,
    pub p50_ms: f64,
    pub max_ms: f64,
    /// Answers that did not find the event at the sequence the fill put it.
    pub wrong: usize,
}

/// The position rows.
#[derive(Debug, Clone)]
pub struct PositionRun {
    pub messages: u64,
    pub fill_secs: f64,
    pub anchor_every: u64,
    pub anchors: u64,
    pub lookups: Vec<LookupStat>,
    pub traces: Vec<TraceStat>,
}

fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

fn from_micros(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

/// Commit LSN of transaction `k`.
fn tx_lsn(k: u64) -> Lsn {
    Lsn(LSN_BASE + k * LSN_STEP)
}

/// What the fill wrote: each transaction's commit time (µs), in transaction order.
struct Filled {
    commit_us: Vec<i64>,
}

impl Filled {
    fn txs(&self) -> u64 {
        self.commit_us.len() as u64
    }
    /// The sequence of transaction `k`'s first event.
    fn seq_of(k: u64) -> u64 {
        k * TX_EVENTS + 1
    }
    /// The first sequence committed at or after `target`.
    fn expected(&self, target: Target) -> u64 {
        let k = match target {
            Target::Lsn(x) => (x.0.saturating_sub(LSN_BASE)).div_ceil(LSN_STEP),
            Target::Time(t) => {
                let us = micros(t);
                self.commit_us.partition_point(|&c| c < us) as u64
            }
        };
        Self::seq_of(k)
    }
}

async fn fill(env: &Env, messages: u64) -> Result<(Filled, f64)> {
    let _ = env.js.delete_stream(STREAM).await;
    env.js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["outbox.>".into()],
            storage: stream::StorageType::File,
            // Short: the fill's ids are unique, and a long window would hold millions in memory.
            duplicate_window: Duration::from_secs(2),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow!("creating stream {STREAM}: {e}"))?;
    let payload = bytes::Bytes::from_static(
        br#"{"order_id":1,"customer":"customer-1","currency":"EUR","amount":1999,"note":"position fill"}"#,
    );
    let txs = messages.div_ceil(TX_EVENTS);
    let mut commit_us = Vec::with_capacity(txs as usize);
    let mut tx_headers = HeaderMap::new();
    let started = Instant::now();
    publish_pipelined(&env.js, messages, BROKER_WINDOW, |i| {
        let (k, index) = (i / TX_EVENTS, i % TX_EVENTS);
        if index == 0 {
            let us = micros(SystemTime::now());
            commit_us.push(us);
            let time = humantime::format_rfc3339_micros(from_micros(us)).to_string();
            tx_headers = HeaderMap::new();
            tx_headers.insert(contract::HEADER_EXPECTED_STREAM, STREAM);
            tx_headers.insert(contract::HEADER_COMMIT_LSN, tx_lsn(k).to_string().as_str());
            tx_headers.insert(contract::HEADER_XID, (1000 + k).to_string().as_str());
            tx_headers.insert(contract::HEADER_COMMIT_TIME, time.as_str());
            tx_headers.insert(contract::HEADER_TABLE, "public.outbox");
            tx_headers.insert(contract::HEADER_AGGREGATE_TYPE, "Order");
            tx_headers.insert(contract::HEADER_EVENT_TYPE, "OrderCreated");
        }
        let mut h = tx_headers.clone();
        h.insert(
            contract::HEADER_MSG_ID,
            format!("00000000-0000-4000-8000-{i:012x}").as_str(),
        );
        h.insert(contract::HEADER_TX_INDEX, index.to_string().as_str());
        h.insert(contract::HEADER_AGGREGATE_ID, i.to_string().as_str());
        let msg = PublishMessage::build().headers(h).payload(payload.clone());
        ("outbox.Order.OrderCreated", msg)
    })
    .await
    .context("filling the position stream")?;
    Ok((Filled { commit_us }, started.elapsed().as_secs_f64()))
}

/// One anchor per `every` messages (rounded to whole transactions).
async fn fill_map(env: &Env, filled: &Filled, every: u64) -> Result<u64> {
    env.client
        .batch_execute(relay_postgres::checkpoint::POSITION_MAP_MIGRATION)
        .await?;
    env.client
        .execute(
            "DELETE FROM outbox_relay.position_map WHERE slot_name = $1",
            &[&SLOT],
        )
        .await?;
    let step = (every / TX_EVENTS).max(1);
    let (mut lsns, mut times, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
    for k in (0..filled.txs()).step_by(step as usize) {
        lsns.push(tx_lsn(k).to_string());
        times.push(from_micros(filled.commit_us[k as usize]));
        seqs.push(Filled::seq_of(k) as i64);
    }
    env.client
        .execute(
            "INSERT INTO outbox_relay.position_map (slot_name, stream, commit_lsn, commit_time, stream_seq) \
             SELECT $1, $2, l::pg_lsn, t, s FROM unnest($3::text[], $4::timestamptz[], $5::int8[]) AS u(l, t, s)",
            &[&SLOT, &STREAM, &lsns, &times, &seqs],
        )
        .await
        .context("filling outbox_relay.position_map")?;
    Ok(lsns.len() as u64)
}

/// `n` targets spread over the stream (away from its very start), LSN or time.
fn targets(filled: &Filled, n: usize, by_time: bool) -> Vec<Target> {
    let txs = filled.txs();
    (0..n)
        .map(|j| {
            // Spread, and not on an anchor: an odd offset inside the anchor's range.
            let k = (txs * (2 * j as u64 + 1) / (2 * n as u64) + 37).min(txs - 1);
            if by_time {
                Target::Time(from_micros(filled.commit_us[k as usize]))
            } else {
                Target::Lsn(Lsn(tx_lsn(k).0 - LSN_STEP / 2))
            }
        })
        .collect()
}

async fn query(env: &Env, target: Target) -> Result<(u64, String, u64, u32)> {
    let map_target = match target {
        Target::Lsn(x) => MapTarget::Lsn(x),
        Target::Time(t) => MapTarget::Time(t),
    };
    let hint = map_start(&env.client, SLOT, STREAM, map_target)
        .await?
        .map(|s| Hint {
            anchor_lsn: s.anchor_lsn,
            anchor_time: s.anchor_time,
            start_seq: s.start_seq,
        });
    let p = outbox_position::locate(&env.js, STREAM, target, hint, Limits::default()).await?;
    let method = match p.method {
        outbox_position::Method::Map(_) => "position_map",
        outbox_position::Method::Bisect { .. } => "stream_bisection",
        outbox_position::Method::StoredTime { .. } => "stream_stored_time",
        outbox_position::Method::EmptyStream => "empty_stream",
    };
    Ok((p.sequence, method.to_owned(), p.scanned, p.gets))
}

async fn command(env: &Env, config: &std::path::Path, target: Target) -> Result<(u64, f64)> {
    let at = match target {
        Target::Lsn(x) => ["--lsn".to_owned(), x.to_string()],
        Target::Time(t) => [
            "--time".to_owned(),
            humantime::format_rfc3339_micros(t).to_string(),
        ],
    };
    let started = Instant::now();
    let out = tokio::process::Command::new(&env.relay_bin)
        .arg("--config")
        .arg(config)
        .arg("position")
        .args(at)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .await
        .context("running outbox-relay position")?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        bail!(
            "outbox-relay position failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let seq = json["sequence"]
        .as_u64()
        .context("`position --json` printed no sequence")?;
    Ok((seq, ms))
}

async fn lookups(
    env: &Env,
    config: &std::path::Path,
    filled: &Filled,
    label: String,
    by_time: bool,
    queries: usize,
) -> Result<LookupStat> {
    let mut stat = LookupStat {
        label,
        method: String::new(),
        max_scanned: 0,
        max_gets: 0,
        queries,
        query_p50_ms: 0.0,
        query_max_ms: 0.0,
        processes: PROCESSES,
        process_p50_ms: 0.0,
        process_max_ms: 0.0,
        wrong: 0,
    };
    let mut times = Vec::new();
    let mut methods = Vec::new();
    for target in targets(filled, queries, by_time) {
        let started = Instant::now();
        let (seq, method, scanned, gets) = query(env, target).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        if seq != filled.expected(target) {
            stat.wrong += 1;
        }
        if !methods.contains(&method) {
            methods.push(method);
        }
        stat.max_scanned = stat.max_scanned.max(scanned);
        stat.max_gets = stat.max_gets.max(gets);
    }
    times.sort_by(f64::total_cmp);
    stat.query_p50_ms = quantile(&times, 0.5);
    stat.query_max_ms = times.last().copied().unwrap_or(f64::NAN);
    stat.method = methods.join(", ");
    let mut walls = Vec::new();
    for target in targets(filled, PROCESSES, by_time) {
        let (seq, ms) = command(env, config, target).await?;
        walls.push(ms);
        if seq != filled.expected(target) {
            stat.wrong += 1;
        }
    }
    walls.sort_by(f64::total_cmp);
    stat.process_p50_ms = quantile(&walls, 0.5);
    stat.process_max_ms = walls.last().copied().unwrap_or(f64::NAN);
    say(format!(
        "   {}: query p50 {:.1} ms, max {:.1} ms; process p50 {:.0} ms, max {:.0} ms; {} (scanned <= {}, direct gets <= {}); {} wrong",
        stat.label,
        stat.query_p50_ms,
        stat.query_max_ms,
        stat.process_p50_ms,
        stat.process_max_ms,
        stat.method,
        stat.max_scanned,
        stat.max_gets,
        stat.wrong
    ));
    Ok(stat)
}

/// Outbox rows for `n` events spread over the stream (the middle of a transaction), each with
/// its transaction's commit time as `created_at`: (event id, its sequence).
async fn trace_rows(env: &Env, filled: &Filled, n: usize) -> Result<Vec<(String, u64)>> {
    let txs = filled.txs();
    let mut rows = Vec::with_capacity(n);
    for j in 0..n as u64 {
        let k = (txs * (2 * j + 1) / (2 * n as u64) + 37).min(txs - 1);
        let i = (k * TX_EVENTS + TX_EVENTS / 2).min(txs * TX_EVENTS - 1);
        let id = format!("00000000-0000-4000-8000-{i:012x}");
        env.client
            .execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
                 VALUES ($1::text::uuid, 'Order', $2, 'OrderCreated', '{}', $3)",
                &[
                    &id,
                    &i.to_string(),
                    &from_micros(filled.commit_us[k as usize]),
                ],
            )
            .await
            .context("inserting a row to trace")?;
        rows.push((id, i + 1));
    }
    Ok(rows)
}

/// `outbox-relay trace <id> --json` of each row, as processes (wall time).
async fn traces(
    env: &Env,
    config: &std::path::Path,
    rows: &[(String, u64)],
    label: String,
) -> Result<TraceStat> {
    let mut walls = Vec::new();
    let mut wrong = 0;
    for (id, seq) in rows {
        let started = Instant::now();
        let out = tokio::process::Command::new(&env.relay_bin)
            .arg("--config")
            .arg(config)
            .args(["trace", id, "--json"])
            .stdin(Stdio::null())
            .output()
            .await
            .context("running outbox-relay trace")?;
        walls.push(started.elapsed().as_secs_f64() * 1000.0);
        if !out.status.success() {
            bail!(
                "outbox-relay trace failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        if json["publish"]["sequence"].as_u64() != Some(*seq) {
            wrong += 1;
        }
    }
    walls.sort_by(f64::total_cmp);
    let stat = TraceStat {
        label,
        runs: walls.len(),
        p50_ms: quantile(&walls, 0.5),
        max_ms: walls.last().copied().unwrap_or(f64::NAN),
        wrong,
    };
    say(format!(
        "   trace, {}: process p50 {:.0} ms, max {:.0} ms ({} runs); {} wrong",
        stat.label, stat.p50_ms, stat.max_ms, stat.runs, stat.wrong
    ));
    Ok(stat)
}

pub(super) async fn position(env: &Env, args: &Args) -> Result<PositionRun> {
    let messages = args.position_messages();
    let every = args.position_anchor_every;
    say(format!(
        "== position: filling a {messages}-message stream (raw JetStream, the relay's headers)"
    ));
    reset(env).await?;
    let (filled, fill_secs) = fill(env, messages).await?;
    say(format!(
        "   filled in {fill_secs:.1} s ({:.0} msgs/s)",
        messages as f64 / fill_secs
    ));
    let anchors = fill_map(env, &filled, every).await?;
    let config = relay_config_with(env, SLOT, 1024, "")?;
    let mut run = PositionRun {
        messages,
        fill_secs,
        anchor_every: every,
        anchors,
        lookups: Vec::new(),
        traces: Vec::new(),
    };
    let traced = trace_rows(env, &filled, PROCESSES).await?;
    for by_time in [false, true] {
        let what = if by_time { "--time" } else { "--lsn" };
        let label = format!("{what}, position map ({anchors} anchors, one per {every} messages)");
        run.lookups
            .push(lookups(env, &config, &filled, label, by_time, QUERIES_MAP).await?);
    }
    run.traces
        .push(traces(env, &config, &traced, "position map".into()).await?);
    // Pruned: only the newest anchor is left (pruning keeps it), after every target.
    env.client
        .execute(
            "DELETE FROM outbox_relay.position_map WHERE slot_name = $1 AND commit_lsn < \
             (SELECT max(commit_lsn) FROM outbox_relay.position_map WHERE slot_name = $1)",
            &[&SLOT],
        )
        .await?;
    for by_time in [false, true] {
        let what = if by_time { "--time" } else { "--lsn" };
        let label = format!("{what}, position map pruned (stream search)");
        run.lookups
            .push(lookups(env, &config, &filled, label, by_time, QUERIES_STREAM).await?);
    }
    run.traces.push(
        traces(
            env,
            &config,
            &traced,
            "position map pruned (stream search)".into(),
        )
        .await?,
    );
    env.client.execute("TRUNCATE outbox", &[]).await?;
    let _ = env.js.delete_stream(STREAM).await;
    Ok(run)
}
