//! The restore row: `outbox-relay restore` of a purged window against the relay's
//! catch-up of the same backlog.

use std::fmt::Write as _;

use crate::measure::micros_per_event;
use crate::workload::RestoreRun;

use super::verdict;

/// Restore's rate over the catch-up's, at least.
const RATIO_TARGET: f64 = 0.9;

pub(super) fn row(out: &mut String, r: &RestoreRun) {
    let problem = r
        .problem
        .as_deref()
        .map(|p| format!("; **{p}**"))
        .unwrap_or_default();
    let ratio = r.ratio();
    let _ = writeln!(
        out,
        "| **Restore**, {} events in 100-row txs ({:.0} MB WAL), stream purged (`outbox-relay restore --from-lsn`, --max-in-flight {}; {:.2} s process wall time, {:.2} CPU µs/event){problem} | {:.0}/s | catch-up of the same backlog {:.0}/s ({:.2} s, max_in_flight {}, {:.2} CPU µs/event) | {:.0}% | >= 90% | {} |",
        r.events,
        r.wal_bytes as f64 / 1e6,
        r.max_in_flight,
        r.secs,
        micros_per_event(r.cpu_secs, r.events),
        r.events_per_s,
        r.catch_up.events_per_s,
        r.catch_up.secs,
        r.catch_up.max_in_flight,
        micros_per_event(r.catch_up.cpu_secs, r.events),
        ratio * 100.0,
        verdict(ratio >= RATIO_TARGET && r.problem.is_none()),
    );
}

pub(super) fn note(out: &mut String, r: Option<&RestoreRun>) {
    if r.is_some() {
        let _ = writeln!(
            out,
            "Restore: a fresh backlog in 100-row transactions; the relay catches up on it with `replay_retention = \"4GB\"` (so its slot keeps the backlog's WAL) and a 1 s duplicate_window, timed as the catch-up rows (spawn until the checkpoint is past the last transaction), then stopped; the stream is purged, 2 s pass (past the duplicate window, which a purge does not clear), and `outbox-relay restore --from-lsn <insert LSN before the first event>` (the catch-up's max_in_flight) is timed from spawn to exit, start-up, slot copy, stream scan and dropping the copy included. Then the stream must hold every event of the table exactly once (by Nats-Msg-Id), and the main slot's confirmed_flush_lsn and the stored checkpoint must be what they were before the restore."
        );
    }
}
