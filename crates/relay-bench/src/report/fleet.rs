//! The fleet rows: one process of N pipelines against N single relays, idle and under load,
//! and the isolation of N-1 pipelines from the Nth.

use std::fmt::Write as _;

use crate::workload::{
    FLEET_OF_SINGLES_TARGET, FLEET_RATE, FleetResults, ISOLATION_TARGET, Isolation,
    MIB_PER_PIPELINE_TARGET, PhaseKind, Sessions, Side, Window,
};

use super::verdict;

const MIB: f64 = 1024.0 * 1024.0;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// CPU microseconds per event of `cpu_secs` over a window's events.
fn per_event(cpu_secs: f64, w: &Window) -> f64 {
    cpu_secs * 1e6 / w.events.max(1) as f64
}

fn pss(w: &Window) -> String {
    w.pss
        .map_or_else(|| "PSS –".into(), |p| format!("{:.1} MiB PSS", mib(p)))
}

/// Every fleet row, in the order they ran.
pub(super) fn rows(out: &mut String, f: &FleetResults) {
    let n = f.pipelines;
    let (base, fleet, singles, alone) = (
        f.base.as_ref(),
        f.fleet.as_ref(),
        f.singles.as_ref(),
        f.alone.as_ref(),
    );
    memory_rows(out, n, base, fleet, singles);
    if let (Some(fl), Some(s)) = (fleet, singles) {
        let (a, c) = (fl.idle.cpu_ms_per_s(), s.idle.cpu_ms_per_s());
        let _ = writeln!(
            out,
            "| Idle CPU of {n} pipelines ({:.0} s idle) | fleet {a:.2} ms/s ({:.1} µs/s per pipeline{}) | {n} processes: {c:.2} ms/s summed{} | fleet = {:.2}x the processes | – (reported) | – |",
            fl.idle.secs,
            a * 1e3 / n as f64,
            base.map_or_else(String::new, |b| format!(
                "; a fleet of 1: {:.2} ms/s",
                b.idle.cpu_ms_per_s()
            )),
            alone.map_or_else(String::new, |o| format!(
                "; one single relay alone {:.2} ms/s",
                o.idle.cpu_ms_per_s()
            )),
            a / c
        );
        let _ = writeln!(
            out,
            "| Time from spawn until every pipeline is ready (`outbox_relay_ready` 1 for each) | fleet of {n}: {:.2} s{} | {} processes spawned at once: {:.2} s{} | | – (reported) | – |",
            fl.ready_secs,
            base.map_or_else(String::new, |b| format!(
                " (a fleet of 1: {:.2} s)",
                b.ready_secs
            )),
            s.processes,
            s.ready_secs,
            alone.map_or_else(String::new, |o| format!(
                " (one alone: {:.2} s)",
                o.ready_secs
            )),
        );
    }
    sessions_row(out, f);
    load_rows(out, n, fleet, singles, alone);
    if let Some(iso) = &f.isolation {
        isolation_rows(out, iso);
    }
    for failed in &f.failed {
        let first = failed.lines().next().unwrap_or("").replace('|', "/");
        let _ = writeln!(out, "| **Fleet**: {first} | failed | | | – | FAIL |");
    }
}

/// The idle memory rows: per pipeline above a fleet of 1, and the fleet against the processes.
fn memory_rows(
    out: &mut String,
    n: usize,
    base: Option<&Side>,
    fleet: Option<&Side>,
    singles: Option<&Side>,
) {
    if let (Some(b), Some(fl)) = (base, fleet) {
        let per = (mib(fl.idle.rss) - mib(b.idle.rss)) / (n.max(2) - 1) as f64;
        let _ = writeln!(
            out,
            "| **Fleet idle memory**, {n} pipelines in one process (RSS {:.1} MiB, {}; a fleet of 1: {:.1} MiB) | {per:.2} MiB per idle pipeline above the fleet of 1 | | | <= {MIB_PER_PIPELINE_TARGET} MiB | {} |",
            mib(fl.idle.rss),
            pss(&fl.idle),
            mib(b.idle.rss),
            verdict(per <= MIB_PER_PIPELINE_TARGET)
        );
    }
    if let (Some(fl), Some(s)) = (fleet, singles) {
        let ratio = fl.idle.rss as f64 / s.idle.rss as f64;
        let pss_ratio = fl
            .idle
            .pss
            .zip(s.idle.pss)
            .map(|(a, b)| a as f64 / b as f64);
        let _ = writeln!(
            out,
            "| **Fleet vs {n} single relays, memory idle** | fleet {:.1} MiB RSS ({}) | {n} processes: {:.1} MiB RSS summed ({} summed) | fleet = 1/{:.1} of their RSS{} | <= 1/{:.0} | {} |",
            mib(fl.idle.rss),
            pss(&fl.idle),
            mib(s.idle.rss),
            pss(&s.idle),
            1.0 / ratio,
            pss_ratio.map_or_else(String::new, |r| format!(" (1/{:.1} of their PSS)", 1.0 / r)),
            1.0 / FLEET_OF_SINGLES_TARGET,
            verdict(ratio <= FLEET_OF_SINGLES_TARGET)
        );
    }
}

fn sessions_row(out: &mut String, f: &FleetResults) {
    let n = f.pipelines as f64;
    let each = |s: &Side| {
        let Sessions {
            backends,
            walsenders,
        } = s.sessions;
        format!(
            "{:.1} client sessions + {:.1} walsender per pipeline ({backends} + {walsenders} for {})",
            backends as f64 / s.pipelines as f64,
            walsenders as f64 / s.pipelines as f64,
            s.pipelines
        )
    };
    let Some(fl) = &f.fleet else { return };
    let _ = writeln!(
        out,
        "| PostgreSQL sessions of the relays, idle (pg_stat_activity) | fleet: {} | {} | | – (reported; the server ran with {}) | – |",
        each(fl),
        f.singles
            .as_ref()
            .map_or_else(|| "–".into(), |s| format!("{n} processes: {}", each(s))),
        f.pg_settings
    );
}

/// The relays' CPU per event under load, and the part of it above their idle CPU rate.
fn load_cost(side: &Side) -> Option<(Window, f64, f64)> {
    let w = side.load.clone()?;
    let total = per_event(w.relay_cpu_secs, &w);
    let idle = side.idle.relay_cpu_secs / side.idle.secs * w.secs;
    Some((w.clone(), total, per_event(w.relay_cpu_secs - idle, &w)))
}

/// ", N events in S s (R/s)", and how many were not stored, of a load window.
fn events(w: &Window) -> String {
    let stored = if w.stored >= w.events {
        String::new()
    } else {
        format!(", only {} of them stored", w.stored)
    };
    format!(
        "{} events in {:.0} s = {:.0}/s{stored}",
        w.events,
        w.write_secs,
        w.events as f64 / w.write_secs
    )
}

fn load_rows(
    out: &mut String,
    n: usize,
    fleet: Option<&Side>,
    singles: Option<&Side>,
    alone: Option<&Side>,
) {
    let Some((fl, x, x_above)) = fleet.and_then(load_cost) else {
        return;
    };
    let s = singles.and_then(load_cost);
    let o = alone.and_then(load_cost);
    let ok = s.as_ref().is_none_or(|s| x <= s.1)
        && o.as_ref().is_none_or(|o| x <= o.1)
        && fl.stored >= fl.events;
    let beside = [
        s.as_ref().map(|(w, y, above)| {
            format!(
                "{n} processes: {y:.1} µs/event summed ({above:.1} above their idle), RSS {:.1} MiB summed; {}",
                mib(w.rss),
                events(w)
            )
        }),
        o.as_ref().map(|(w, z, above)| {
            format!(
                "one single relay alone at {FLEET_RATE}/s: {z:.1} µs/event ({above:.1} above its idle; {})",
                events(w)
            )
        }),
    ];
    let ratios = [
        s.as_ref()
            .map(|s| format!("fleet = {:.2}x the processes", x / s.1)),
        o.as_ref().map(|o| format!("{:.2}x one alone", x / o.1)),
    ];
    let join = |parts: &[Option<String>], sep: &str| {
        parts
            .iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join(sep)
    };
    let _ = writeln!(
        out,
        "| **Fleet under load**, {n} x {FLEET_RATE} events/s (1-row txs; {}) | fleet {x:.1} CPU µs/event ({x_above:.1} above its idle), RSS {:.1} MiB | {} | {} | fleet <= both | {} |",
        events(&fl),
        mib(fl.rss),
        join(&beside, "; "),
        join(&ratios, ", "),
        verdict(ok)
    );
    let s = s.map(|s| s.0);
    let server = |w: &Window| {
        format!(
            "walsenders {:.1} µs/event ({:.0} ms/s), the relays' other sessions {:.1} µs/event, whole server {:.1} µs/event; nats-server {}; machine {} of {} cores busy",
            per_event(w.pg.walsenders, w),
            w.pg.walsenders * 1e3 / w.secs,
            per_event(w.pg.relay_sessions, w),
            per_event(w.pg.all, w),
            w.nats_cpu_secs.map_or_else(
                || "–".into(),
                |c| format!("{:.1} µs/event", per_event(c, w))
            ),
            w.machine_secs
                .map_or_else(|| "–".into(), |m| format!("{:.2}", m / w.secs)),
            std::thread::available_parallelism().map_or(0, |c| c.get())
        )
    };
    let idle_walsenders = fleet.map_or(f64::NAN, |f| f.idle.pg.walsenders * 1e3 / f.idle.secs);
    let _ = writeln!(
        out,
        "| PostgreSQL server under the same load (every walsender decodes the whole server's WAL) | fleet: {} | processes: {} | | – (reported; idle, the fleet's walsenders: {idle_walsenders:.1} ms/s) | – |",
        server(&fl),
        s.as_ref().map_or_else(|| "–".into(), server),
    );
}

// Long: one table row per isolation phase, each with its own wording and verdict
fn isolation_rows(out: &mut String, iso: &Isolation) {
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let caught = |secs: Option<f64>| {
        secs.map_or_else(
            || "not caught up when the phase ended".into(),
            |s| format!("{s:.1} s, {:.0} events/s", iso.backlog_rows as f64 / s),
        )
    };
    for p in &iso.phases {
        let alone = &iso.phases[0];
        let backlog = format!(
            "{} rows in {}-row txs",
            iso.backlog_rows,
            crate::workload::BACKLOG_PER_TX
        );
        let what = match p.kind {
            PhaseKind::Alone => "alone".to_owned(),
            PhaseKind::CatchingUp => format!(
                "while the Nth pipeline (in the same process, on a server of its own) catches up {backlog} (written in {:.0} s before; {})",
                iso.backlog_write_secs,
                caught(iso.caught_up_secs)
            ),
            PhaseKind::CatchingUpElsewhere => format!(
                "while a single relay process of its own catches up the same {backlog} beside the fleet (the control; {})",
                caught(iso.control_caught_up_secs)
            ),
            PhaseKind::ServerStopped => "while the Nth pipeline's server is stopped".to_owned(),
            PhaseKind::AloneAgain => {
                "alone again (the Nth pipeline removed by a reload)".to_owned()
            }
        };
        let per_s = |c: f64| format!("{:.0}", c * 1e3 / p.secs);
        let budget = format!(
            "{:.0} s; {} of {cores} cores busy: fleet {} ms/s{}, nats-server {} ms/s, their PostgreSQL {} ms/s, the Nth's {} ms/s",
            p.secs,
            p.machine_secs
                .map_or_else(|| "–".into(), |m| format!("{:.2}", m / p.secs)),
            per_s(p.relay_cpu_secs),
            p.second_relay_cpu_secs
                .map_or_else(String::new, |c| format!(
                    ", the single relay {} ms/s",
                    per_s(c)
                )),
            p.nats_cpu_secs.map_or_else(|| "–".into(), per_s),
            per_s(p.pg_cpu_secs),
            per_s(p.other_pg_cpu_secs),
        );
        let figure = format!(
            "p50 {:.2} ms, p99 {:.2} ms (worst pipeline {:.2} ms), max {:.1} ms",
            p.p50_ms, p.p99_ms, p.worst_pipeline_p99_ms, p.max_ms
        );
        let ratio = p.p99_ms / alone.p99_ms;
        let (beside, ratio, target, result) = match p.kind {
            PhaseKind::Alone => (String::new(), String::new(), "baseline", "–"),
            PhaseKind::CatchingUp | PhaseKind::ServerStopped => (
                format!("alone: p99 {:.2} ms", alone.p99_ms),
                format!("{ratio:.2}x"),
                "p99 <= 1.5x alone",
                verdict(ratio <= ISOLATION_TARGET && p.samples > 0),
            ),
            PhaseKind::CatchingUpElsewhere => (
                format!("alone: p99 {:.2} ms", alone.p99_ms),
                format!("{ratio:.2}x"),
                "– (control: what the machine alone costs)",
                "–",
            ),
            PhaseKind::AloneAgain => (
                format!("alone: p99 {:.2} ms", alone.p99_ms),
                format!("{ratio:.2}x"),
                "– (the noise between phases)",
                "–",
            ),
        };
        let missing = if p.kind == PhaseKind::Alone && iso.missing > 0 {
            format!("; {} events of the run never read back", iso.missing)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| **Isolation**: commit→ack of {} pipelines of one fleet at {FLEET_RATE}/s each, {what} ({} events{missing}; {budget}) | {figure} | {beside} | {ratio} | {target} | {result} |",
            iso.pipelines, p.samples
        );
    }
    if let Some(why) = &iso.not_run {
        let _ = writeln!(
            out,
            "| **Isolation**: the same {} pipelines while the Nth pipeline catches up {} rows, and with its server stopped | not run: {} | | | p99 <= {ISOLATION_TARGET}x alone | – |",
            iso.pipelines,
            iso.backlog_rows,
            why.replace('|', "/")
        );
    }
}

/// How the fleet rows measure, under the table.
pub(super) fn note(out: &mut String, f: Option<&FleetResults>) {
    let Some(f) = f else { return };
    let _ = writeln!(
        out,
        "Fleet: {} databases on one PostgreSQL server of their own ({}), each with migrations/*.sql, a publication and a slot, and one stream each; the relays run with their defaults (checkpoint 1 s, idle checkpoint 10 s, status 10 s, sample 5 s) and `[http] listen`. A fleet of 1, a fleet of N, N single-relay processes (one configuration each, same binary) and one single relay alone run one after the other on the same slots. Ready: from the (first) spawn until `/readyz` answers 200 and `/metrics` has `outbox_relay_ready` 1 for every pipeline (polled every 100 ms). Idle: CPU (utime+stime) over the window after 3 s of settling, RSS (VmRSS, shared pages counted in each process) and PSS (smaps_rollup) at its end. Load: one writer per database, 1-row autocommit transactions at {FLEET_RATE}/s, the window until the streams held every event (30 s at most); CPU per event includes the idle work of that time. PostgreSQL: CPU of the postmaster and its children from /proc, by role from pg_stat_activity. Isolation: one ordered consumer per stream; latency is `ts` (clock_timestamp() at INSERT) to the stream's store time, each event in the phase its `ts` falls in; the Nth pipeline is added to the running fleet by a reload (SIGHUP) and its server stopped with `pg_ctl stop -m fast`.",
        f.pipelines, f.pg_settings
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(pipelines: usize, processes: usize, rss_mib: f64) -> Side {
        let idle = Window {
            secs: 20.0,
            relay_cpu_secs: 0.02,
            rss: (rss_mib * MIB) as u64,
            ..Window::default()
        };
        Side {
            processes,
            pipelines,
            ready_secs: 1.0,
            sessions: Sessions::default(),
            idle,
            load: None,
        }
    }

    #[test]
    fn memory_is_judged_per_pipeline_above_the_fleet_of_one_and_against_the_processes() {
        let res = FleetResults {
            pipelines: 100,
            base: Some(side(1, 1, 30.0)),
            fleet: Some(side(100, 1, 200.0)),
            singles: Some(side(100, 100, 2800.0)),
            ..FleetResults::default()
        };
        let mut out = String::new();
        rows(&mut out, &res);
        let row = |name: &str| out.lines().find(|l| l.contains(name)).unwrap().to_owned();
        // (200 - 30) / 99 = 1.72 MiB per pipeline; 200 / 2800 = 1/14.
        let per = row("Fleet idle memory");
        assert!(
            per.contains("1.72 MiB per idle pipeline") && per.ends_with("PASS |"),
            "{per}"
        );
        let total = row("memory idle");
        assert!(
            total.contains("1/14.0") && total.ends_with("PASS |"),
            "{total}"
        );
        let res = FleetResults {
            fleet: Some(side(100, 1, 300.0)),
            ..res
        };
        let mut out = String::new();
        rows(&mut out, &res);
        assert_eq!(out.matches("FAIL |").count(), 2, "{out}");
    }

    #[test]
    fn isolation_not_run_is_said_and_not_judged() {
        let res = FleetResults {
            pipelines: 100,
            isolation: Some(Isolation {
                pipelines: 99,
                backlog_rows: 1_000_000,
                backlog_write_secs: 30.0,
                caught_up_secs: None,
                control_caught_up_secs: None,
                phases: Vec::new(),
                missing: 0,
                not_run: Some("the 99 pipelines did not keep up alone".into()),
            }),
            failed: vec!["fleet of 1: boom | bang\nmore".into()],
            ..FleetResults::default()
        };
        let mut out = String::new();
        rows(&mut out, &res);
        let row = out.lines().find(|l| l.contains("not run")).unwrap();
        assert!(
            row.ends_with("| – |") && row.contains("did not keep up"),
            "{row}"
        );
        let failed = out.lines().find(|l| l.contains("boom")).unwrap();
        assert!(
            failed.contains("boom / bang") && failed.ends_with("FAIL |"),
            "{failed}"
        );
    }
}
