//! `status`' backfills: where each `outbox-relay backfill` (and the relay's backfill at slot
//! creation) of this slot is, from its cursor in `outbox_relay.backfill`.

use relay_postgres::backfill::{CursorStatus, list_cursors};
use serde_json::{Value, json};

use super::text;

/// A cursor that has not moved for this long while unfinished is reported as stopped: the
/// backfill stores its cursor every checkpoint interval while it runs.
const STOPPED_AFTER_SECS: f64 = 60.0;

/// The backfills of `slot` as JSON (an `error` object when they cannot be read).
pub(super) async fn backfills_state(client: &tokio_postgres::Client, slot: &str) -> Value {
    match list_cursors(client, slot).await {
        Ok(cursors) => Value::Array(cursors.iter().map(to_json).collect()),
        Err(e) => json!({ "error": format!("cannot read the backfills: {e}") }),
    }
}

fn to_json(c: &CursorStatus) -> Value {
    let cursor = &c.cursor;
    let state = match (&cursor.finished_at, c.updated_secs_ago) {
        (Some(_), _) => "finished",
        (None, ago) if ago > STOPPED_AFTER_SECS => "stopped",
        (None, _) => "running",
    };
    json!({
        "table": c.id.table,
        "filter": (!c.id.filter.is_empty()).then_some(&c.id.filter),
        "on_create": cursor.on_create,
        "state": state,
        "rows_done": cursor.rows_done,
        "rows_estimate": cursor.rows_estimate,
        "percent": cursor.rows_estimate.filter(|t| *t > 0).map(|total| {
            (cursor.rows_done as f64 * 100.0 / total as f64).min(100.0).round()
        }),
        "key_column": cursor.key_column,
        "last_key": cursor.last_key,
        "end_key": cursor.end_key,
        "started_at": cursor.started_at,
        "finished_at": cursor.finished_at,
        "updated_seconds_ago": c.updated_secs_ago.round(),
    })
}

/// One line per backfill; nothing when none ever ran.
pub(super) fn print_backfills(b: &Value) {
    if let Some(e) = b.get("error") {
        println!("backfills: {}", text(e));
        return;
    }
    for f in b.as_array().into_iter().flatten() {
        let of = match (f["rows_estimate"].as_i64(), f["percent"].as_f64()) {
            (Some(total), Some(pct)) => format!(" of ~{total} ({pct:.0}%)"),
            _ => String::new(),
        };
        let filter = f["filter"]
            .as_str()
            .map(|w| format!(" where {w}"))
            .unwrap_or_default();
        let kind = if f["on_create"].as_bool() == Some(true) {
            " (at slot creation)"
        } else {
            ""
        };
        let when = match f["state"].as_str() {
            Some("finished") => format!("finished {}", text(&f["finished_at"])),
            Some("stopped") => format!(
                "STOPPED: no progress for {}s; run the same `outbox-relay backfill` again to resume at key {}",
                text(&f["updated_seconds_ago"]),
                text(&f["last_key"])
            ),
            _ => format!(
                "running, cursor at key {} ({}s ago)",
                text(&f["last_key"]),
                text(&f["updated_seconds_ago"])
            ),
        };
        println!(
            "backfill {}{filter}{kind}: {} rows done{of}, started {}; {when}",
            text(&f["table"]),
            text(&f["rows_done"]),
            text(&f["started_at"]),
        );
    }
}
