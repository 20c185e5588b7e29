//! The machine's CPU beside each catch-up: on 2 cores the relay, its walsender and
//! nats-server share the machine, so a catch-up can be bound by the cores, not by the relay.

use std::fmt::Write as _;

use super::variant_note;
use crate::measure::{CpuBudget, micros_per_event};
use crate::workload::Scenario;

/// Where the machine's CPU went in each run of one backlog: the relay's catch-ups against the
/// two limit runs, so a catch-up bound by the cores it shares shows as such.
pub(super) fn machine_rows(out: &mut String, sc: &Scenario) {
    let limits: Vec<String> = [
        ("decode limit run", &sc.decode_budget),
        ("broker limit run", &sc.broker_budget),
    ]
    .into_iter()
    .filter_map(|(name, b)| {
        b.as_ref()
            .map(|b| format!("{name}: {}", budget_text(b, sc.rows)))
    })
    .collect();
    for r in &sc.relays {
        let Some(b) = &r.budget else { continue };
        let _ = writeln!(
            out,
            "| Machine CPU, catch-up of {}, max_in_flight {}{} | {} | {} | | – | – |",
            sc.label,
            r.max_in_flight,
            variant_note(r),
            budget_text(b, sc.rows),
            limits.join("; "),
        );
    }
}

/// A run's CPU per event by process, their sum, and the cores kept busy (every process of the
/// machine counted), e.g. "relay 3.8 + walsender 4.1 + nats-server 5.0 = 12.9 µs/event, 1.93
/// of 2 cores busy".
fn budget_text(b: &CpuBudget, events: u64) -> String {
    let us = |secs: f64| micros_per_event(secs, events);
    let parts: Vec<String> = b
        .processes
        .iter()
        .map(|(name, cpu)| match cpu {
            Some(c) => format!("{name} {:.1}", us(*c)),
            None => format!("{name} ?"),
        })
        .collect();
    let sum: f64 = b.processes.iter().filter_map(|(_, c)| *c).sum();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let busy = b.busy_cores().map_or_else(
        || "cores busy not measured".to_owned(),
        |c| format!("{c:.2} of {cores} cores busy"),
    );
    format!("{} = {:.1} µs/event, {busy}", parts.join(" + "), us(sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_reads_per_event_and_says_what_was_not_read() {
        let budget = CpuBudget {
            wall_secs: 2.0,
            machine_secs: Some(3.0),
            processes: vec![
                ("relay", Some(0.4)),
                ("walsender", None),
                ("nats-server", Some(1.0)),
            ],
        };
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        assert_eq!(
            budget_text(&budget, 100_000),
            format!(
                "relay 4.0 + walsender ? + nats-server 10.0 = 14.0 µs/event, 1.50 of {cores} cores busy"
            )
        );
        let unread = CpuBudget {
            machine_secs: None,
            ..budget
        };
        assert!(budget_text(&unread, 100_000).ends_with("cores busy not measured"));
    }
}
