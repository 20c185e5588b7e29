//! Commit-to-ack latency at steady rates, and the steady load and the stamp reader the other
//! rows under load (backfill, cleanup) measure with.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::consumer;
use futures::StreamExt as _;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use crate::Args;
use crate::measure::{context_switches, cpu_seconds, micros_per_event, peak_rss, quantile};

use super::publish_mode::PublishModeArg;
use super::relay::{RelayProc, relay_config_full, tail};
use super::setup::{Env, copy_slot, drop_slot, insert_sql_into, reset, stream_messages};
use super::{DB, LatencyRun, STREAM, say};

/// (row insert time, stream store time), µs since the Unix epoch.
pub(super) type Stamp = (i64, i64);

/// A steady load: 1-row autocommit transactions into `table` with aggregate type `aggregate`,
/// at `rate` per second over `conns` connections, for `secs` or until `stop` is set.
pub(super) struct Load {
    pub(super) rate: u64,
    pub(super) conns: usize,
    pub(super) table: &'static str,
    pub(super) aggregate: &'static str,
    pub(super) secs: u64,
    pub(super) stop: Option<Arc<AtomicBool>>,
    /// Rows per transaction (the rate counts rows).
    pub(super) rows_per_tx: u64,
}

impl Load {
    /// Rows of `outbox`, aggregate `Order`, for `secs`.
    pub(super) fn steady(rate: u64, secs: u64, conns: usize) -> Self {
        Self {
            rate,
            conns,
            table: "outbox",
            aggregate: "Order",
            secs,
            stop: None,
            rows_per_tx: 1,
        }
    }
}

async fn produce(env: &Env, rate: u64, secs: u64, conns: usize) -> Result<(u64, f64)> {
    produce_load(env, Load::steady(rate, secs, conns)).await
}

/// Runs `load`; returns (rows committed, their rate).
pub(super) async fn produce_load(env: &Env, load: Load) -> Result<(u64, f64)> {
    let per_conn = load.rate as f64 / load.conns as f64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..load.conns {
        let client = env.pg.connect(DB).await?;
        let (table, aggregate, stop) = (load.table, load.aggregate, load.stop.clone());
        let rows_per_tx = load.rows_per_tx.max(1);
        let end = Duration::from_secs(load.secs);
        tasks.push(tokio::spawn(async move {
            let mut sent = 0_u64;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let base = (c as u64) << 40;
            loop {
                tick.tick().await;
                let elapsed = started.elapsed();
                if elapsed >= end || stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
                    break;
                }
                let due = (elapsed.as_secs_f64() * per_conn) as u64;
                if due <= sent {
                    continue;
                }
                let mut sql = String::new();
                let mut k = sent;
                while k < due {
                    let upto = (k + rows_per_tx).min(due);
                    sql.push_str("BEGIN;");
                    for j in k..upto {
                        let g = base + j + 1;
                        sql.push_str(&insert_sql_into(table, aggregate, g, g));
                        sql.push(';');
                    }
                    sql.push_str("COMMIT;");
                    k = upto;
                }
                client.batch_execute(&sql).await?;
                sent = due;
            }
            anyhow::Ok(sent)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok((total, total as f64 / started.elapsed().as_secs_f64()))
}

/// Writes 100 rows of `table` (aggregate `aggregate`) in a second and waits until the relay
/// stored them (and so created the stream): returns how many it wrote.
pub(super) async fn warm_up(
    env: &Env,
    relay: &mut RelayProc,
    table: &'static str,
    aggregate: &'static str,
) -> Result<u64> {
    let load = Load {
        table,
        aggregate,
        ..Load::steady(100, 1, 1)
    };
    let (warm, _) = produce_load(env, load).await?;
    wait_stored(env, relay, warm).await?;
    Ok(warm)
}

/// Waits (60 s at most) until the stream holds `messages` messages.
pub(super) async fn wait_stored(env: &Env, relay: &mut RelayProc, messages: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if stream_messages(env, STREAM).await.unwrap_or(0) >= messages {
            return Ok(());
        }
        relay.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "relay did not deliver {messages} messages; log:\n{}",
                tail(&relay.log)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads every message stored from now on whose subject matches `filter` and sends its
/// [`Stamp`]: the `ts` of its payload and the stream's store time (the ack time).
pub(super) async fn stamps(
    env: &Env,
    filter: &str,
) -> Result<(JoinHandle<()>, UnboundedReceiver<Stamp>)> {
    let stream = env.js.get_stream(STREAM).await?;
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::New,
            filter_subject: filter.to_owned(),
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Stamp>();
    let reader = tokio::spawn(async move {
        while let Some(Ok(m)) = messages.next().await {
            let Ok(info) = m.info() else { continue };
            let stored_us = (info.published.unix_timestamp_nanos() / 1000) as i64;
            let ts = serde_json::from_slice::<serde_json::Value>(&m.payload)
                .ok()
                .and_then(|v| v.get("ts").and_then(serde_json::Value::as_i64));
            if let Some(ts) = ts
                && tx.send((ts, stored_us)).is_err()
            {
                break;
            }
        }
    });
    Ok((reader, rx))
}

/// The next `count` stamps from `rx`, waiting at most `wait` in all.
pub(super) async fn collect(
    rx: &mut UnboundedReceiver<Stamp>,
    count: u64,
    wait: Duration,
) -> Result<Vec<Stamp>> {
    let mut out = Vec::with_capacity(count as usize);
    let deadline = Instant::now() + wait;
    while (out.len() as u64) < count {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(stamp)) => out.push(stamp),
            _ => bail!("received {} of {count} events within {wait:?}", out.len()),
        }
    }
    Ok(out)
}

/// Commit-to-ack milliseconds of `stamps`, sorted.
pub(super) fn latencies_ms<'a>(stamps: impl IntoIterator<Item = &'a Stamp>) -> Vec<f64> {
    let mut lat: Vec<f64> = stamps
        .into_iter()
        .map(|(ts, stored)| (stored - ts) as f64 / 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    lat
}

/// Commit-to-ack latency at each steady rate, and the relay's CPU seconds from its start until
/// it delivered the warm-up rows (start-up, for the catch-up rows' CPU per event).
pub(super) async fn latency(env: &Env, args: &Args) -> Result<(Vec<LatencyRun>, f64)> {
    say("== latency: commit to ack at steady rates");
    latency_in_mode(env, args, PublishModeArg::PerMessage, &[1_000, 10_000]).await
}

/// [`latency`] of a relay publishing in `mode`, at each of `rates` events/s.
pub(super) async fn latency_in_mode(
    env: &Env,
    args: &Args,
    mode: PublishModeArg,
    rates: &[u64],
) -> Result<(Vec<LatencyRun>, f64)> {
    reset(env).await?;
    let slot = format!("relay_latency{}", mode.variant());
    let slot = slot.as_str();
    copy_slot(env, slot).await?;
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    let config = relay_config_full(env, slot, mif, &mode.nats_keys(), "")?;
    let mut relay = RelayProc::start_config(env, &env.relay_bin, &config, slot)?;
    warm_up(env, &mut relay, "outbox", "Order").await?;
    let startup_cpu = cpu_seconds(&relay.pid().to_string()).unwrap_or(f64::NAN);
    let (reader, mut rx) = stamps(env, ">").await?;
    let mut runs = Vec::new();
    for &rate in rates {
        let conns = if rate > 2_000 { 2 } else { 1 };
        let relay_pid = relay.pid().to_string();
        let cpu_before = cpu_seconds(&relay_pid).unwrap_or(f64::NAN);
        let switches_before = context_switches(relay.pid());
        let (sent, achieved) = produce(env, rate, args.latency_secs(), conns).await?;
        let got = collect(&mut rx, sent, Duration::from_secs(60))
            .await
            .with_context(|| format!("latency run at {rate}/s"))?;
        let lat = latencies_ms(&got);
        let relay_cpu_secs = cpu_seconds(&relay_pid).unwrap_or(f64::NAN) - cpu_before;
        let relay_switches = context_switches(relay.pid())
            .zip(switches_before)
            .map(|(after, before)| after.saturating_sub(before));
        let run = LatencyRun {
            target_rate: rate,
            achieved_rate: achieved,
            samples: lat.len(),
            p50_ms: quantile(&lat, 0.50),
            p99_ms: quantile(&lat, 0.99),
            p999_ms: quantile(&lat, 0.999),
            max_ms: lat.last().copied().unwrap_or(f64::NAN),
            relay_rss: peak_rss(relay.pid()).unwrap_or(0),
            relay_cpu_secs,
            relay_switches,
        };
        say(format!(
            "   {rate}/s (achieved {achieved:.0}/s, {} samples): p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.1} ms; relay {:.1} CPU µs/event",
            run.samples,
            run.p50_ms,
            run.p99_ms,
            run.p999_ms,
            run.max_ms,
            micros_per_event(relay_cpu_secs, sent)
        ));
        runs.push(run);
    }
    reader.abort();
    relay.stop().await?;
    drop_slot(env, slot).await;
    Ok((runs, startup_cpu))
}
