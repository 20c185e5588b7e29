use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus_client::registry::Registry;
use relay_core::pipeline::PipelineStats;
use relay_postgres::catalog::retention::{
    RateSource, RetentionFacts, RetentionSettings, RetentionWindow, SlotRetention, TakeoverPolicy,
    WalRate,
};

use super::super::*;
use super::{FAMILIES, MetricsCollector};

/// The build a test relay reports.
const BUILD_INFO: BuildInfo = BuildInfo {
    version: "1.2.3",
    commit: "0123456789ab",
};

/// A relay with every sample taken: each metric family has a value to show.
/// A contract that checked two events and refused one.
fn checked_contract() -> Arc<LoadedContract> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("order-placed.json");
    std::fs::write(&path, r#"{"type":"object","required":["id"]}"#).expect("schema");
    let contract = outbox_schema::Contract::load(&path, None).expect("compiles");
    let loaded = Arc::new(LoadedContract::new(contract, "order-placed.json"));
    let set =
        relay_core::route::TableContracts::new(&toml_contracts(), |_| Ok::<_, ()>(loaded.clone()))
            .expect("contracts");
    let check = |id: &str, payload: &[u8]| {
        set.check("public.outbox", id, Some("OrderPlaced"), "s", payload)
    };
    assert!(check("e-1", br#"{"id":1}"#).is_ok());
    assert!(check("e-2", b"{}").is_err());
    loaded
}

fn toml_contracts() -> relay_core::route::ContractsConfig {
    serde_json::from_value(serde_json::json!({"types": {"OrderPlaced": "order-placed.json"}}))
        .expect("contracts config")
}

fn sampled_telemetry() -> Arc<Telemetry> {
    let stats = Arc::new(PipelineStats::default());
    stats.events_received.store(7, Ordering::Relaxed);
    stats.events_published.store(6, Ordering::Relaxed);
    stats.publish_errors_no_stream.store(2, Ordering::Relaxed);
    stats.in_flight.store(1, Ordering::Relaxed);
    stats.commit_to_ack_buckets[3].store(4, Ordering::Relaxed);
    stats
        .commit_to_ack_sum_micros
        .store(1_500_000, Ordering::Relaxed);
    stats.confirmed_lsn.store(5000, Ordering::Relaxed);
    stats.slot_confirmed_lsn.store(4000, Ordering::Relaxed);
    let t = Telemetry::new(stats, "relay_slot", "EVENTS", BUILD_INFO);
    t.set_contracts(vec![("public.outbox".into(), checked_contract())]);
    t.audit.enabled.store(true, Ordering::Relaxed);
    t.audit.runs.store(3, Ordering::Relaxed);
    let slot = SlotInfo {
        slot_type: "logical".into(),
        plugin: Some("pgoutput".into()),
        database: Some("app".into()),
        active_pid: None,
        wal_status: Some("extended".into()),
        confirmed_flush_lsn: Some(Lsn(4000)),
        restart_lsn: Some(Lsn(3000)),
        lag_bytes: Some(1000),
        retained_bytes: Some(2000),
        safe_wal_size: Some(1 << 20),
    };
    let window = RetentionWindow::assess(
        RetentionFacts {
            settings: RetentionSettings {
                max_slot_wal_keep_size: Some(2 << 20),
                wal_sender_timeout: Duration::from_secs(60),
                idle_replication_slot_timeout: None,
            },
            wal_position: Some(Lsn(6000)),
            slot: Some(SlotRetention {
                wal_status: Some("extended".into()),
                safe_wal_size: Some(1 << 20),
                active: true,
                inactive_since: None,
                inactive_seconds: None,
            }),
        },
        Some(WalRate {
            bytes_per_second: 1024.0,
            over: Duration::from_secs(2),
            source: RateSource::ShortSample,
        }),
        TakeoverPolicy {
            budget: Duration::from_secs(3600),
            standby_poll: Duration::from_secs(1),
        },
    );
    t.set_slot_and_retention(Some(Some(slot)), Some(window));
    t.set_stream(StreamSample {
        present: true,
        last_seq: 42,
        messages: 40,
    });
    t.update_table("public.outbox", |s| {
        s.rows_estimate = Some(10.0);
        s.size_bytes = Some(8192);
        s.oldest_unconfirmed_age = Some(0.0);
        s.cleanup_mode = Some("delete");
        s.cleaned_rows = 3;
        s.waiting = 1;
    });
    Arc::new(t)
}

fn scrape(t: Arc<Telemetry>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(MetricsCollector::one(t)));
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry).expect("encodes");
    body
}

/// The families a scrape shows, from its `# TYPE` lines, in order, with their types.
fn families_shown(body: &str) -> Vec<(&str, &str)> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect()
}

/// The name a family's samples carry: counters end in `_total`, the info metric in `_info`.
fn sample_name(name: &str, kind: &str) -> String {
    match kind {
        "counter" => format!("{name}_total"),
        "info" => format!("{name}_info"),
        _ => name.to_owned(),
    }
}

#[test]
fn a_sampled_relay_shows_every_family_of_the_table_once_in_its_order() {
    let body = scrape(sampled_telemetry());
    let shown = families_shown(&body);
    let names: Vec<&str> = shown.iter().map(|(name, _)| *name).collect();
    let table: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
    assert_eq!(names, table, "{body}");
    for family in FAMILIES {
        let help = format!("# HELP {} {}\n", family.name, family.help);
        assert_eq!(body.matches(&help).count(), 1, "{help}");
    }
    for (name, kind) in &shown {
        let sample = match *kind {
            "histogram" => format!("{name}_count"),
            _ => sample_name(name, kind),
        };
        assert!(
            body.lines()
                .any(|l| l.starts_with(&format!("{sample} "))
                    || l.starts_with(&format!("{sample}{{"))),
            "no sample of {sample} in\n{body}"
        );
    }
}

#[test]
fn every_family_is_documented_and_every_documented_metric_is_a_family() {
    let docs = include_str!("../../../../docs/operations.md");
    let shown = scrape(sampled_telemetry());
    let exposed: Vec<String> = families_shown(&shown)
        .into_iter()
        .map(|(name, kind)| sample_name(name, kind))
        .collect();
    assert_eq!(exposed.len(), FAMILIES.len());
    // The rows of the table under "Monitor": each names one or more metrics in backticks.
    let documented: Vec<String> = docs
        .lines()
        .skip_while(|l| *l != "| metric | type | meaning |")
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("| `outbox_relay_"))
        .flat_map(|l| l.split('|').nth(1).unwrap_or_default().split(", "))
        .map(|m| {
            let m = m.trim().trim_matches('`');
            m.split('{').next().unwrap_or(m).to_owned()
        })
        .collect();
    assert!(
        !documented.is_empty(),
        "no metric table in docs/operations.md"
    );
    for name in &exposed {
        assert_eq!(
            documented.iter().filter(|d| *d == name).count(),
            1,
            "{name} is not documented once in docs/operations.md"
        );
    }
    for name in &documented {
        assert!(
            exposed.contains(name),
            "docs/operations.md documents {name}, which /metrics does not expose"
        );
    }
}

#[test]
fn sampled_values_are_encoded_as_read() {
    let body = scrape(sampled_telemetry());
    for line in [
        "outbox_relay_build_info{version=\"1.2.3\",commit=\"0123456789ab\"} 1\n",
        "outbox_relay_events_received_total 7\n",
        "outbox_relay_publish_errors_total{kind=\"no_stream\"} 2\n",
        "outbox_relay_outstanding_acks 1\n",
        "outbox_relay_commit_to_ack_seconds_sum 1.5\n",
        "outbox_relay_commit_to_ack_seconds_count 4\n",
        // The stored checkpoint 5000 minus the position confirmed to the slot, 4000.
        "outbox_relay_replay_window_bytes 1000\n",
        "outbox_relay_slot_lag_bytes 1000\n",
        "outbox_relay_max_slot_wal_keep_size_bytes 2097152\n",
        // 1 MiB of safe WAL at 1 KiB/s.
        "outbox_relay_slot_retention_seconds 1024.0\n",
        "outbox_relay_takeover_budget_seconds 3600.0\n",
        "outbox_relay_cleanup_rows_total{table=\"public.outbox\"} 3\n",
        "outbox_relay_cleanup_waiting{table=\"public.outbox\"} 1\n",
        "outbox_relay_slot_wal_status{status=\"extended\"} 1\n",
        "outbox_relay_slot_wal_status{status=\"missing\"} 0\n",
        "outbox_relay_stream_last_sequence 42\n",
        "outbox_relay_connected{dependency=\"stream\"} 1\n",
    ] {
        assert_eq!(body.matches(line).count(), 1, "{line} in\n{body}");
    }
}

#[test]
fn the_status_document_shows_the_build_it_was_given() {
    let status = sampled_telemetry().status();
    assert_eq!(status["version"], "1.2.3");
    assert_eq!(status["commit"], "0123456789ab");
}

#[test]
fn the_status_document_reads_back_into_its_type_unchanged() {
    let served = sampled_telemetry().status();
    let read: crate::RelayStatus =
        serde_json::from_value(served.clone()).expect("/status reads back");
    assert_eq!(serde_json::to_value(&read).expect("json"), served);
    assert_eq!(
        read.postgres.tables["public.outbox"]
            .cleanup
            .as_ref()
            .map(|c| c.rows_cleaned),
        Some(3)
    );
    assert!(read.postgres.retention.is_some() && read.postgres.slot_state.is_some());
    assert_eq!(read.contracts.len(), 1);
}

#[test]
fn what_was_not_sampled_is_left_out_and_the_slot_is_missing() {
    let body = scrape(Arc::new(Telemetry::new(
        Arc::default(),
        "s",
        "S",
        BUILD_INFO,
    )));
    for absent in [
        SLOT_LAG_BYTES,
        SLOT_RETAINED_WAL_BYTES,
        SLOT_SAFE_WAL_SIZE_BYTES,
        MAX_SLOT_WAL_KEEP_SIZE_BYTES,
        WAL_RATE,
        SLOT_RETENTION,
        TAKEOVER_BUDGET,
        TABLE_ROWS,
        TABLE_SIZE,
        TABLE_OLDEST_UNCONFIRMED,
        CLEANUP_ROWS,
        CLEANUP_PARTITIONS,
        CLEANUP_ERRORS,
        CLEANUP_WAITING,
        CONTRACT_CHECKED,
        CONTRACT_REFUSED,
        // The audit is off.
        AUDIT_RUNS,
        AUDIT_MISSING,
        AUDIT_HEALED,
        AUDIT_FAILED,
    ] {
        assert!(!body.contains(absent), "{absent} in\n{body}");
    }
    assert_eq!(families_shown(&body).len(), FAMILIES.len() - 20);
    assert!(body.contains("outbox_relay_slot_wal_status{status=\"missing\"} 1\n"));
    assert!(body.contains("outbox_relay_replay_window_bytes 0\n"));
}

#[test]
fn a_fleet_describes_each_family_once_and_labels_every_sample_with_its_pipeline() {
    let single = scrape(sampled_telemetry());
    let mut registry = Registry::default();
    registry.register_collector(Box::new(MetricsCollector::fleet([
        ("orders".to_owned(), sampled_telemetry()),
        ("billing".to_owned(), sampled_telemetry()),
    ])));
    let mut fleet = String::new();
    prometheus_client::encoding::text::encode(&mut fleet, &registry).expect("encodes");
    assert_eq!(
        families_shown(&fleet),
        families_shown(&single),
        "the same families, each described once, in the same order"
    );
    let samples = |body: &str| -> Vec<String> {
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    let single_samples = samples(&single);
    let fleet_samples = samples(&fleet);
    assert_eq!(fleet_samples.len(), single_samples.len() * 2);
    for pipeline in ["orders", "billing"] {
        let label = format!("pipeline=\"{pipeline}\"");
        let own: Vec<&String> = fleet_samples
            .iter()
            .filter(|l| l.contains(&label))
            .collect();
        assert_eq!(
            own.len(),
            single_samples.len(),
            "{pipeline}: one of each sample"
        );
        // The same sample as one relay's, with the label added (label order aside).
        let normalized: Vec<(String, Vec<String>, String)> =
            own.iter().map(|l| sample_parts(l)).collect();
        for line in &single_samples {
            let (name, mut labels, value) = sample_parts(line);
            labels.push(label.clone());
            labels.sort();
            let expected = (name, labels, value);
            assert!(
                normalized.contains(&expected),
                "missing {expected:?}\n{fleet}"
            );
        }
    }
}

/// A sample line's name, labels (sorted) and value.
fn sample_parts(line: &str) -> (String, Vec<String>, String) {
    let (series, value) = line.rsplit_once(' ').expect("series value");
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (
            name,
            labels
                .trim_end_matches('}')
                .split(',')
                .map(str::to_owned)
                .collect(),
        ),
        None => (series, Vec::new()),
    };
    let mut labels: Vec<String> = labels;
    labels.sort();
    (name.to_owned(), labels, value.to_owned())
}
