//! `status`' broker and running-relay lines: the stream's durability, then what a running relay
//! says about itself on `/status` (readiness, the pipeline, each contract).

use relay_core::check::Verdict;
use relay_nats::{DurabilityReport, ServerSync, Storage};
use relay_ops::status::report::{RelayAnswer, StatusDoc};
use relay_telemetry::{ContractStatus, RelayStatus};

use super::opt;

/// The stream's durability (see `relay_nats::Durability`): a summary, then each warning with
/// its hint, as `validate --connect` prints them.
pub(super) fn durability_lines(d: &DurabilityReport) -> Vec<String> {
    let sync = match &d.server_sync {
        Some(ServerSync::Always { .. }) => "server sync always",
        Some(ServerSync::Interval { .. }) => "server sync interval",
        Some(ServerSync::Unknown { .. }) => "server sync unknown",
        None => "server sync n/a",
    };
    let storage = match d.storage {
        Storage::File => "file",
        Storage::Memory => "memory",
    };
    let mut out = vec![format!(
        "  durability: {storage} storage, {} replica(s), persist_mode {}, {sync}",
        d.replicas, d.persist_mode
    )];
    for check in d.checks.iter().filter(|c| c.verdict == Verdict::Warn) {
        out.push(format!("  WARN  {}: {}", check.check, check.detail));
        out.push(format!("        hint: {}", opt(&check.hint)));
    }
    out
}

/// Where a running relay answers and what it says on `/status`.
pub(super) fn relay_lines(doc: &StatusDoc) -> Vec<String> {
    let Some(addr) = &doc.relay else {
        return vec!["relay: no [http] listen configured (pass --relay host:port)".to_owned()];
    };
    match &doc.relay_status {
        Some(RelayAnswer::Failed { error }) => vec![format!("relay {addr}: {error}")],
        Some(RelayAnswer::Status(status)) => status_lines(addr, status),
        // It answered, but no `/status` document: nothing known.
        None => vec![
            format!("relay {addr}: NOT READY (version -, up -s)"),
            "  published -, outstanding acks -, last stream seq -, last acknowledged commit -"
                .to_owned(),
        ],
    }
}

fn status_lines(addr: &str, relay: &RelayStatus) -> Vec<String> {
    let mut out = vec![format!(
        "relay {addr}: {} (version {}, up {}s)",
        if relay.ready { "ready" } else { "NOT READY" },
        relay.version,
        relay.uptime_seconds
    )];
    out.extend(relay.reasons.iter().map(|r| format!("  reason: {r}")));
    let p = &relay.pipeline;
    out.push(format!(
        "  published {}, outstanding acks {}, last stream seq {}, last acknowledged commit {}",
        p.events_published,
        p.outstanding_acks,
        p.last_stream_seq,
        opt(&p.last_acked_commit_time)
    ));
    out.extend(relay.contracts.iter().flat_map(contract_lines));
    if let Some(audit) = &relay.audit {
        out.push(format!(
            "  audit: {} runs, {} events missing at the last, {} published again, {} could not check{}",
            audit.runs,
            audit.missing_events,
            audit.healed_events,
            audit.failures,
            if audit.missing_events > 0 {
                " (GAP: see the relay's log for the events and `outbox-relay verify`)"
            } else {
                ""
            }
        ));
    }
    out
}

/// A contract's counts and the last event it refused (`/status`'s `contracts`).
fn contract_lines(c: &ContractStatus) -> Vec<String> {
    let mut out = vec![format!(
        "  contract {} ({}): {} checked, {} refused",
        c.contract, c.file, c.checked, c.refused
    )];
    if let Some(last) = &c.last_refused {
        out.push(format!(
            "    last refused: event {} in {}: {}",
            last.event_id, last.table, last.reason
        ));
    }
    out
}
