use std::sync::Arc;
use std::sync::atomic::Ordering;

use relay_core::pipeline::PipelineStats;

use super::{BuildInfo, Telemetry};

fn telemetry() -> Telemetry {
    let build = BuildInfo {
        version: "1.2.3",
        commit: "0123456789ab",
    };
    Telemetry::new(
        Arc::new(PipelineStats::default()),
        "relay_slot",
        "EVENTS",
        build,
    )
}

fn postgres_reasons(t: &Telemetry) -> Vec<String> {
    let (_, reasons) = t.readiness();
    reasons
        .into_iter()
        .filter(|r| !r.starts_with("nats:"))
        .collect()
}

#[test]
fn a_waiting_standby_says_who_holds_the_slot_instead_of_its_last_error() {
    let t = telemetry();
    t.set_last_error(Some("replication stream ended".into()));
    assert_eq!(
        postgres_reasons(&t),
        ["postgres: slot `relay_slot` is not streaming (last error: replication stream ended)"]
    );

    t.set_standby(Some(4242));
    assert_eq!(
        postgres_reasons(&t),
        ["standby: slot `relay_slot` is held by another process (pid 4242)"]
    );
    let status = t.status_report();
    assert!(!status.ready);
    assert!(
        status.reasons.iter().any(|r| r.starts_with("standby: ")),
        "{:?}",
        status.reasons
    );

    // Taken over: streaming, no reason about the slot left.
    t.set_standby(None);
    t.streaming.store(true, Ordering::Relaxed);
    assert!(postgres_reasons(&t).is_empty());
}
