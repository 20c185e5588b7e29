//! Commit-to-ack of the fleet's pipelines, as the latency rows measure it: `ts`
//! (clock_timestamp() at the INSERT of a 1-row autocommit transaction) to the stream's store
//! time of the message, read back by one ordered consumer per stream.

use std::time::{Duration, Instant};

use anyhow::Result;
use async_nats::jetstream::consumer;
use futures::StreamExt as _;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;

use crate::measure::quantile;

use super::{FleetEnv, Pipe};

/// (pipeline index, `ts` of the row, stream store time), µs since the Unix epoch.
pub(super) type Stamp = (usize, i64, i64);

pub(super) fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Reads every message stored from now on in each of `pipes`' streams and sends its stamp.
pub(super) async fn stamp_readers(
    fe: &FleetEnv<'_>,
    pipes: &[Pipe],
) -> Result<(Vec<JoinHandle<()>>, UnboundedReceiver<Stamp>)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Stamp>();
    let mut readers = Vec::new();
    for (i, p) in pipes.iter().enumerate() {
        let stream = fe.env.js.get_stream(&p.stream).await?;
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::New,
                ..Default::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        let tx = tx.clone();
        readers.push(tokio::spawn(async move {
            while let Some(Ok(m)) = messages.next().await {
                let Ok(info) = m.info() else { continue };
                let stored_us = (info.published.unix_timestamp_nanos() / 1000) as i64;
                let ts = serde_json::from_slice::<serde_json::Value>(&m.payload)
                    .ok()
                    .and_then(|v| v.get("ts").and_then(serde_json::Value::as_i64));
                if let Some(ts) = ts
                    && tx.send((i, ts, stored_us)).is_err()
                {
                    break;
                }
            }
        }));
    }
    Ok((readers, rx))
}

/// Commit-to-ack of the stamps whose `ts` is in `[from, to)`, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Latencies {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The highest p99 of any one pipeline.
    pub worst_pipeline_p99_ms: f64,
}

/// The latencies of the stamps whose `ts` is in `[from, to)`.
pub(super) fn latencies(stamps: &[Stamp], pipelines: usize, from: i64, to: i64) -> Latencies {
    let mut all = Vec::new();
    let mut each = vec![Vec::new(); pipelines];
    for &(i, ts, stored) in stamps.iter().filter(|s| s.1 >= from && s.1 < to) {
        let ms = (stored - ts) as f64 / 1000.0;
        all.push(ms);
        each[i].push(ms);
    }
    all.sort_by(f64::total_cmp);
    Latencies {
        samples: all.len(),
        p50_ms: quantile(&all, 0.50),
        p99_ms: quantile(&all, 0.99),
        max_ms: all.last().copied().unwrap_or(f64::NAN),
        worst_pipeline_p99_ms: each
            .iter_mut()
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.sort_by(f64::total_cmp);
                quantile(v, 0.99)
            })
            .fold(f64::NAN, f64::max),
    }
}

/// Moves every stamp received so far from `rx` into `stamps`.
fn drain(rx: &mut UnboundedReceiver<Stamp>, stamps: &mut Vec<Stamp>) {
    while let Ok(s) = rx.try_recv() {
        stamps.push(s);
    }
}

/// Waits (5 s at most) until the events committed in `[from, to)` were read back, at least
/// 95 % of `expected`; returns how many were.
pub(super) async fn kept_up(
    rx: &mut UnboundedReceiver<Stamp>,
    stamps: &mut Vec<Stamp>,
    (from, to): (i64, i64),
    expected: u64,
) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        drain(rx, stamps);
        let n = stamps.iter().filter(|s| s.1 >= from && s.1 < to).count() as u64;
        if n * 100 >= expected * 95 || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
