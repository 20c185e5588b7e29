//! `[outbox.cleanup]` beside a steady load: for each mode, the relay runs with that
//! cleanup (or none) while 1-row transactions arrive at `--cleanup-rate`; measured are the rate
//! the relay delivered them at, their commit-to-ack latency (the latency rows' method), and the
//! table's size (`pg_total_relation_size` over its partitions and the partitions cleanup
//! detached and has not dropped yet) sampled over the run.
//!
//! `off` and `delete`/`mark` use the bench's `outbox` table (mark sets `published_at`, the
//! polling baseline's column); `off-partitioned` and `drop-partitions` use `outbox_part`,
//! range-partitioned on `created_at` with partitions created ahead for the whole run (the relay
//! does not create partitions), published through the root. Autovacuum is on during these runs
//! (the rest of the bench runs without it): deleted rows leave dead tuples that only vacuum makes
//! reusable.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};

use crate::Args;
use crate::measure::quantile;

use super::latency::{Load, collect, latencies_ms, produce_load, stamps, warm_up};
use super::relay::{RelayProc, relay_config_with};
use super::setup::{Env, drop_slot, reset};
use super::{BASE_SLOT, DB, PUBLICATION, say};

/// What runs beside the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupMode {
    /// No cleanup, `outbox`.
    Off,
    Delete,
    Mark,
    /// No cleanup, `outbox_part`.
    OffPartitioned,
    DropPartitions,
}

impl FromStr for CleanupMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "off" => Self::Off,
            "delete" => Self::Delete,
            "mark" => Self::Mark,
            "off-partitioned" => Self::OffPartitioned,
            "drop-partitions" => Self::DropPartitions,
            _ => {
                return Err(format!(
                    "{s:?}: expected off, delete, mark, off-partitioned or drop-partitions"
                ));
            }
        })
    }
}

impl CleanupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Delete => "delete",
            Self::Mark => "mark",
            Self::OffPartitioned => "off-partitioned",
            Self::DropPartitions => "drop-partitions",
        }
    }
    pub fn partitioned(self) -> bool {
        matches!(self, Self::OffPartitioned | Self::DropPartitions)
    }
    pub fn is_off(self) -> bool {
        matches!(self, Self::Off | Self::OffPartitioned)
    }
    fn table(self) -> &'static str {
        if self.partitioned() {
            "outbox_part"
        } else {
            "outbox"
        }
    }
}

/// Cleanup settings derived from the run's length.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub retain_secs: u64,
    pub interval_secs: u64,
    pub partition_secs: u64,
    pub batch_size: u32,
}

impl Timing {
    fn for_run(secs: u64) -> Self {
        Self {
            // Generous: drop-partitions must not detach a partition a slow writer still inserts into
            // (docs/configuration.md: retain outlasts the longest writing transaction).
            retain_secs: (secs / 4).max(30),
            interval_secs: (secs / 60).max(5),
            partition_secs: (secs / 30).max(10),
            batch_size: 2000,
        }
    }
}

/// One mode's run.
#[derive(Debug, Clone)]
pub struct CleanupRun {
    pub mode: CleanupMode,
    /// Rows per transaction of the load.
    pub rows_per_tx: u64,
    pub timing: Timing,
    pub secs: u64,
    pub target_rate: u64,
    /// Commits/s the load reached.
    pub achieved: f64,
    pub events: u64,
    /// Events / (load start → the last one stored in the stream).
    pub relay_rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// (seconds since the load started, bytes).
    pub sizes: Vec<(f64, u64)>,
    /// Rows deleted or dropped (delete, drop-partitions), or marked and still there plus deleted (mark with delete_after), by the end.
    pub cleaned: u64,
    /// Rows in the table at the end.
    pub rows_left: u64,
}

impl CleanupRun {
    /// Size at fraction `f` (0..=1) of the run.
    pub fn size_at(&self, f: f64) -> u64 {
        let i = ((self.sizes.len().saturating_sub(1)) as f64 * f).round() as usize;
        self.sizes.get(i).map_or(0, |s| s.1)
    }
    /// Least-squares slope of the second half, MB per minute.
    pub fn slope_mb_per_min(&self) -> f64 {
        let half = &self.sizes[self.sizes.len() / 2..];
        let n = half.len() as f64;
        if n < 2.0 {
            return f64::NAN;
        }
        let mx = half.iter().map(|s| s.0).sum::<f64>() / n;
        let my = half.iter().map(|s| s.1 as f64).sum::<f64>() / n;
        let cov: f64 = half.iter().map(|s| (s.0 - mx) * (s.1 as f64 - my)).sum();
        let var: f64 = half.iter().map(|s| (s.0 - mx).powi(2)).sum();
        cov / var * 60.0 / 1e6
    }
    /// Largest size of the second half over the largest of the first.
    pub fn growth(&self) -> f64 {
        let (first, second) = self.sizes.split_at(self.sizes.len() / 2);
        let max = |s: &[(f64, u64)]| s.iter().map(|s| s.1).max().unwrap_or(0) as f64;
        max(second) / max(first)
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Statements run one by one (ALTER SYSTEM refuses a transaction block).
async fn each(env: &Env, sqls: &[String]) -> Result<()> {
    for sql in sqls {
        env.client
            .batch_execute(sql)
            .await
            .with_context(|| format!("cleanup bench: {sql}"))?;
    }
    Ok(())
}

async fn autovacuum(env: &Env, on: bool) -> Result<()> {
    let sqls: Vec<String> = if on {
        vec![
            "ALTER SYSTEM SET autovacuum = on".into(),
            "ALTER SYSTEM SET autovacuum_naptime = '10s'".into(),
            "SELECT pg_reload_conf()".into(),
        ]
    } else {
        vec![
            "ALTER SYSTEM RESET autovacuum".into(),
            "ALTER SYSTEM RESET autovacuum_naptime".into(),
            "SELECT pg_reload_conf()".into(),
        ]
    };
    each(env, &sqls).await
}

/// `outbox_part`, partitions of `span` seconds from a minute ago to `ahead` seconds from now,
/// in the publication through its root.
async fn create_partitioned(env: &Env, span: u64, ahead: u64) -> Result<()> {
    each(
        env,
        &[
            "DROP TABLE IF EXISTS outbox_part".into(),
            "CREATE TABLE outbox_part (
                id uuid NOT NULL, aggregatetype varchar(255) NOT NULL,
                aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb,
                tracingspancontext varchar(512), created_at timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)"
                .into(),
            format!(
                "DO $$ DECLARE s bigint; BEGIN
                   FOR s IN SELECT generate_series(
                       (floor(extract(epoch FROM now()) / {span}) * {span})::bigint - 60,
                       (extract(epoch FROM now()))::bigint + {ahead}, {span}) LOOP
                     EXECUTE format('CREATE TABLE outbox_part_%s PARTITION OF outbox_part FOR VALUES FROM (to_timestamp(%s)) TO (to_timestamp(%s))', s, s, s + {span});
                   END LOOP; END $$"
            ),
            format!("ALTER PUBLICATION {PUBLICATION} ADD TABLE outbox_part"),
            format!("ALTER PUBLICATION {PUBLICATION} SET (publish_via_partition_root = true)"),
        ],
    )
    .await
}

async fn drop_partitioned(env: &Env) -> Result<()> {
    each(
        env,
        &[
            "DROP TABLE IF EXISTS outbox_part".into(),
            // Partitions cleanup detached and had not dropped yet are tables of their own now.
            "DO $$ DECLARE r record; BEGIN
               FOR r IN SELECT c.oid::regclass AS t FROM outbox_relay.cleanup_detached d
                        JOIN pg_class c ON c.oid = d.partition_oid LOOP
                 EXECUTE format('DROP TABLE %s', r.t);
               END LOOP; END $$"
                .into(),
            "DELETE FROM outbox_relay.cleanup_detached".into(),
            format!("ALTER PUBLICATION {PUBLICATION} SET (publish_via_partition_root = false)"),
        ],
    )
    .await
}

fn extra_config(mode: CleanupMode, t: Timing) -> String {
    let mut s = format!("\n[[outbox]]\ntable = \"public.{}\"\n", mode.table());
    let cleanup = match mode {
        CleanupMode::Off | CleanupMode::OffPartitioned => return s,
        CleanupMode::Delete => format!("mode = \"delete\"\nretain = \"{}s\"\n", t.retain_secs),
        // Marked at once, deleted after `retain` like a polling relay's cleanup job would: the
        // table stays flat in this mode too.
        CleanupMode::Mark => format!(
            "mode = \"mark\"\nsent_at_column = \"published_at\"\ndelete_after = \"{}s\"\n",
            t.retain_secs
        ),
        CleanupMode::DropPartitions => {
            format!(
                "mode = \"drop-partitions\"\nretain = \"{}s\"\n",
                t.retain_secs
            )
        }
    };
    s.push_str(&format!(
        "[outbox.cleanup]\n{cleanup}interval = \"{}s\"\nbatch_size = {}\n",
        t.interval_secs, t.batch_size
    ));
    s
}

/// Samples the table's size every `every` until `stop` (a plain table has no partition tree).
async fn sample_sizes(
    env: &Env,
    table: &str,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> Result<Vec<(f64, u64)>> {
    let client = env.pg.connect(DB).await?;
    let sql = format!(
        "SELECT (coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('{table}')), \
                          pg_total_relation_size('{table}')) \
               + coalesce((SELECT sum(pg_total_relation_size(c.oid)) FROM outbox_relay.cleanup_detached d \
                           JOIN pg_class c ON c.oid = d.partition_oid), 0))::bigint"
    );
    let started = Instant::now();
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(every);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let bytes: i64 = client.query_one(&sql, &[]).await?.get(0);
        out.push((started.elapsed().as_secs_f64(), bytes as u64));
    }
    Ok(out)
}

// Long: one measured run: set-up, the timed region and its readings in order, so what the figure
// includes reads in one place
async fn run_mode(env: &Env, args: &Args, mode: CleanupMode, secs: u64) -> Result<CleanupRun> {
    let timing = Timing::for_run(secs);
    let rate = args.cleanup_rate;
    say(format!(
        "== cleanup {}: {rate}/s for {secs} s ({})",
        mode.as_str(),
        mode.table()
    ));
    reset(env).await?;
    drop_slot(env, BASE_SLOT).await;
    if mode.partitioned() {
        create_partitioned(env, timing.partition_secs, secs + 600).await?;
    }
    let slot = format!("relay_cleanup_{}", mode.as_str().replace('-', "_"));
    env.client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await?;
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    let config = relay_config_with(env, &slot, mif, &extra_config(mode, timing))?;
    let mut relay = RelayProc::start_config(env, &env.relay_bin, &config, &slot)?;
    let warm = warm_up(env, &mut relay, mode.table(), "Order").await?;
    let (reader, mut rx) = stamps(env, ">").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let conns = if rate > 2_000 { 2 } else { 1 };
    let load = Load {
        table: mode.table(),
        rows_per_tx: args.cleanup_rows_per_tx,
        ..Load::steady(rate, secs, conns)
    };
    let every = Duration::from_secs_f64((secs as f64 / 60.0).clamp(1.0, 10.0));
    let load_start_us = now_us();
    let producing = async {
        let r = produce_load(env, load).await;
        stop.store(true, Ordering::Relaxed);
        r
    };
    let (load, sizes) = tokio::join!(
        producing,
        sample_sizes(env, mode.table(), every, stop.clone())
    );
    let ((events, achieved), sizes) = (load?, sizes?);
    let got = collect(&mut rx, events, Duration::from_secs(secs.max(300)))
        .await
        .with_context(|| format!("cleanup {} load", mode.as_str()))?;
    reader.abort();
    relay.check_alive()?;
    let last_us = got.iter().map(|s| s.1).max().unwrap_or(load_start_us);
    let lat = latencies_ms(&got);
    if std::env::var_os("RELAY_BENCH_TIMELINE").is_some() {
        say_slow_seconds(&got, load_start_us);
    }
    let counted = env
        .client
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE {}) FROM {}",
                if mode == CleanupMode::Mark {
                    "published_at IS NOT NULL"
                } else {
                    "false"
                },
                mode.table()
            ),
            &[],
        )
        .await?;
    let (left, marked) = (
        counted.get::<_, i64>(0) as u64,
        counted.get::<_, i64>(1) as u64,
    );
    relay.stop().await?;
    drop_slot(env, &slot).await;
    if mode.partitioned() {
        drop_partitioned(env).await?;
    }
    let run = CleanupRun {
        mode,
        rows_per_tx: args.cleanup_rows_per_tx,
        timing,
        secs,
        target_rate: rate,
        achieved,
        events,
        relay_rate: events as f64 / ((last_us - load_start_us) as f64 / 1e6),
        p50_ms: quantile(&lat, 0.5),
        p99_ms: quantile(&lat, 0.99),
        max_ms: lat.last().copied().unwrap_or(f64::NAN),
        // Mark: rows still there and marked, plus those `delete_after` deleted.
        cleaned: (events + warm).saturating_sub(left)
            + if mode == CleanupMode::Mark { marked } else { 0 },
        rows_left: left,
        sizes,
    };
    say(format!(
        "   load {achieved:.0}/s, relay {:.0}/s, p50 {:.1} ms, p99 {:.1} ms; size {:.1} / {:.1} / {:.1} MB (start/middle/end), second half {:+.1} MB/min; {} rows cleaned, {} left",
        run.relay_rate,
        run.p50_ms,
        run.p99_ms,
        run.size_at(0.0) as f64 / 1e6,
        run.size_at(0.5) as f64 / 1e6,
        run.size_at(1.0) as f64 / 1e6,
        run.slope_mb_per_min(),
        run.cleaned,
        run.rows_left
    ));
    Ok(run)
}

/// `RELAY_BENCH_TIMELINE=1`: the seconds of the load whose p99 commit-to-ack exceeded 100 ms,
/// to tell a steady cost from stalls.
fn say_slow_seconds(stamps: &[super::latency::Stamp], load_start_us: i64) {
    let mut by_second: std::collections::BTreeMap<i64, Vec<f64>> = Default::default();
    for &(ts, stored) in stamps {
        by_second
            .entry((ts - load_start_us) / 1_000_000)
            .or_default()
            .push((stored - ts) as f64 / 1000.0);
    }
    for (second, mut lat) in by_second {
        lat.sort_by(f64::total_cmp);
        let p99 = quantile(&lat, 0.99);
        if p99 > 100.0 {
            say(format!(
                "   second {second}: {} events, p50 {:.1} ms, p99 {p99:.1} ms",
                lat.len(),
                quantile(&lat, 0.5)
            ));
        }
    }
}

/// Every mode of `--cleanup-modes`; a mode that fails is reported (`mode: error`) and the next
/// one runs.
pub(super) async fn cleanup(env: &Env, args: &Args) -> Result<(Vec<CleanupRun>, Vec<String>)> {
    let secs = args.cleanup_secs();
    each(
        env,
        &[include_str!("../../../../migrations/0006_outbox_cleanup.sql").to_owned()],
    )
    .await?;
    autovacuum(env, true).await?;
    let (mut runs, mut failed) = (Vec::new(), Vec::new());
    for &mode in &args.cleanup_modes {
        match run_mode(env, args, mode, secs).await {
            Ok(run) => runs.push(run),
            Err(e) => {
                let e = format!("{}: {e:#}", mode.as_str());
                say(format!("   cleanup {e}"));
                failed.push(e);
                if mode.partitioned() {
                    let _ = drop_partitioned(env).await;
                }
            }
        }
    }
    autovacuum(env, false).await?;
    Ok((runs, failed))
}
