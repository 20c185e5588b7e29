//! `status`' text, section after section, from the typed report.

use relay_ops::status::report::{StatusDoc, StreamState};

use super::{backfills, checks, opt, relay, tables};

/// Every line `status` prints for `doc`; `replay_retention` is `[relay] replay_retention`.
pub(super) fn lines(doc: &StatusDoc, replay_retention: Option<&str>) -> Vec<String> {
    let mut out = slot_lines(doc);
    out.extend(checks::retention_lines(&doc.retention));
    out.extend(checks::replay_window_lines(
        &doc.replay_window,
        replay_retention,
    ));
    out.extend(tables::table_lines(&doc.tables));
    out.extend(backfills::backfill_lines(&doc.backfills));
    out.extend(checks::failover_lines(&doc.failover));
    out.push(checkpoint_line(doc, replay_retention.is_some()));
    out.extend(stream_lines(doc));
    out.extend(relay::relay_lines(doc));
    out
}

fn slot_lines(doc: &StatusDoc) -> Vec<String> {
    let Some(slot) = &doc.slot_state else {
        return vec![format!("slot {}: missing", doc.slot)];
    };
    vec![
        format!(
            "slot {}: wal_status {}, active pid {}",
            doc.slot,
            opt(&slot.wal_status),
            opt(&slot.active_pid)
        ),
        format!(
            "  confirmed_flush_lsn {}, lag {} bytes, retained WAL {} bytes, safe_wal_size {}",
            opt(&slot.confirmed_flush_lsn),
            opt(&slot.lag_bytes),
            opt(&slot.retained_wal_bytes),
            opt(&slot.safe_wal_size)
        ),
    ]
}

/// The stored checkpoint and where the slot is from it; `replay_window` when
/// `[relay] replay_retention` keeps the slot behind on purpose.
fn checkpoint_line(doc: &StatusDoc, replay_window: bool) -> String {
    let Some(c) = &doc.checkpoint else {
        return "checkpoint: none stored".to_owned();
    };
    let relation = match doc.slot_minus_checkpoint_bytes {
        Some(0) => "slot at the checkpoint".to_owned(),
        Some(d) if d < 0 && replay_window => {
            format!("slot {} bytes behind (the replay window)", -d)
        }
        Some(d) if d < 0 => format!("slot {} bytes behind (confirm pending)", -d),
        Some(d) => format!("SLOT AHEAD by {d} bytes"),
        None => "slot position unknown".to_owned(),
    };
    format!(
        "checkpoint {} stored {:.0}s ago; {relation}",
        c.lsn, c.stored_seconds_ago
    )
}

fn stream_lines(doc: &StatusDoc) -> Vec<String> {
    let name = &doc.stream;
    match &doc.stream_state {
        StreamState::Failed { error } => vec![format!("stream {name}: {error}")],
        StreamState::Missing { .. } => vec![format!("stream {name}: missing")],
        StreamState::Found(s) => {
            let mut out = vec![format!(
                "stream {name}: last sequence {}, {} messages",
                s.last_sequence, s.messages
            )];
            out.extend(relay::durability_lines(&s.durability));
            out
        }
    }
}
