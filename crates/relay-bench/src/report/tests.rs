//! The table's judgements: rows that measured nothing, rounds, latency targets.

use clap::Parser as _;

use super::*;
use crate::workload::LatencyRun;

fn empty_run(target_rate: u64) -> LatencyRun {
    LatencyRun {
        target_rate,
        achieved_rate: 0.0,
        samples: 0,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        p999_ms: f64::NAN,
        max_ms: f64::NAN,
        relay_rss: 0,
        relay_cpu_secs: 0.0,
        relay_switches: None,
    }
}

#[test]
fn a_latency_run_without_events_is_not_judged() {
    let args = Args::parse_from(["relay-bench", "--quick", "--latency-secs", "0"]);
    let res = Results {
        latency: vec![empty_run(1_000), empty_run(10_000)],
        ..Results::default()
    };
    let table = render(&args, &res);
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.contains("**Latency**"))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    for row in rows {
        assert!(row.contains("not run: no events measured"), "{row}");
        assert!(!row.contains("PASS") && !row.contains("FAIL"), "{row}");
    }
    assert!(!table.contains("live at 1000/s"), "{table}");
    let rss = table.lines().find(|l| l.contains("**Peak RSS**")).unwrap();
    assert!(
        rss.contains("not measured") && !rss.contains("PASS"),
        "{rss}"
    );
}

#[test]
fn rounds_judge_the_median_of_each_rounds_own_ratio() {
    let args = Args::parse_from(["relay-bench", "--quick", "--rounds", "3"]);
    let run = RelayRun {
        variant: "",
        max_in_flight: 1024,
        secs: 1.0,
        events_per_s: 90.0,
        peak_rss: 0,
        cpu_secs: 0.5,
        first_stored_secs: 0.1,
        last_stored_secs: 0.9,
        budget: None,
    };
    let round = |decode: f64, broker: f64, relay: f64| crate::workload::Round {
        decode,
        broker: Some(broker),
        relays: vec![relay],
    };
    let sc = Scenario {
        label: "100-row txs".into(),
        rows: 100,
        per_tx: 100,
        decode: Some(100.0),
        broker: Some(100.0),
        relays: vec![run],
        // Against its own round's min(decode, broker): 80 %, 95 %, 91 %; the median is 91 %
        // (the median relay against the median limits would be 90 / 100).
        rounds: vec![
            round(100.0, 110.0, 80.0),
            round(120.0, 100.0, 95.0),
            round(100.0, 100.0, 91.0),
        ],
        ..Scenario::default()
    };
    let res = Results {
        scenarios: vec![sc],
        ..Results::default()
    };
    let table = render(&args, &res);
    let row = table.lines().find(|l| l.contains("**Catch-up")).unwrap();
    assert!(
        row.contains("| 91% (median of 3 rounds: 80%, 95%, 91%) |") && row.ends_with("| PASS |"),
        "{row}"
    );
    // 99 gaps between 100 events stored 0.8 s apart.
    assert!(
        row.contains("| 90/s (first to last stored: 124/s) |"),
        "{row}"
    );
    assert_eq!(
        crate::workload::median_by(vec![3.0, 1.0, 2.0, 9.0], |x| *x),
        Some(3.0)
    );
    assert_eq!(crate::workload::median_by(Vec::<f64>::new(), |x| *x), None);
}

#[test]
fn a_latency_run_with_events_is_judged() {
    let args = Args::parse_from(["relay-bench", "--quick"]);
    let run = LatencyRun {
        samples: 3_000,
        achieved_rate: 1_000.0,
        p50_ms: 0.5,
        p99_ms: 1.5,
        p999_ms: 2.0,
        max_ms: 3.0,
        relay_cpu_secs: 0.3,
        relay_rss: 40 * 1024 * 1024,
        relay_switches: Some(7_200),
        ..empty_run(1_000)
    };
    let res = Results {
        latency: vec![run],
        ..Results::default()
    };
    let table = render(&args, &res);
    let latency = table.lines().find(|l| l.contains("**Latency**")).unwrap();
    assert!(latency.ends_with("| PASS |"), "{latency}");
    // 0.3 CPU s over 3,000 events: 100 µs, over the 40 µs target.
    let cpu = table
        .lines()
        .find(|l| l.contains("live at 1000/s"))
        .unwrap();
    assert!(
        cpu.contains("100.0 µs") && cpu.ends_with("| FAIL |"),
        "{cpu}"
    );
    let rss = table.lines().find(|l| l.contains("**Peak RSS**")).unwrap();
    assert!(
        rss.contains("40.0 MB") && rss.ends_with("| PASS |"),
        "{rss}"
    );
}

#[test]
fn an_ab_row_judges_the_median_of_each_rounds_ratios() {
    let args = Args::parse_from(["relay-bench", "--quick", "--rounds", "3"]);
    let run = |events_per_s: f64, cpu_secs: f64| RelayRun {
        variant: "",
        max_in_flight: 1024,
        secs: 100.0 / events_per_s,
        events_per_s,
        peak_rss: 0,
        cpu_secs,
        first_stored_secs: 0.1,
        last_stored_secs: 0.9,
        budget: None,
    };
    let ab = |relay: Vec<RelayRun>, compare: Vec<RelayRun>| crate::workload::ModeScenario {
        label: "100-row txs".into(),
        rows: 100,
        per_tx: 100,
        runs: Vec::new(),
        compared: vec![(
            crate::workload::PublishModeArg::FastBatch,
            crate::workload::ModeAb { relay, compare },
        )],
    };
    // Rates 0.90, 1.00, 1.10 of the other build (median 1.00); CPU 1.20, 1.00, 0.80 (median 1.00).
    let even = ab(
        vec![run(90.0, 1.2), run(100.0, 1.0), run(110.0, 0.8)],
        vec![run(100.0, 1.0), run(100.0, 1.0), run(100.0, 1.0)],
    );
    // Slower in two rounds of three: the median is 0.80.
    let slower = ab(
        vec![run(80.0, 1.0), run(80.0, 1.0), run(120.0, 1.0)],
        vec![run(100.0, 1.0), run(100.0, 1.0), run(100.0, 1.0)],
    );
    let res = Results {
        modes: vec![even, slower],
        ..Results::default()
    };
    let table = render(&args, &res);
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.contains("**A/B publish mode"))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].contains("events/s 0.90 / 1.00 / 1.10x (median 1.00x)")
            && rows[0].contains("CPU per event 1.20 / 1.00 / 0.80x (median 1.00x)")
            && rows[0].ends_with("| PASS |"),
        "{}",
        rows[0]
    );
    assert!(
        rows[1].contains("(median 0.80x)") && rows[1].ends_with("| FAIL |"),
        "{}",
        rows[1]
    );
}

#[test]
fn the_contracts_rows_judge_the_median_of_each_rounds_ratio() {
    let args = Args::parse_from(["relay-bench", "--only-contracts", "--rounds", "3"]);
    let run =
        |contracts_on: bool, events_per_s: f64, cpu_secs: f64| crate::workload::ContractsRun {
            contracts_on,
            relay: RelayRun {
                variant: "",
                max_in_flight: 1024,
                secs: 1000.0 / events_per_s,
                events_per_s,
                peak_rss: 0,
                cpu_secs,
                first_stored_secs: 0.1,
                last_stored_secs: 0.9,
                budget: None,
            },
            checked: if contracts_on { 1000 } else { 0 },
        };
    // Rounds: off/on rates 1.00, 1.25, 1.10 (median 1.10: PASS); on/off CPU 1.10, 1.30, 1.20
    // (median 1.20: FAIL).
    let sc = crate::workload::ContractsScenario {
        rows: 1000,
        write_secs: 1.0,
        wal_bytes: 1_000_000,
        payload_bytes: 294,
        contract_key: "bench-order-created.0123456789ab".into(),
        runs: vec![
            run(false, 100.0, 0.010),
            run(true, 100.0, 0.011),
            run(false, 125.0, 0.010),
            run(true, 100.0, 0.013),
            run(false, 110.0, 0.010),
            run(true, 100.0, 0.012),
        ],
    };
    let res = Results {
        contracts: Some(sc),
        ..Results::default()
    };
    let table = render(&args, &res);
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.contains("**Event contracts on"))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].contains("off/on 1.10x (median of 3 rounds: 1.00x, 1.25x, 1.10x)")
            && rows[0].contains("runs off: 100, 125, 110 /s, on: 100, 100, 100 /s")
            && rows[0].ends_with("| PASS |"),
        "{}",
        rows[0]
    );
    assert!(
        rows[1].contains("on/off 1.20x (median of 3 rounds: 1.10x, 1.30x, 1.20x)")
            && rows[1].contains("12.00 µs on vs 10.00 µs off")
            && rows[1].ends_with("| FAIL |"),
        "{}",
        rows[1]
    );
    assert!(table.contains("Event contracts: one backlog"), "{table}");
}
