//! The console row: the relay's CPU per event with the console open beside it off.

use std::fmt::Write as _;

use crate::workload::{CONSOLE_RATE, ConsoleRun, median_by};

/// The console's allowance: CPU per event with it open, against off.
const RATIO_TARGET: f64 = 1.02;

/// One row: the median run of each side, their ratio, and every run's figure (the spread).
pub(super) fn row(out: &mut String, runs: &[ConsoleRun]) {
    let side = |open: bool| -> Vec<ConsoleRun> {
        runs.iter()
            .filter(|r| r.console_open == open)
            .cloned()
            .collect()
    };
    let (off, open) = (side(false), side(true));
    let spread = |runs: &[ConsoleRun]| {
        runs.iter()
            .map(|r| format!("{:.2}", r.cpu_us_per_event()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (spread_off, spread_open) = (spread(&off), spread(&open));
    let requests: u64 = open.iter().map(|r| r.requests).sum();
    let (Some(off_median), Some(open_median)) = (
        median_by(off, ConsoleRun::cpu_us_per_event),
        median_by(open, ConsoleRun::cpu_us_per_event),
    ) else {
        return;
    };
    let ratio = open_median.cpu_us_per_event() / off_median.cpu_us_per_event();
    let _ = writeln!(
        out,
        "| **Console open and refreshing**, relay CPU per event, 1-row txs at {CONSOLE_RATE}/s ({} events per run; runs off: {spread_off} µs, open: {spread_open} µs; {requests} console requests) | {:.2} µs open vs {:.2} µs off: {ratio:.3}x | | | <= {RATIO_TARGET}x off | {} |",
        off_median.events,
        open_median.cpu_us_per_event(),
        off_median.cpu_us_per_event(),
        super::verdict(ratio <= RATIO_TARGET)
    );
}
