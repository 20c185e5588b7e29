//! What the relay's continuous audit (`[relay] audit_interval`) found: read by `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::status_doc::AuditStatus;

/// The audit's counters; all zero and not shown while the audit is off.
#[derive(Debug, Default)]
pub struct AuditState {
    /// The audit runs in this relay.
    pub enabled: AtomicBool,
    /// Audits finished (with or without a gap).
    pub runs: AtomicU64,
    /// Events the last audit found missing from the stream (0: none).
    pub missing: AtomicU64,
    /// Events the audit published again (`[relay] audit_heal`).
    pub healed: AtomicU64,
    /// Audits that could not check their window (the WAL gone, a restore running, a server
    /// unreachable).
    pub failed: AtomicU64,
}

impl AuditState {
    /// `/status`'s `audit`, while the audit runs.
    pub fn status(&self) -> Option<AuditStatus> {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.enabled.load(Ordering::Relaxed).then(|| AuditStatus {
            runs: load(&self.runs),
            missing_events: load(&self.missing),
            healed_events: load(&self.healed),
            failures: load(&self.failed),
        })
    }
}
