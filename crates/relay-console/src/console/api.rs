//! The console's JSON of one relay (`/console/api/…`; a fleet pipeline's under
//! `/console/p/{name}/api/…`): each handler reads the relay the request was given (its
//! `Arc<Console>`), gathers through the library calls the commands use (the relay's telemetry,
//! relay-postgres' cursor and signal reads, the stream reads, `trace`) and answers
//! `{"error": …}` with 502 when a server is out of reach.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Console, messages};
use relay_ops::trace::TraceOptions;

/// Messages of the stream's end a filtered listing reads at most.
pub(super) const WINDOW: u64 = 10_000;

pub(super) fn failed(status: StatusCode, error: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": format!("{error:#}") }))).into_response()
}

pub(super) fn unreachable(error: anyhow::Error) -> Response {
    failed(StatusCode::BAD_GATEWAY, format!("{error:#}"))
}

pub(super) async fn overview(Extension(console): Extension<Arc<Console>>) -> Response {
    let history: Vec<_> = console
        .history
        .lock()
        .map(|h| h.iter().cloned().collect())
        .unwrap_or_default();
    Json(json!({
        "status": console.telemetry.status(),
        "history": history,
        "sample_seconds": super::SAMPLE_EVERY.as_secs(),
        "dead_letter_subject": console.config.relay.dead_letter_subject,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    subject: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn events(
    Extension(console): Extension<Arc<Console>>,
    Query(query): Query<EventsQuery>,
) -> Response {
    let subject = query
        .subject
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    if let Some(bad) = subject.filter(|s| s.chars().any(|c| c.is_whitespace() || c.is_control())) {
        return failed(
            StatusCode::BAD_REQUEST,
            format!("{bad:?} is not a subject: no spaces (use `*` and `>` as wildcards)"),
        );
    }
    let limit = query.limit.unwrap_or(50).clamp(1, 500);
    // Without a filter the last `limit` messages are all there is to read.
    let window = if subject.is_some() {
        WINDOW
    } else {
        limit as u64
    };
    let js = match console.jetstream().await {
        Ok(js) => js,
        Err(e) => return unreachable(e),
    };
    match messages::latest(js, &console.config.nats.stream, subject, limit, window).await {
        Ok(listing) => Json(listing).into_response(),
        Err(e) => unreachable(e),
    }
}

/// `message/{seq}`: by name, as a fleet's pipeline routes also name the pipeline.
#[derive(Debug, Deserialize)]
pub(super) struct MessageAt {
    seq: u64,
}

pub(super) async fn message(
    Extension(console): Extension<Arc<Console>>,
    Path(MessageAt { seq }): Path<MessageAt>,
) -> Response {
    let js = match console.jetstream().await {
        Ok(js) => js,
        Err(e) => return unreachable(e),
    };
    match messages::one(js, &console.config.nats.stream, seq).await {
        Ok(Some(shown)) => Json(shown).into_response(),
        Ok(None) => failed(
            StatusCode::NOT_FOUND,
            format!("the stream holds no message at sequence {seq}"),
        ),
        Err(e) => unreachable(e),
    }
}

pub(super) async fn dead_letters(Extension(console): Extension<Arc<Console>>) -> Response {
    let Some(subject) = console.config.relay.dead_letter_subject.clone() else {
        return Json(json!({ "subject": null, "messages": [], "write": false })).into_response();
    };
    let js = match console.jetstream().await {
        Ok(js) => js,
        Err(e) => return unreachable(e),
    };
    match messages::latest(js, &console.config.nats.stream, Some(&subject), 200, WINDOW).await {
        Ok(listing) => {
            let reason_of = |m: &messages::Shown| {
                m.headers
                    .iter()
                    .find(|(name, _)| name == outbox_contract::HEADER_DLQ_REASON)
                    .map(|(_, v)| v.clone())
            };
            let letters: Vec<Value> = listing
                .messages
                .iter()
                .map(|m| json!({ "message": m, "reason": reason_of(m) }))
                .collect();
            Json(json!({
                "subject": subject,
                "messages": letters,
                "searched": listing.searched,
                "write": console.config.http.console_write,
            }))
            .into_response()
        }
        Err(e) => unreachable(e),
    }
}

pub(super) async fn consumers(Extension(console): Extension<Arc<Console>>) -> Response {
    use futures::TryStreamExt as _;
    let js = match console.jetstream().await {
        Ok(js) => js,
        Err(e) => return unreachable(e),
    };
    let listed = async {
        let mut stream = js.get_stream(&console.config.nats.stream).await?;
        let last = stream.info().await?.state.last_sequence;
        let infos: Vec<async_nats::jetstream::consumer::Info> =
            stream.consumers().try_collect().await?;
        anyhow::Ok((last, infos))
    };
    let (last, infos) = match listed.await {
        Ok(found) => found,
        Err(e) => return unreachable(e),
    };
    // Readers without a durable name (`tail`, this console's listings) are counted, not listed.
    let (durable, ephemeral): (Vec<_>, Vec<_>) =
        infos.iter().partition(|c| c.config.durable_name.is_some());
    let consumers: Vec<Value> = durable
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "filters": relay_ops::trace::consumers::filters_of(c),
                "pending": c.num_pending,
                "ack_pending": c.num_ack_pending,
                "redelivered": c.num_redelivered,
                "waiting": c.num_waiting,
                "ack_floor": c.ack_floor.stream_sequence,
                "delivered": c.delivered.stream_sequence,
                "behind_stream": behind_stream(c),
            })
        })
        .collect();
    Json(json!({
        "stream_last_sequence": last,
        "consumers": consumers,
        "ephemeral_readers": ephemeral.len(),
        "write": console.config.http.console_write,
    }))
    .into_response()
}

/// The messages on a consumer's filter it has not acknowledged: not delivered yet (`pending`)
/// and delivered but unacknowledged (`ack_pending`). Not the stream's last sequence minus the
/// ack floor: nats-server before 2.10 leaves the floor of a consumer that acknowledged nothing
/// at 0, not before its start sequence, which counted the whole stream.
fn behind_stream(c: &async_nats::jetstream::consumer::Info) -> u64 {
    c.num_pending.saturating_add(c.num_ack_pending as u64)
}

pub(super) async fn backfills(Extension(console): Extension<Arc<Console>>) -> Response {
    let config = &console.config;
    let gathered = async {
        let client = relay_postgres::connect(&config.postgres).await?;
        let cursors = relay_backfill::list_cursors(&client, &config.postgres.slot).await?;
        let signals = relay_backfill::signal::recent_signals(&client, 50).await?;
        anyhow::Ok((cursors, signals))
    };
    let (cursors, signals) = match gathered.await {
        Ok(found) => found,
        Err(e) => return unreachable(e),
    };
    let parse = |text: &Option<String>| {
        text.as_deref()
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
    };
    let cursors: Vec<Value> = cursors
        .iter()
        .map(|c| {
            json!({
                "table": c.id.table,
                "filter": c.id.filter,
                "on_create": c.cursor.on_create,
                "rows_done": c.cursor.rows_done,
                "rows_estimate": c.cursor.rows_estimate,
                "last_key": c.cursor.last_key,
                "started_at": c.cursor.started_at,
                "finished_at": c.cursor.finished_at,
                "updated_secs_ago": c.updated_secs_ago,
            })
        })
        .collect();
    let signals: Vec<Value> = signals
        .iter()
        .map(|s| {
            json!({
                "id": s.id,
                "kind": s.kind,
                "args": parse(&Some(s.args.clone())),
                "slot_name": s.slot_name,
                "requested_by": s.requested_by,
                "requested_at": s.requested_at,
                "state": s.state,
                "claimed_by": s.claimed_by,
                "finished_at": s.finished_at,
                "progress": parse(&s.progress),
                "outcome": s.outcome,
                "error": s.error,
            })
        })
        .collect();
    Json(json!({
        "cursors": cursors,
        "signals": signals,
        "write": config.http.console_write,
        "tables": config.outbox.iter().map(relay_core::route::OutboxTableConfig::display_name).collect::<Vec<_>>(),
    }))
    .into_response()
}

pub(super) async fn config(Extension(console): Extension<Arc<Console>>) -> Response {
    match relay_runtime::config::flattened(&console.config) {
        Ok(lines) => Json(json!({ "lines": lines })).into_response(),
        Err(e) => failed(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// `trace/{event_id}`, by name.
#[derive(Debug, Deserialize)]
pub(super) struct TraceOf {
    event_id: String,
}

pub(super) async fn trace(
    Extension(console): Extension<Arc<Console>>,
    Path(TraceOf { event_id }): Path<TraceOf>,
) -> Response {
    let options = TraceOptions {
        since: None,
        max_scan: 1_000_000,
        timeout: Duration::from_secs(10),
        ledger_url: None,
        parked_subjects: Vec::new(),
    };
    match relay_ops::trace::trace(&console.config, &event_id, &options).await {
        Ok(found) => Json(found).into_response(),
        Err(f) if f.kind == relay_runtime::failure::FailureKind::Config => {
            failed(StatusCode::BAD_REQUEST, f.error)
        }
        Err(f) => failed(StatusCode::BAD_GATEWAY, f.error),
    }
}
