//! What the console changes (`[http] console_write = true`): each change is a signal row
//! (`requested_by = 'console'`) that the relay's signal worker carries out and reports on, as
//! one inserted from SQL would be: a backfill or a replay asked for on the page
//! ([`signal`]), or dead letters re-published ([`republish`]).
//!
//! Re-publishing dead letters: a dead-lettered
//! row is published again by reading it from its outbox table, as it is now, through the relay's
//! pipeline: a `backfill` signal whose filter is the rows' event ids. So the fix is wherever the
//! cause was (an `UPDATE` of the row, or a mapping changed and the relay restarted), the signal
//! row records who asked and how it ended, and a row that still cannot be routed is
//! dead-lettered again (under the same id: JetStream keeps one copy).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use outbox_contract::{HEADER_MSG_ID, HEADER_TABLE};
use serde::Deserialize;
use serde_json::{Value, json};

use super::api::{WINDOW, failed, unreachable};
use super::{Console, messages};

/// Which dead letters to publish again.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RepublishRequest {
    /// Their stream sequences.
    #[serde(default)]
    sequences: Vec<u64>,
    /// Every dead letter the console lists.
    #[serde(default)]
    all: bool,
}

/// One dead letter as a row to read again: its table and event id.
#[derive(Debug, PartialEq, Eq)]
struct RowRef {
    table: String,
    event_id_column: String,
    event_id: String,
}

/// What `header` of `m` says, if anything.
fn header<'a>(m: &'a messages::Shown, name: &str) -> Option<&'a str> {
    m.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The row a dead letter stands for, or why it cannot be re-published from its table.
fn row_of(console: &Console, m: &messages::Shown) -> Result<RowRef, String> {
    let id = header(m, HEADER_MSG_ID).unwrap_or_default();
    if id.starts_with("dlq:collision:") || id.starts_with("dlq:message:") {
        return Err(format!(
            "sequence {}: not a row that could not be routed ({id}): nothing to read again from a table",
            m.seq
        ));
    }
    let table = header(m, HEADER_TABLE)
        .ok_or_else(|| format!("sequence {}: no {HEADER_TABLE} header", m.seq))?;
    let mapping = relay_runtime::table_backfill::mapping(&console.config, table)
        .map_err(|f| format!("sequence {}: {}", m.seq, f.error))?;
    let row: Value = serde_json::from_str(&m.payload)
        .map_err(|e| format!("sequence {}: the dead letter is not a JSON row: {e}", m.seq))?;
    let event_id = row
        .get(&mapping.event_id)
        .and_then(Value::as_str)
        .ok_or_else(|| {
            format!(
                "sequence {}: the row has no event id in column `{}`",
                m.seq, mapping.event_id
            )
        })?;
    Ok(RowRef {
        table: table.to_owned(),
        event_id_column: mapping.event_id.clone(),
        event_id: event_id.to_owned(),
    })
}

/// The refusal of a change while the console is read-only.
fn read_only(console: &Console) -> Option<Response> {
    (!console.config.http.console_write).then(|| {
        failed(
            StatusCode::FORBIDDEN,
            "the console is read-only: set [http] console_write = true (with console_token_file) to change anything from it",
        )
    })
}

/// A signal asked for on the page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SignalAsked {
    kind: String,
    args: Value,
}

/// Inserts a `backfill` or `replay` signal for this relay, after checking its arguments as the
/// relay will (a bad one is refused here, 400, instead of becoming a failed row).
pub(super) async fn signal(
    Extension(console): Extension<Arc<Console>>,
    Json(asked): Json<SignalAsked>,
) -> Response {
    if let Some(refused) = read_only(&console) {
        return refused;
    }
    if !matches!(asked.kind.as_str(), "backfill" | "replay") {
        return failed(
            StatusCode::BAD_REQUEST,
            format!(
                "the console starts a backfill or a replay, not `{}`",
                asked.kind
            ),
        );
    }
    let args = asked.args.to_string();
    if let Err(why) = relay_runtime::signal::parse(&asked.kind, &args, std::time::SystemTime::now())
    {
        return failed(StatusCode::BAD_REQUEST, why);
    }
    let config = &console.config;
    let inserted = async {
        let client = relay_postgres::connect(&config.postgres).await?;
        let id = relay_backfill::signal::insert_signal(
            &client,
            &asked.kind,
            &args,
            &config.postgres.slot,
            "console",
        )
        .await?;
        anyhow::Ok(id)
    };
    match inserted.await {
        Ok(id) => {
            tracing::info!(signal = id, kind = %asked.kind, "console: signal requested");
            Json(json!({ "id": id })).into_response()
        }
        Err(e) => unreachable(e),
    }
}

pub(super) async fn republish(
    Extension(console): Extension<Arc<Console>>,
    Json(request): Json<RepublishRequest>,
) -> Response {
    if let Some(refused) = read_only(&console) {
        return refused;
    }
    let Some(subject) = console.config.relay.dead_letter_subject.clone() else {
        return failed(StatusCode::CONFLICT, "no [relay] dead_letter_subject");
    };
    if !request.all && request.sequences.is_empty() {
        return failed(
            StatusCode::BAD_REQUEST,
            "give \"sequences\": [..] or \"all\": true",
        );
    }
    let js = match console.jetstream().await {
        Ok(js) => js,
        Err(e) => return unreachable(e),
    };
    let stream = &console.config.nats.stream;
    let listing = match messages::latest(js, stream, Some(&subject), 500, WINDOW).await {
        Ok(listing) => listing,
        Err(e) => return unreachable(e),
    };
    let mut skipped: Vec<String> = request
        .sequences
        .iter()
        .filter(|seq| !listing.messages.iter().any(|m| m.seq == **seq))
        .map(|seq| format!("sequence {seq}: not a dead letter among the latest listed"))
        .collect();
    let mut by_table: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for listed in listing
        .messages
        .iter()
        .filter(|m| request.all || request.sequences.contains(&m.seq))
    {
        // The listing holds a preview of each payload: the row is read whole.
        let whole = match messages::one(js, stream, listed.seq).await {
            Ok(Some(whole)) => whole,
            Ok(None) => {
                skipped.push(format!("sequence {}: no longer in the stream", listed.seq));
                continue;
            }
            Err(e) => return unreachable(e),
        };
        let m = &whole;
        match row_of(&console, m) {
            Ok(row) => by_table
                .entry((row.table, row.event_id_column))
                .or_default()
                .push(row.event_id),
            Err(why) => skipped.push(why),
        }
    }
    match signal_each(&console, by_table).await {
        Ok(signals) => Json(json!({ "signals": signals, "skipped": skipped })).into_response(),
        Err(e) => unreachable(e),
    }
}

/// One `backfill` signal per table, of the rows with those event ids.
async fn signal_each(
    console: &Console,
    by_table: BTreeMap<(String, String), Vec<String>>,
) -> anyhow::Result<Vec<Value>> {
    let config = &console.config;
    let client = relay_postgres::connect(&config.postgres).await?;
    let mut signals = Vec::new();
    for ((table, column), mut ids) in by_table {
        ids.sort();
        ids.dedup();
        let args = json!({
            "table": table,
            "where": relay_backfill::event_id_filter(&column, &ids),
            // A filter re-published before has a finished cursor: run it again.
            "restart": true,
        });
        let id = relay_backfill::signal::insert_signal(
            &client,
            "backfill",
            &args.to_string(),
            &config.postgres.slot,
            "console",
        )
        .await?;
        tracing::info!(signal = id, table = %table, rows = ids.len(), "console: re-publish of dead letters requested");
        signals.push(json!({ "id": id, "table": table, "rows": ids.len() }));
    }
    Ok(signals)
}
