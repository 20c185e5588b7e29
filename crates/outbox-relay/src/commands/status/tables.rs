//! `status`' outbox tables: rows, size, the oldest row not yet confirmed, and what cleanup did.

use std::collections::BTreeMap;

use relay_ops::status::report::{Section, TableCleanup, TableReport};

/// One line per outbox table, and one for its cleanup when it has one.
pub(super) fn table_lines(tables: &BTreeMap<String, Section<TableReport>>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, t) in tables {
        let t = match t.as_result() {
            Err(e) => {
                out.push(format!("table {name}: {e}"));
                continue;
            }
            Ok(t) => t,
        };
        let oldest = match t.oldest_unconfirmed_age_seconds {
            Some(age) if age > 0.0 => format!(
                "oldest row not yet confirmed created {}s ago ({})",
                age.round(),
                t.oldest_unconfirmed_measured_by
            ),
            Some(_) => "every row confirmed".to_owned(),
            None => "no created_at column: age of unconfirmed rows unknown".to_owned(),
        };
        out.push(format!(
            "table {name}: about {} rows, {} bytes; {oldest}",
            t.rows_estimate.round(),
            t.size_bytes
        ));
        if let Some(cleanup) = &t.cleanup {
            out.push(cleanup_line(cleanup));
        }
    }
    out
}

fn cleanup_line(cleanup: &TableCleanup) -> String {
    let done = match &cleanup.running {
        Some(running) => format!(
            "{} rows cleaned, {} partitions dropped, {} waiting for the checkpoint, {} failed rounds{}",
            running.rows_cleaned,
            running.partitions_dropped,
            running.waiting_for_checkpoint,
            running.errors,
            running
                .last_error
                .as_ref()
                .map(|e| format!(" (last: {e})"))
                .unwrap_or_default()
        ),
        None => "no running relay to ask what it cleaned".to_owned(),
    };
    format!(
        "  cleanup {} (retain {}s): {done}",
        cleanup.mode, cleanup.retain_seconds
    )
}
