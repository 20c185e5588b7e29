//! `status`' backfills as lines: where each `outbox-relay backfill` (and the relay's backfill at
//! slot creation) of this slot is, from `relay_ops::status`.

use serde_json::Value;

use super::text;

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
