//! The console (`[http] console = true`): a page served by the relay's `[http]` listener at
//! `/console`, compiled into the binary (nothing to build or install), and the read-only JSON it
//! reads under `/console/api/`: the overview (what `/status` says, plus the last hour of events/s
//! and commit-to-ack latency), the latest messages of the stream, one message, the dead
//! letters, the consumers, backfills and signals, the configuration (secrets redacted) and one
//! event's trace.
//!
//! Access: without `[http] console_token_file` the API answers only requests from loopback;
//! with it, only requests carrying the token (`Authorization: Bearer`). The page itself holds no
//! data. With `[http] console_write = true` (which needs the token) it can start a backfill or a
//! replay and re-publish dead letters, each as a signal row the relay carries out
//! ([`changes`]); everything else only reads.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use relay_telemetry::Telemetry;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use relay_runtime::config::RelayConfig;

mod api;
mod changes;
mod messages;

/// How often the overview's history is sampled, and how much of it is kept (one hour).
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const HISTORY: usize = 360;

/// What the console's handlers share.
#[derive(Debug)]
pub(crate) struct Console {
    config: RelayConfig,
    telemetry: Arc<Telemetry>,
    token: Option<String>,
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
    /// The console of the relay of `config` and `telemetry`, opened with `token` (`[http]
    /// console_token_file`; `None`: loopback only).
    pub(crate) fn new(
        config: &RelayConfig,
        telemetry: Arc<Telemetry>,
        token: Option<String>,
    ) -> Self {
        Self {
            config: config.clone(),
            telemetry,
            token,
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
}

/// The console's routes, for the `[http]` listener's router.
pub(crate) fn routes(console: Arc<Console>) -> axum::Router {
    let write = console.config.http.console_write;
    let api = axum::Router::new()
        .route("/console/api/overview", get(api::overview))
        .route("/console/api/events", get(api::events))
        .route("/console/api/message/{seq}", get(api::message))
        .route("/console/api/dead-letters", get(api::dead_letters))
        .route(
            "/console/api/dead-letters/republish",
            post(changes::republish),
        )
        .route("/console/api/signals", post(changes::signal))
        .route("/console/api/consumers", get(api::consumers))
        .route("/console/api/backfills", get(api::backfills))
        .route("/console/api/config", get(api::config))
        .route("/console/api/trace/{event_id}", get(api::trace))
        .route_layer(axum::middleware::from_fn_with_state(console.clone(), guard))
        .with_state(console);
    let page_text: Arc<str> = PAGE
        .replace(
            "{{ACCESS}}",
            if write {
                "Write access on: backfills, replays and re-publishing of dead letters can be started here."
            } else {
                "Read-only."
            },
        )
        .into();
    let page = move || {
        let text = page_text.clone();
        async move { page_response(text) }
    };
    axum::Router::new()
        .route("/console", get(page.clone()))
        .route("/console/", get(page))
        .route("/console/app.js", get(script))
        .route("/console/style.css", get(style))
        .merge(api)
}

/// Lets through requests with the token, or from loopback when there is none.
async fn guard(
    State(console): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let allowed = match &console.token {
        Some(token) => headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes())),
        None => local_request(
            peer.ip(),
            headers.get(header::HOST).and_then(|v| v.to_str().ok()),
            headers.contains_key(header::FORWARDED) || headers.contains_key("x-forwarded-for"),
        ),
    };
    if allowed {
        return next.run(request).await;
    }
    let why = if console.token.is_some() {
        "the console needs its token: open it as /console#token=<the token in [http] console_token_file>"
    } else {
        "without a token the console answers only requests from this host to a loopback address (localhost, 127.0.0.1, [::1]) not passed on by a proxy: set [http] console_token_file to open it from elsewhere"
    };
    (
        StatusCode::FORBIDDEN,
        axum::Json(serde_json::json!({ "error": why })),
    )
        .into_response()
}

/// The token of an `Authorization` value of the Bearer scheme, whose name is case-insensitive
/// (RFC 9110, 11.1): `Bearer <token>`, `bearer <token>`; one or more spaces after it.
fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Whether a request without a token may read: from loopback (an IPv4 peer of a dual-stack
/// listener counts by its IPv4 address), addressed to a loopback name (a page elsewhere whose
/// name was pointed at 127.0.0.1, DNS rebinding, names its own host), and not passed on by a
/// proxy on this host (whose requests all come from loopback).
fn local_request(peer: std::net::IpAddr, host: Option<&str>, forwarded: bool) -> bool {
    let Some(host) = host else {
        return false;
    };
    // `name:port`, `[v6]:port`, or a name alone.
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let local_name = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback());
    peer.to_canonical().is_loopback() && local_name && !forwarded
}

/// Compares without returning early at the first difference (no timing hint of the token).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

const PAGE: &str = include_str!("console/page.html");
const SCRIPT: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/style.css");

/// Only the console's own files: no inline script, nothing from elsewhere.
const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

fn page_response(text: Arc<str>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text.to_string(),
    )
        .into_response()
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}

/// Samples the overview's history every [`SAMPLE_EVERY`] until `ended`.
pub(crate) fn spawn_history(console: Arc<Console>, ended: CancellationToken) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_token_only_local_requests_to_a_local_name_are_let_through() {
        let v4: std::net::IpAddr = "127.0.0.1".parse().expect("ip");
        let mapped: std::net::IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
        let remote: std::net::IpAddr = "10.1.2.3".parse().expect("ip");
        assert!(local_request(v4, Some("127.0.0.1:9464"), false));
        assert!(local_request(v4, Some("localhost:9464"), false));
        assert!(local_request(mapped, Some("[::1]:9464"), false));
        assert!(local_request(v4, Some("localhost"), false));
        assert!(!local_request(remote, Some("127.0.0.1:9464"), false));
        // DNS rebinding: a foreign name pointed at 127.0.0.1.
        assert!(!local_request(v4, Some("evil.example:9464"), false));
        assert!(!local_request(v4, None, false));
        // A proxy on this host passes everyone's requests on from loopback.
        assert!(!local_request(v4, Some("127.0.0.1:9464"), true));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_is_not() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  abc"), Some("abc"));
        assert_eq!(bearer_token("bearer ABC"), Some("ABC"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(bearer_token("abc"), None);
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
