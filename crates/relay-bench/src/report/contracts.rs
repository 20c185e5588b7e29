//! The contracts rows: catch-up and the relay's CPU per event with event contracts on, against
//! the same backlog with them off, alternating runs.

use std::fmt::Write as _;

use crate::measure::micros_per_event;
use crate::workload::{
    CONTRACTS_PER_TX, CONTRACTS_RATIO_TARGET, ContractsRun, ContractsScenario, median_by,
};

/// A figure of one run.
type Figure = fn(&ContractsRun, u64) -> f64;

/// The catch-up row and the CPU row; nothing when the rows did not run.
pub(super) fn rows(out: &mut String, scenario: Option<&ContractsScenario>) {
    let Some(sc) = scenario else {
        return;
    };
    let events_per_s: Figure = |r, _| r.relay.events_per_s;
    let cpu_us: Figure = |r, rows| micros_per_event(r.relay.cpu_secs, rows);
    let setup = format!(
        "{} events in {CONTRACTS_PER_TX}-row txs (written in {:.1} s, {:.0} MB WAL), each checked against a 10-property JSON Schema (`{}`, {}-byte payloads)",
        sc.rows,
        sc.write_secs,
        sc.wal_bytes as f64 / 1e6,
        sc.contract_key,
        sc.payload_bytes
    );
    // Catch-up: how much longer a drain takes with contracts on, as off/on events per second.
    let Some(catch_up) = Compared::of(sc, events_per_s, |off, on| off / on) else {
        return;
    };
    let drain = |on: bool| {
        median_by(sc.side(on), |r| r.relay.events_per_s).map_or_else(
            || "–".to_owned(),
            |r| {
                let secs = r.relay.last_stored_secs - r.relay.first_stored_secs;
                if sc.rows < 2 || secs <= 0.0 {
                    "–".to_owned()
                } else {
                    format!("{:.0}/s", (sc.rows - 1) as f64 / secs)
                }
            },
        )
    };
    let _ = writeln!(
        out,
        "| **Event contracts on, catch-up**, {setup}; runs off: {} /s, on: {} /s | {:.0}/s on vs {:.0}/s off (first to last stored: {} on, {} off) | contracts off, same backlog, alternating | off/on {} | <= {CONTRACTS_RATIO_TARGET}x (within 15 % of off) | {} |",
        catch_up.spread_off,
        catch_up.spread_on,
        catch_up.on,
        catch_up.off,
        drain(true),
        drain(false),
        catch_up.ratio_text(),
        super::verdict(catch_up.ratio <= CONTRACTS_RATIO_TARGET),
    );
    let Some(cpu) = Compared::of(sc, cpu_us, |off, on| on / off) else {
        return;
    };
    let _ = writeln!(
        out,
        "| **Event contracts on, relay CPU per event**, the same runs (start-up included); runs off: {} µs, on: {} µs | {:.2} µs on vs {:.2} µs off | contracts off, same backlog, alternating | on/off {} | <= {CONTRACTS_RATIO_TARGET}x (within 15 % of off) | {} |",
        cpu.spread_off,
        cpu.spread_on,
        cpu.on,
        cpu.off,
        cpu.ratio_text(),
        super::verdict(cpu.ratio <= CONTRACTS_RATIO_TARGET),
    );
}

/// One figure on both sides: each side's median run and every run (the spread), and the
/// median of each round's ratio.
struct Compared {
    off: f64,
    on: f64,
    spread_off: String,
    spread_on: String,
    ratio: f64,
    /// Every round's ratio, in the order the rounds ran.
    rounds: Vec<f64>,
}

impl Compared {
    /// `figure` of each run; `ratio(off, on)` of each round, the cost of contracts (> 1: on is
    /// worse).
    fn of(sc: &ContractsScenario, figure: Figure, ratio: fn(f64, f64) -> f64) -> Option<Self> {
        let value = |r: &ContractsRun| figure(r, sc.rows);
        let side = |on: bool| -> Vec<f64> { sc.side(on).into_iter().map(value).collect() };
        let spread = |values: &[f64]| {
            values
                .iter()
                .map(|v| {
                    if *v >= 100.0 {
                        format!("{v:.0}")
                    } else {
                        format!("{v:.2}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (off, on) = (side(false), side(true));
        let rounds: Vec<f64> = sc
            .pairs()
            .into_iter()
            .map(|(off, on)| ratio(value(off), value(on)))
            .collect();
        Some(Self {
            spread_off: spread(&off),
            spread_on: spread(&on),
            off: median_by(off, |v| *v)?,
            on: median_by(on, |v| *v)?,
            ratio: median_by(rounds.clone(), |v| *v)?,
            rounds,
        })
    }

    /// `1.06x (median of 3 rounds: 1.04x, 1.06x, 1.09x)`.
    fn ratio_text(&self) -> String {
        let each: Vec<String> = self.rounds.iter().map(|r| format!("{r:.2}x")).collect();
        format!(
            "{:.2}x (median of {} rounds: {})",
            self.ratio,
            self.rounds.len(),
            each.join(", ")
        )
    }
}

/// How the contracts rows were measured, when they ran.
pub(super) fn note(out: &mut String, scenario: Option<&ContractsScenario>) {
    if scenario.is_none() {
        return;
    }
    let _ = writeln!(
        out,
        "Event contracts: one backlog of the bench table in {CONTRACTS_PER_TX}-row txs whose payload has 10 properties (the bench payload's 7 plus `status`, `channel`, `country`, a shorter `note`), caught up by the relay once per side and round, contracts off then on, each run timed as the catch-up rows. Both sides configure the same `[[outbox]]` entry; \"on\" adds `[outbox.contracts] types = {{ OrderCreated = <crates/relay-bench/contracts/bench-order-created.json> }}` (10 typed, required properties, `additionalProperties: false`, minimum/maxLength/enum/pattern). After each run the stream is read back: with contracts on every message must name the contract in `Outbox-Schema`, with them off none may. Each round's ratio compares the two runs of that round (off/on events per second; on/off CPU per event); the median of the rounds' ratios is judged, every run's figure is listed."
    );
}
