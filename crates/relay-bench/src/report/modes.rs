//! Publish-mode rows: publish modes side by side, the emit-message outbox beside the table
//! outbox, and 1/2/4 sharded slots.

use std::fmt::Write as _;

use crate::measure::micros_per_event;
use crate::workload::{
    ModeAb, ModeOutcome, ModeScenario, PublishModeArg, RelayRun, Results, SLOTS_PER_TX, median_by,
};

use super::{cpu_target_us, verdict};

/// Every publish-mode, emit-message and slots row of `res`, in the order they ran.
pub(super) fn rows(out: &mut String, res: &Results) {
    for sc in &res.modes {
        mode_rows(out, sc, res.relay_startup_cpu_secs);
        ab_rows(out, sc);
    }
    latency_rows(out, res);
    for m in &res.messages {
        let table = &m.table.relay;
        let emit = &m.emit.relay;
        let _ = writeln!(
            out,
            "| **Emit-message outbox, {}** (pg_logical_emit_message through outbox_relay.emit_event, one `[[messages]]` entry; written in {:.1} s, {:.0} MB WAL; relayed in {:.2} s) | {:.0}/s, {:.2} CPU µs/event | table outbox {:.0}/s, {:.2} CPU µs/event (written in {:.1} s, {:.0} MB WAL) | {:.2}x the table outbox | – (reported) | – |",
            m.label,
            m.emit.write_secs,
            m.emit.wal_bytes as f64 / 1e6,
            emit.secs,
            emit.events_per_s,
            micros_per_event(emit.cpu_secs, m.rows),
            table.events_per_s,
            micros_per_event(table.cpu_secs, m.rows),
            m.table.write_secs,
            m.table.wal_bytes as f64 / 1e6,
            emit.events_per_s / table.events_per_s,
        );
    }
    let single = res.slots.iter().find(|s| s.slots == 1);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    for s in &res.slots {
        let _ = writeln!(
            out,
            "| **{} slot(s)**: {} relay(s){}, {} rows in {SLOTS_PER_TX}-row txs ({:.2} s; CPU s: relays {:.2}, walsenders {:.2}, nats-server {:.2} = {:.2} of {cores} cores busy; largest relay RSS {:.1} MB) | {:.0}/s in all | {} | {} | – (reported) | – |",
            s.slots,
            s.slots,
            if s.slots > 1 {
                ", hash-sharded by aggregateid"
            } else {
                ""
            },
            s.rows,
            s.secs,
            s.relays_cpu_secs,
            s.walsenders_cpu_secs,
            s.nats_cpu_secs,
            s.busy_cores(),
            s.max_relay_rss as f64 / super::MB,
            s.events_per_s,
            single.map_or_else(
                || "–".into(),
                |one| format!("1 slot {:.0}/s", one.events_per_s)
            ),
            single.map_or_else(
                || "–".into(),
                |one| format!("{:.2}x one slot", s.events_per_s / one.events_per_s)
            ),
        );
    }
}

/// One backlog's catch-up per mode, each against the per-message run of the same backlog.
fn mode_rows(out: &mut String, sc: &ModeScenario, startup_cpu: Option<f64>) {
    let per_message = sc.runs.iter().find_map(|(mode, o)| match o {
        ModeOutcome::Ran { run, .. } if *mode == PublishModeArg::PerMessage => Some(run),
        _ => None,
    });
    let target = cpu_target_us(sc.per_tx);
    for (mode, outcome) in &sc.runs {
        let name = format!("**Publish mode {}, {}**", mode.as_config(), sc.label);
        match outcome {
            ModeOutcome::Skipped(why) => {
                let _ = writeln!(out, "| {name} | {why} | | | – | – |");
            }
            ModeOutcome::Failed(e) => {
                let _ = writeln!(out, "| {name} | failed: {} | | | – | FAIL |", first_line(e));
            }
            ModeOutcome::Ran { run, fell_back } => {
                let (cpu, steady) = cpu_us(run, sc.rows, startup_cpu);
                let note = if *fell_back {
                    "; the relay fell back to per-message, see its log"
                } else {
                    ""
                };
                let beside = Beside {
                    name: &name,
                    note,
                    run,
                    rows: sc.rows,
                    startup_cpu,
                    baseline: per_message
                        .filter(|_| *mode != PublishModeArg::PerMessage)
                        .map(|p| ("per-message", p)),
                    target: &format!("CPU <= {target:.0} µs/event"),
                    pass: steady.unwrap_or(cpu) <= target,
                };
                beside.row(out);
            }
        }
    }
}

/// The A/B target: the medians of the rounds' ratios, this build against `--compare-bin`, within
/// what one run swings on this machine (docs/benchmarks.md, "Noise").
const AB_MIN_RATE: f64 = 0.95;
const AB_MAX_CPU: f64 = 1.05;

/// With `--compare-bin`: per mode, this build against the other on the same backlog, each
/// round's ratio of events/s and of CPU per event, and their medians.
fn ab_rows(out: &mut String, sc: &ModeScenario) {
    for (mode, ab) in &sc.compared {
        ab_row(out, sc, *mode, ab);
    }
}

/// One mode's A/B row.
fn ab_row(out: &mut String, sc: &ModeScenario, mode: PublishModeArg, ab: &ModeAb) {
    let name = format!("**A/B publish mode {}, {}**", mode.as_config(), sc.label);
    let pairs: Vec<(&RelayRun, &RelayRun)> = ab.relay.iter().zip(&ab.compare).collect();
    let rates: Vec<f64> = pairs
        .iter()
        .map(|(a, b)| a.events_per_s / b.events_per_s)
        .collect();
    let cpus: Vec<f64> = pairs.iter().map(|(a, b)| a.cpu_secs / b.cpu_secs).collect();
    let (Some(rate), Some(cpu)) = (
        median_by(rates.clone(), |r| *r),
        median_by(cpus.clone(), |c| *c),
    ) else {
        let _ = writeln!(
            out,
            "| {name} | no pair of runs (see the log above) | | | – | FAIL |"
        );
        return;
    };
    let median_run = |runs: &[RelayRun]| median_by(runs.to_vec(), |r| r.secs);
    let (Some(this), Some(other)) = (median_run(&ab.relay), median_run(&ab.compare)) else {
        return;
    };
    let each = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let _ = writeln!(
        out,
        "| {name} (this build, then `--compare-bin`, on the same backlog; {} round(s)) | {:.0}/s, {:.2} CPU µs/event | `--compare-bin` {:.0}/s, {:.2} CPU µs/event | events/s {}x (median {rate:.2}x); CPU per event {}x (median {cpu:.2}x) | events/s ≥ {AB_MIN_RATE:.2}x, CPU ≤ {AB_MAX_CPU:.2}x (medians) | {} |",
        pairs.len(),
        this.events_per_s,
        micros_per_event(this.cpu_secs, sc.rows),
        other.events_per_s,
        micros_per_event(other.cpu_secs, sc.rows),
        each(&rates),
        each(&cpus),
        verdict(rate >= AB_MIN_RATE && cpu <= AB_MAX_CPU),
    );
}

/// One catch-up run's row beside the baseline run it is compared with (in the same run of the
/// bench): events/s and relay CPU per event of both, and the ratio of their events/s.
pub(super) struct Beside<'a> {
    pub(super) name: &'a str,
    /// After the run's seconds, e.g. that the relay fell back to another mode.
    pub(super) note: &'a str,
    pub(super) run: &'a RelayRun,
    pub(super) rows: u64,
    pub(super) startup_cpu: Option<f64>,
    /// The baseline's name and run; `None`: this run is the baseline.
    pub(super) baseline: Option<(&'a str, &'a RelayRun)>,
    pub(super) target: &'a str,
    pub(super) pass: bool,
}

impl Beside<'_> {
    pub(super) fn row(&self, out: &mut String) {
        let (cpu, steady) = cpu_us(self.run, self.rows, self.startup_cpu);
        let (beside, ratio) = match self.baseline {
            Some((name, base)) => (
                format!(
                    "{name} {:.0}/s, {:.2} CPU µs/event",
                    base.events_per_s,
                    cpu_us(base, self.rows, self.startup_cpu).0
                ),
                format!("{:.2}x {name}", self.run.events_per_s / base.events_per_s),
            ),
            None => (String::new(), "baseline".into()),
        };
        let _ = writeln!(
            out,
            "| {}, max_in_flight {} ({:.2} s{}) | {:.0}/s, {cpu:.2} CPU µs/event{} | {beside} | {ratio} | {} | {} |",
            self.name,
            self.run.max_in_flight,
            self.run.secs,
            self.note,
            self.run.events_per_s,
            steady.map_or_else(String::new, |s| format!(" ({s:.2} without start-up)")),
            self.target,
            verdict(self.pass),
        );
    }
}

/// Commit-to-ack latency per mode against its target (p99 <= 10 ms at 1,000/s).
fn latency_rows(out: &mut String, res: &Results) {
    let per_message_p99 = res.mode_latency.iter().find_map(|(mode, o)| match o {
        ModeOutcome::Ran { run, .. } if *mode == PublishModeArg::PerMessage => Some(run.p99_ms),
        _ => None,
    });
    for (mode, outcome) in &res.mode_latency {
        let name = format!("**Latency, publish mode {}**", mode.as_config());
        match outcome {
            ModeOutcome::Skipped(why) => {
                let _ = writeln!(out, "| {name} | {why} | | | p99 <= 10 ms | – |");
            }
            ModeOutcome::Failed(e) => {
                let _ = writeln!(
                    out,
                    "| {name} | failed: {} | | | p99 <= 10 ms | FAIL |",
                    first_line(e)
                );
            }
            ModeOutcome::Ran { run: l, .. } if l.samples == 0 => {
                let _ = writeln!(
                    out,
                    "| {name} | not run: no events measured (--latency-secs 0) | | | p99 <= 10 ms | – |"
                );
            }
            ModeOutcome::Ran { run: l, fell_back } => {
                let _ = writeln!(
                    out,
                    "| {name}, commit→ack at {}/s (achieved {:.0}/s, {} events{}; relay {:.1} CPU µs/event) | p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms (max {:.1}) | {} | | p99 <= 10 ms | {} |",
                    l.target_rate,
                    l.achieved_rate,
                    l.samples,
                    if *fell_back {
                        "; fell back to per-message"
                    } else {
                        ""
                    },
                    micros_per_event(l.relay_cpu_secs, l.samples as u64),
                    l.p50_ms,
                    l.p99_ms,
                    l.p999_ms,
                    l.max_ms,
                    match per_message_p99 {
                        Some(p) if *mode != PublishModeArg::PerMessage =>
                            format!("per-message p99 {p:.2} ms"),
                        _ => String::new(),
                    },
                    verdict(l.p99_ms <= 10.0)
                );
            }
        }
    }
}

/// µs of relay CPU per event with start-up, and without it when the start-up was measured.
pub(super) fn cpu_us(run: &RelayRun, rows: u64, startup_cpu: Option<f64>) -> (f64, Option<f64>) {
    let total = micros_per_event(run.cpu_secs, rows);
    let steady = startup_cpu.map(|s| micros_per_event((run.cpu_secs - s).max(0.0), rows));
    (total, steady)
}

fn first_line(e: &str) -> String {
    e.lines().next().unwrap_or("").replace('|', "/")
}

/// How the publish-mode, emit-message and slots rows were measured, when any ran.
pub(super) fn note(out: &mut String, res: &Results) {
    if !res.modes.is_empty() || !res.mode_latency.is_empty() {
        let _ = writeln!(
            out,
            "Publish modes: each backlog is written once and caught up by one relay per `[nats] publish_mode` on its own copy of the slot (timed as the catch-up rows, into a fresh stream the relay creates, with allow_atomic in a batch mode); a mode the nats-server cannot do is not run, and a run whose relay logged that it published per message instead says so. Latency per mode: as the latency rows, one relay per mode, 1-row transactions."
        );
    }
    if !res.messages.is_empty() {
        let _ = writeln!(
            out,
            "Emit-message outbox: the same events (subject outbox.Order.OrderCreated, the table rows' payload and three headers) written with `SELECT outbox_relay.emit_event(…)` (migrations/0005, a transactional pg_logical_emit_message each) instead of INSERTs, in transactions of the same size, and relayed through `[[messages]] prefix = \"outbox\"`; the table outbox's row is caught up in the same run just before it."
        );
    }
    if !res.slots.is_empty() {
        let _ = writeln!(
            out,
            "Slots: N relays, each set up by `outbox-relay setup` with its own slot and (N >= 2) a publication filtered to its shard (`[postgres] shard = {{ key = \"aggregateid\", count = N, index = i }}`) before the backlog is written; timed from starting them until every relay's checkpoint is past the last transaction (which holds rows of every shard). CPU: the relays' and walsenders' whole lives, nats-server's over the run. Every walsender decodes the whole WAL and drops the other shards' rows, so decoding work grows with N; on a machine whose cores are already busy, more slots cannot go faster."
        );
    }
}
