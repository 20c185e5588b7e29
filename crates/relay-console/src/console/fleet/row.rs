//! One pipeline as the fleet page shows it: where it is (streaming, a standby, retrying,
//! stopped or refused, and why), its slot lag, its rate and latency over the last sample, its
//! last error and the address of its own pages.

use relay_runtime::failure::FailureKind;
use relay_runtime::fleet::{PipelineState, PipelineView};
use relay_telemetry::RelayStatus;
use serde::Serialize;

use crate::console::Sample;
use crate::console::page::url_segment;

/// Where a pipeline is, in the fleet page's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Phase {
    /// Built, its first run not begun.
    Starting,
    /// Running and not streaming yet (or again): connecting, creating its slot, reconnecting.
    Connecting,
    /// Its replication session streams.
    Streaming,
    /// Its slot streams to another process: it waits to take over.
    Standby,
    /// PostgreSQL or NATS could not be reached at its start; started again after a backoff.
    Retrying,
    /// Stopping (shutdown, or removed or changed by a reload).
    Draining,
    /// Stopped on a fatal condition: a reload starts it again.
    Stopped,
    /// Its configuration cannot be used: never started.
    Refused,
}

/// A row of the fleet page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FleetRow {
    pub name: String,
    /// Where its configuration comes from.
    pub origin: String,
    pub phase: Phase,
    /// Why it is in `phase`: a retry's, stop's or refusal's reason, what a standby or a
    /// connecting pipeline last met.
    pub reason: Option<String>,
    /// A stop's kind (its exit code's, as a single relay would exit).
    pub stop_kind: Option<FailureKind>,
    /// Unix seconds since it is in its fleet state.
    pub since: u64,
    pub ready: bool,
    pub reasons: Vec<String>,
    pub slot: String,
    pub stream: String,
    /// Bytes of WAL its slot's confirmed position is behind the server's, as last sampled.
    pub slot_lag_bytes: Option<i64>,
    /// Events published (acknowledged) by its current run.
    pub events_published: Option<u64>,
    /// Events acknowledged per second over the last sample.
    pub events_per_second: Option<f64>,
    /// Mean commit-to-ack latency over the last sample, in milliseconds.
    pub commit_to_ack_ms: Option<f64>,
    /// Why its last replication session ended.
    pub last_error: Option<String>,
    /// A reload's configuration of it that was refused (it runs the previous one).
    pub reload_error: Option<String>,
    /// Its own pages.
    pub href: String,
}

/// `view`'s row, with `sample` (its console's newest, if any).
pub(crate) fn row(view: &PipelineView, sample: Option<&Sample>) -> FleetRow {
    let relay = view.telemetry.as_ref().map(|t| t.status_report());
    let standby_for = view.telemetry.as_ref().and_then(|t| t.standby_for());
    let (phase, reason) = phase(&view.state, relay.as_ref(), standby_for);
    let status = view.status();
    FleetRow {
        name: view.name.clone(),
        origin: view.origin.clone(),
        phase,
        reason,
        stop_kind: match &view.state {
            PipelineState::Stopped { kind, .. } => Some(*kind),
            _ => None,
        },
        since: status.since,
        ready: status.ready,
        reasons: status.reasons,
        slot: view.config.postgres.slot.clone(),
        stream: view.config.nats.stream.clone(),
        slot_lag_bytes: relay
            .as_ref()
            .and_then(|r| r.postgres.slot_state.as_ref())
            .and_then(|s| s.lag_bytes),
        events_published: relay.as_ref().map(|r| r.pipeline.events_published),
        events_per_second: sample.map(|s| s.events_per_second),
        commit_to_ack_ms: sample.and_then(|s| s.commit_to_ack_ms),
        last_error: relay.and_then(|r| r.postgres.last_error),
        reload_error: view.reload_error.clone(),
        href: format!("/console/p/{}/", url_segment(&view.name)),
    }
}

/// Where a pipeline in fleet state `state` is, and why; `relay`: its current run's
/// `/status` document; `standby_for`: the process holding its slot while it waits as a
/// standby (its telemetry's own record, not read from any message).
pub(crate) fn phase(
    state: &PipelineState,
    relay: Option<&RelayStatus>,
    standby_for: Option<i32>,
) -> (Phase, Option<String>) {
    match state {
        PipelineState::Running => match (relay, standby_for) {
            (None, _) => (Phase::Starting, None),
            (Some(r), _) if r.postgres.streaming => (Phase::Streaming, None),
            (Some(_), Some(pid)) => (
                Phase::Standby,
                Some(format!(
                    "its slot is streamed by another process (pid {pid})"
                )),
            ),
            (Some(r), None) => (Phase::Connecting, r.postgres.last_error.clone()),
        },
        PipelineState::Retrying { reason } => (Phase::Retrying, Some(reason.clone())),
        PipelineState::Draining => (Phase::Draining, None),
        PipelineState::Stopped { reason, .. } => (Phase::Stopped, Some(reason.clone())),
        PipelineState::Refused { reason } => (Phase::Refused, Some(reason.clone())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::SystemTime;

    use relay_runtime::config::RelayConfig;
    use relay_telemetry::{BuildInfo, Telemetry};

    use super::*;

    fn telemetry() -> Arc<Telemetry> {
        let build = BuildInfo {
            version: "1.2.3",
            commit: "0123456789ab",
        };
        Arc::new(Telemetry::new(
            Arc::default(),
            "orders_slot",
            "ORDERS",
            build,
        ))
    }

    fn view(state: PipelineState, telemetry: Option<Arc<Telemetry>>) -> PipelineView {
        let mut config = RelayConfig::default();
        config.postgres.slot = "orders_slot".into();
        config.nats.stream = "ORDERS".into();
        PipelineView {
            name: "orders".into(),
            origin: "[[pipeline]] 1 of relay.toml".into(),
            config,
            telemetry,
            state,
            since: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000),
            reload_error: None,
        }
    }

    #[test]
    fn a_running_pipeline_is_starting_connecting_streaming_or_a_standby() {
        assert_eq!(
            phase(&PipelineState::Running, None, None),
            (Phase::Starting, None)
        );
        let t = telemetry();
        let report = t.status_report();
        assert_eq!(
            phase(&PipelineState::Running, Some(&report), None),
            (Phase::Connecting, None)
        );
        t.set_last_error(Some("connection refused".into()));
        let report = t.status_report();
        assert_eq!(
            phase(&PipelineState::Running, Some(&report), None),
            (Phase::Connecting, Some("connection refused".into()))
        );
        t.set_standby(Some(4242));
        assert_eq!(
            phase(
                &PipelineState::Running,
                Some(&t.status_report()),
                t.standby_for()
            ),
            (
                Phase::Standby,
                Some("its slot is streamed by another process (pid 4242)".into())
            )
        );
        t.set_standby(None);
        // A failover's wait names a standby too, and is no standby's wait.
        t.set_last_error(Some(
            "no read-write PostgreSQL server among a, b (during a failover this lasts until a standby is promoted)".into(),
        ));
        assert_eq!(
            phase(&PipelineState::Running, Some(&t.status_report()), None).0,
            Phase::Connecting
        );
        t.streaming.store(true, Ordering::Relaxed);
        assert_eq!(
            phase(&PipelineState::Running, Some(&t.status_report()), None),
            (Phase::Streaming, None)
        );
    }

    #[test]
    fn a_pipeline_not_running_says_why() {
        let stopped = PipelineState::Stopped {
            kind: FailureKind::DataSafety,
            reason: "cannot route".into(),
        };
        assert_eq!(
            phase(&stopped, None, None),
            (Phase::Stopped, Some("cannot route".into()))
        );
        let retrying = PipelineState::Retrying {
            reason: "nats: connection refused".into(),
        };
        assert_eq!(phase(&retrying, None, None).0, Phase::Retrying);
        let refused = PipelineState::Refused {
            reason: "bad key".into(),
        };
        assert_eq!(
            phase(&refused, None, None),
            (Phase::Refused, Some("bad key".into()))
        );
        assert_eq!(
            phase(&PipelineState::Draining, None, None),
            (Phase::Draining, None)
        );
    }

    #[test]
    fn a_row_has_the_pipelines_numbers_and_its_address() {
        let t = telemetry();
        t.stats.events_published.store(42, Ordering::Relaxed);
        t.set_last_error(Some("the last one".into()));
        let stopped = PipelineState::Stopped {
            kind: FailureKind::DataSafety,
            reason: "cannot route".into(),
        };
        let sample = Sample {
            at: 1,
            events_per_second: 12.5,
            commit_to_ack_ms: Some(3.0),
            slot_lag_bytes: Some(10),
        };
        let row = row(&view(stopped, Some(t)), Some(&sample));
        assert_eq!(row.phase, Phase::Stopped);
        assert_eq!(row.reason.as_deref(), Some("cannot route"));
        assert_eq!(row.stop_kind, Some(FailureKind::DataSafety));
        assert!(!row.ready);
        assert_eq!(row.reasons, ["stopped: cannot route"]);
        assert_eq!(row.since, 1_700_000_000);
        assert_eq!(
            (row.slot.as_str(), row.stream.as_str()),
            ("orders_slot", "ORDERS")
        );
        assert_eq!(row.events_published, Some(42));
        assert_eq!(row.events_per_second, Some(12.5));
        assert_eq!(row.commit_to_ack_ms, Some(3.0));
        assert_eq!(row.last_error.as_deref(), Some("the last one"));
        assert_eq!(row.href, "/console/p/orders/");
        let json = serde_json::to_value(&row).expect("json");
        assert_eq!(json["phase"], "stopped");
        assert_eq!(json["stop_kind"], "data-safety");

        // Before its first run: no numbers, no sample.
        let row = super::row(&view(PipelineState::Running, None), None);
        assert_eq!(row.phase, Phase::Starting);
        assert_eq!(row.events_published, None);
        assert_eq!(row.events_per_second, None);
        assert_eq!(row.slot_lag_bytes, None);
    }
}
