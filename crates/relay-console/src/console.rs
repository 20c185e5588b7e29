//! The console (`[http] console = true`): pages served by the relay's `[http]` listener under
//! `/console`, compiled into the binary (nothing to build or install), and the read-only JSON
//! they read. One relay's console: the overview (what `/status` says, plus the last hour of
//! events/s and commit-to-ack latency), the latest messages of the stream, one message, the dead
//! letters, the consumers, backfills and signals, the configuration (secrets redacted) and one
//! event's trace; at `/console`, its JSON under `/console/api/`.
//!
//! A fleet's (`[fleet]` or `[[pipeline]]`): `/console` is the fleet page, one row per pipeline
//! with its state and numbers (JSON: `/console/api/fleet`), and each pipeline has the console
//! of one relay at `/console/p/{name}/`, its JSON under `/console/p/{name}/api/` ([`fleet`]).
//!
//! Access ([`access`]): without `[http] console_token_file` the JSON answers only requests from
//! loopback; with it, only requests carrying the token (`Authorization: Bearer`). The pages
//! themselves hold no data. With `[http] console_write = true` (which needs the token) a
//! relay's console can start a backfill or a replay and re-publish dead letters, each as a
//! signal row the relay carries out ([`changes`]); everything else only reads.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use relay_runtime::fleet::FleetView;
use relay_telemetry::Telemetry;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use relay_runtime::config::RelayConfig;

mod access;
mod api;
mod changes;
mod fleet;
mod messages;
mod page;

use access::{Access, guard};
use fleet::Consoles;

/// How often the overview's history is sampled, and how much of it is kept (one hour).
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const HISTORY: usize = 360;

/// One relay's console: what its handlers share.
#[derive(Debug)]
pub(crate) struct Console {
    config: RelayConfig,
    telemetry: Arc<Telemetry>,
    /// The console's own NATS connection, made at its first use.
    nats: tokio::sync::OnceCell<async_nats::jetstream::Context>,
    history: Mutex<VecDeque<Sample>>,
}

/// One point of the overview's charts.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// Unix seconds.
    at: u64,
    /// Events acknowledged per second since the previous sample.
    events_per_second: f64,
    /// Mean commit-to-ack latency of the events acknowledged since the previous sample, in
    /// milliseconds (`None` when none were).
    commit_to_ack_ms: Option<f64>,
    /// Bytes of WAL the slot's confirmed position is behind the server's.
    slot_lag_bytes: Option<i64>,
}

impl Console {
    /// The console of the relay of `config` and `telemetry` (one run of it).
    pub(crate) fn new(config: &RelayConfig, telemetry: Arc<Telemetry>) -> Self {
        Self {
            config: config.clone(),
            telemetry,
            nats: tokio::sync::OnceCell::new(),
            history: Mutex::new(VecDeque::with_capacity(HISTORY)),
        }
    }

    async fn jetstream(&self) -> anyhow::Result<&async_nats::jetstream::Context> {
        self.nats
            .get_or_try_init(|| async {
                let nats = relay_nats::connect(&self.config.nats).await?;
                anyhow::Ok(nats.jetstream().context().clone())
            })
            .await
    }

    /// The newest sample of its history (none in its first [`SAMPLE_EVERY`]).
    fn latest_sample(&self) -> Option<Sample> {
        self.history.lock().ok().and_then(|h| h.back().cloned())
    }
}

/// The console's routes for the `[http]` listener's router: one relay's, or a fleet's. Opened
/// with `token` (`[http] console_token_file`; `None`: loopback only); `write`: `[http]
/// console_write`. Each pipeline's history is sampled until `ended`.
pub(crate) fn routes(
    fleet: FleetView,
    token: Option<String>,
    write: bool,
    ended: CancellationToken,
) -> axum::Router {
    let access = Arc::new(Access::new(token));
    let is_fleet = fleet.is_fleet();
    let consoles = Arc::new(Consoles::new(fleet, ended.clone()));
    fleet::spawn_keeper(consoles.clone(), ended);
    let routes = if is_fleet {
        fleet::routes(consoles, access, write)
    } else {
        one_relay_routes(consoles, access, write)
    };
    routes.merge(page::assets())
}

/// One relay's console: the page at `/console`, its JSON under `/console/api/`.
fn one_relay_routes(consoles: Arc<Consoles>, access: Arc<Access>, write: bool) -> axum::Router {
    let api = api_routes("/console/api")
        .route_layer(from_fn_with_state(consoles, fleet::pick_only))
        .route_layer(from_fn_with_state(access, guard));
    let text: Arc<str> = page::relay_page(write, None).into();
    let page = move || {
        let text = text.clone();
        async move { page::html(&text) }
    };
    axum::Router::new()
        .route("/console", get(page.clone()))
        .route("/console/", get(page))
        .merge(api)
}

/// One relay's JSON under `prefix`; each handler reads the request's `Arc<Console>` (an
/// extension a layer adds: the only relay's, or the pipeline's the path names).
fn api_routes(prefix: &str) -> axum::Router {
    let at = |path: &str| format!("{prefix}{path}");
    axum::Router::new()
        .route(&at("/overview"), get(api::overview))
        .route(&at("/events"), get(api::events))
        .route(&at("/message/{seq}"), get(api::message))
        .route(&at("/dead-letters"), get(api::dead_letters))
        .route(&at("/dead-letters/republish"), post(changes::republish))
        .route(&at("/signals"), post(changes::signal))
        .route(&at("/consumers"), get(api::consumers))
        .route(&at("/backfills"), get(api::backfills))
        .route(&at("/config"), get(api::config))
        .route(&at("/trace/{event_id}"), get(api::trace))
}

/// Samples the overview's history every [`SAMPLE_EVERY`] until `ended` (the fleet's end, or
/// this run's console replaced by the next run's).
fn spawn_history(console: Arc<Console>, ended: CancellationToken) {
    tokio::spawn(async move {
        let stats = console.telemetry.stats.clone();
        let read = || {
            let count: u64 = stats
                .commit_to_ack_buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .sum();
            (
                stats.events_published.load(Ordering::Relaxed),
                stats.commit_to_ack_sum_micros.load(Ordering::Relaxed),
                count,
            )
        };
        let mut before = (std::time::Instant::now(), read());
        let mut ticks = tokio::time::interval(SAMPLE_EVERY);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = ended.cancelled() => return,
            }
            let now = (std::time::Instant::now(), read());
            let seconds = now.0.duration_since(before.0).as_secs_f64().max(0.001);
            let (published, sum, count) = now.1;
            let (published_then, sum_then, count_then) = before.1;
            let acked = count.saturating_sub(count_then);
            let sample = Sample {
                at: SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                events_per_second: published.saturating_sub(published_then) as f64 / seconds,
                commit_to_ack_ms: (acked > 0)
                    .then(|| sum.saturating_sub(sum_then) as f64 / acked as f64 / 1000.0),
                slot_lag_bytes: console.telemetry.slot_lag_bytes(),
            };
            if let Ok(mut history) = console.history.lock() {
                if history.len() == HISTORY {
                    history.pop_front();
                }
                history.push_back(sample);
            }
            before = now;
        }
    });
}
