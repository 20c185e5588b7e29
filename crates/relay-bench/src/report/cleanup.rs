//! Cleanup rows: `[outbox.cleanup]` beside a steady load, per mode, against the run
//! without cleanup on the same kind of table.

use std::fmt::Write as _;

use crate::workload::{CleanupMode, CleanupRun};

use super::verdict;

const MB: f64 = 1e6;

fn settings(r: &CleanupRun) -> String {
    let t = r.timing;
    match r.mode {
        CleanupMode::Off | CleanupMode::OffPartitioned => "no cleanup".into(),
        CleanupMode::Delete => format!(
            "retain {}s, interval {}s, batch_size {}",
            t.retain_secs, t.interval_secs, t.batch_size
        ),
        CleanupMode::Mark => format!(
            "sent_at_column published_at, retain 0s, delete_after {}s, interval {}s, batch_size {}",
            t.retain_secs, t.interval_secs, t.batch_size
        ),
        CleanupMode::DropPartitions => format!(
            "partitions of {}s, retain {}s, interval {}s",
            t.partition_secs, t.retain_secs, t.interval_secs
        ),
    }
}

pub(super) fn rows(out: &mut String, runs: &[CleanupRun], failed: &[String]) {
    for f in failed {
        let f = f.lines().next().unwrap_or("").replace('|', "/");
        let _ = writeln!(out, "| **Cleanup {f}** | failed | | | | FAIL |");
    }
    for r in runs {
        let base = runs.iter().find(|b| {
            b.mode.is_off() && b.mode.partitioned() == r.mode.partitioned() && !r.mode.is_off()
        });
        let table = if r.mode.partitioned() {
            "outbox_part (partitioned)"
        } else {
            "outbox"
        };
        let figure = format!(
            "relay {:.0}/s; p50 {:.1} ms, p99 {:.1} ms (max {:.0})",
            r.relay_rate, r.p50_ms, r.p99_ms, r.max_ms
        );
        let (limit, ratio, target, result) = match base {
            Some(b) => {
                let rate = r.relay_rate / b.relay_rate;
                let p99 = r.p99_ms / b.p99_ms;
                (
                    format!(
                        "without cleanup: relay {:.0}/s, p99 {:.1} ms",
                        b.relay_rate, b.p99_ms
                    ),
                    format!("rate {:.0}%, p99 {:.2}x", rate * 100.0, p99),
                    "within 10%",
                    verdict(rate >= 0.9 && p99 <= 1.1),
                )
            }
            None => (String::new(), String::new(), "(baseline)", "–"),
        };
        let _ = writeln!(
            out,
            "| **Cleanup {}**, {table}: load {}/s for {} s (achieved {:.0}/s, {} events; {}) | {figure} | {limit} | {ratio} | {target} | {result} |",
            r.mode.as_str(),
            r.target_rate,
            r.secs,
            r.achieved,
            r.events,
            settings(r),
        );
        let flat_target = if r.mode.is_off() {
            "(reported)"
        } else {
            "flat: 2nd-half max <= 1.2x 1st-half max"
        };
        let flat = if r.mode.is_off() {
            "–"
        } else {
            verdict(r.growth() <= 1.2)
        };
        let _ = writeln!(
            out,
            "| Table size, cleanup {}: start / middle / end ({} samples) | {:.1} / {:.1} / {:.1} MB; 2nd half {:+.1} MB/min | {} rows cleaned, {} left | 2nd/1st-half max {:.2}x | {flat_target} | {flat} |",
            r.mode.as_str(),
            r.sizes.len(),
            r.size_at(0.0) as f64 / MB,
            r.size_at(0.5) as f64 / MB,
            r.size_at(1.0) as f64 / MB,
            r.slope_mb_per_min(),
            r.cleaned,
            r.rows_left,
            r.growth(),
        );
    }
}

pub(super) fn note(out: &mut String, runs: &[CleanupRun]) {
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Cleanup: per mode a fresh slot and relay with that `[outbox.cleanup]` (none for off), {}-row transactions at the target rate (in rows) over 2 connections; relay rate = events / (load start → the last one stored); latency as above over every event of the load; size = pg_total_relation_size over the table's partitions (and partitions detached, not yet dropped), sampled through the load; autovacuum on (naptime 10s) during these runs only. mark sets published_at at once and deletes rows older than the retain (delete_after), as a polling relay's cleanup job would.",
        runs[0].rows_per_tx
    );
}
