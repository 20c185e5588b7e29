//! On-demand backfill beside a live load: `outbox-relay backfill --table
//! public.outbox` publishes rows written before the relay's slot existed while the relay
//! streams a steady live load. Measured: backfill rows/s against the broker limit of the same
//! run, and the live commit-to-ack latency of the rows committed while the backfill ran.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};

use crate::Args;
use crate::measure::quantile;

use super::latency::{Load, collect, latencies_ms, produce_load, stamps, warm_up};
use super::limits::broker_limit;
use super::relay::{RelayProc, finished_line, relay_config_with, tail};
use super::setup::{Env, drop_slot, reset, stream_messages, write_backlog};
use super::{BASE_SLOT, say};

/// Aggregate type of the live rows: their subject is `outbox.Live.OrderCreated`, so the
/// latency reader sees them and not the backfilled rows (`outbox.Order.…`).
const LIVE: &str = "Live";
const SLOT: &str = "relay_backfill";

/// One backfill run.
#[derive(Debug, Clone)]
pub struct BackfillRun {
    pub rows: u64,
    /// Wall time of the `outbox-relay backfill` process, spawn to exit.
    pub secs: f64,
    pub rows_per_s: f64,
    /// Raw JetStream publishes of `rows` messages, msgs/s, same run.
    pub broker: f64,
    pub live_target: u64,
    pub live_achieved: f64,
    /// Live rows committed while the backfill ran.
    pub live_samples: usize,
    pub live_p50_ms: f64,
    pub live_p99_ms: f64,
    pub live_max_ms: f64,
    /// What is wrong with the stream afterwards, if anything (not every row exactly once).
    pub problem: Option<String>,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

// Long: one measured run: set-up, the timed region and its readings in order, so what the figure
// includes reads in one place
pub(super) async fn backfill(env: &Env, args: &Args) -> Result<BackfillRun> {
    let rows = args.backfill_rows();
    let live_rate = args.backfill_live_rate;
    say(format!(
        "== backfill: {rows} rows written before the slot, `outbox-relay backfill` beside a live load of {live_rate}/s"
    ));
    reset(env).await?;
    // The rows must be older than the relay's slot: they are the backfill's, not the relay's.
    drop_slot(env, BASE_SLOT).await;
    let (_, _, write_secs) = write_backlog(env, rows, 1000).await?;
    say(format!("   {rows} rows written in {write_secs:.1} s"));
    let (secs, _) = broker_limit(env, rows).await?;
    let broker = rows as f64 / secs;
    say(format!(
        "   broker limit (raw JetStream): {broker:.0} msgs/s ({secs:.2} s)"
    ));
    env.client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&SLOT],
        )
        .await
        .context("creating the backfill run's slot")?;
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    let config = relay_config_with(env, SLOT, mif, "")?;
    let mut relay = RelayProc::start_config(env, &env.relay_bin, &config, SLOT)?;
    let warm = warm_up(env, &mut relay, "outbox", LIVE).await?;
    let (reader, mut rx) = stamps(env, &format!("outbox.{LIVE}.>")).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let load = Load {
        aggregate: LIVE,
        stop: Some(stop.clone()),
        ..Load::steady(live_rate, 24 * 3600, 1)
    };
    let log = env.log_dir.join("backfill.log");
    let run_backfill = async {
        // Let the live load settle first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let from_us = now_us();
        let started = Instant::now();
        let status = tokio::process::Command::new(&env.relay_bin)
            .arg("--config")
            .arg(&config)
            .args(["backfill", "--table", "public.outbox"])
            .args(&args.backfill_arg)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .status()
            .await
            .context("running outbox-relay backfill")?;
        let secs = started.elapsed().as_secs_f64();
        let until_us = now_us();
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !status.success() {
            bail!(
                "outbox-relay backfill failed ({status}); log {}:\n{}",
                log.display(),
                tail(&log)
            );
        }
        anyhow::Ok((secs, from_us, until_us))
    };
    // The load runs until the backfill ended, however it ended.
    let backfill_then_stop = async {
        let r = run_backfill.await;
        stop.store(true, Ordering::Relaxed);
        r
    };
    let (live, window) = tokio::join!(produce_load(env, load), backfill_then_stop);
    let (window, (sent, live_achieved)) = (window?, live?);
    let (secs, from_us, until_us) = window;
    let got = collect(&mut rx, sent, Duration::from_secs(120))
        .await
        .context("live load during the backfill")?;
    reader.abort();
    let during: Vec<_> = got
        .iter()
        .filter(|(ts, _)| (from_us..=until_us).contains(ts))
        .collect();
    let lat = latencies_ms(during);
    let stored = stream_messages(env, super::STREAM).await?;
    relay.check_alive()?;
    relay.stop().await?;
    drop_slot(env, SLOT).await;
    let expected = rows + warm + sent;
    let problem = (stored != expected).then(|| {
        format!(
            "the stream holds {stored} messages, expected {expected} ({rows} backfilled + {} live)",
            warm + sent
        )
    });
    let summary = finished_line(&log);
    let run = BackfillRun {
        rows,
        secs,
        rows_per_s: rows as f64 / secs,
        broker,
        live_target: live_rate,
        live_achieved,
        live_samples: lat.len(),
        live_p50_ms: quantile(&lat, 0.50),
        live_p99_ms: quantile(&lat, 0.99),
        live_max_ms: lat.last().copied().unwrap_or(f64::NAN),
        problem,
    };
    say(format!(
        "   backfill: {:.0} rows/s ({:.2} s, {:.0}% of the broker limit); live {live_achieved:.0}/s during it: p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms ({} samples)",
        run.rows_per_s,
        run.secs,
        run.rows_per_s * 100.0 / broker,
        run.live_p50_ms,
        run.live_p99_ms,
        run.live_max_ms,
        run.live_samples
    ));
    say(format!("   {summary}"));
    if let Some(p) = &run.problem {
        say(format!("   backfill: {p}"));
    }
    Ok(run)
}
