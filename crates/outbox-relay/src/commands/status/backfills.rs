//! `status`' backfills as lines: where each `outbox-relay backfill` (and the relay's backfill at
//! slot creation) of this slot is, from `relay_ops::status`.

use relay_ops::status::report::{BackfillReport, BackfillState, Section};

use super::{float, opt};

/// One line per backfill; nothing when none ever ran.
pub(super) fn backfill_lines(b: &Section<Vec<BackfillReport>>) -> Vec<String> {
    match b.as_result() {
        Err(e) => vec![format!("backfills: {e}")],
        Ok(backfills) => backfills.iter().map(backfill_line).collect(),
    }
}

fn backfill_line(f: &BackfillReport) -> String {
    let of = match (f.rows_estimate, f.percent) {
        (Some(total), Some(pct)) => format!(" of ~{total} ({pct:.0}%)"),
        _ => String::new(),
    };
    let filter = f
        .filter
        .as_ref()
        .map(|w| format!(" where {w}"))
        .unwrap_or_default();
    let kind = if f.on_create {
        " (at slot creation)"
    } else {
        ""
    };
    let ago = float(f.updated_seconds_ago);
    let when = match f.state {
        BackfillState::Finished => format!("finished {}", opt(&f.finished_at)),
        BackfillState::Stopped => format!(
            "STOPPED: no progress for {ago}s; run the same `outbox-relay backfill` again to resume at key {}",
            opt(&f.last_key)
        ),
        BackfillState::Running => {
            format!("running, cursor at key {} ({ago}s ago)", opt(&f.last_key))
        }
    };
    format!(
        "backfill {}{filter}{kind}: {} rows done{of}, started {}; {when}",
        f.table, f.rows_done, f.started_at,
    )
}
