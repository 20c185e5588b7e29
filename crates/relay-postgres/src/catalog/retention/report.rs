//! The retention window as `status --json` and `/status` show it.

use relay_core::check::{CheckReport, check_reports};
use serde::{Deserialize, Serialize};

use super::{RateSource, RetentionWindow, WalRate};

/// The retention window as `status --json` and `/status` show it (see [`RetentionWindow`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetentionReport {
    /// One line: how long a stopped relay has.
    pub headline: String,
    /// The numbers behind it.
    pub numbers: String,
    /// Nothing limits the WAL the slot keeps.
    pub unbounded: bool,
    /// How long a stopped relay has, when bounded.
    pub seconds: Option<f64>,
    /// How long until `max_slot_wal_keep_size` is reached.
    pub wal_seconds: Option<f64>,
    /// How long until `idle_replication_slot_timeout` invalidates the slot.
    pub idle_seconds: Option<f64>,
    /// `max_slot_wal_keep_size`.
    pub max_slot_wal_keep_size_bytes: Option<u64>,
    /// `safe_wal_size`.
    pub safe_wal_bytes: Option<i64>,
    /// The WAL rate.
    pub wal_rate: Option<WalRateReport>,
    /// `wal_sender_timeout`.
    pub wal_sender_timeout_seconds: f64,
    /// `idle_replication_slot_timeout` (PostgreSQL 18+).
    pub idle_replication_slot_timeout_seconds: Option<f64>,
    /// The slot's `wal_status`.
    pub slot_wal_status: Option<String>,
    /// Whether the slot is streamed now.
    pub slot_active: Option<bool>,
    /// `inactive_since` (PostgreSQL 17+).
    pub inactive_since: Option<String>,
    /// Seconds since `inactive_since`.
    pub inactive_seconds: Option<f64>,
    /// How long a takeover takes.
    pub takeover_seconds: Option<f64>,
    /// `[relay] takeover_budget`.
    pub takeover_budget_seconds: f64,
    /// Each check.
    pub checks: Vec<CheckReport>,
}

/// A WAL rate as reports show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WalRateReport {
    /// Bytes per second.
    pub bytes_per_second: f64,
    /// Over how long it was measured.
    pub over_seconds: f64,
    /// `short_sample` or `moving`.
    pub source: String,
}

impl WalRate {
    /// This rate as reports show it.
    #[must_use]
    pub fn report(self) -> WalRateReport {
        WalRateReport {
            bytes_per_second: self.bytes_per_second,
            over_seconds: self.over.as_secs_f64(),
            source: match self.source {
                RateSource::ShortSample => "short_sample",
                RateSource::Moving => "moving",
            }
            .to_owned(),
        }
    }
}

impl RetentionWindow {
    /// For `status --json` and `/status`.
    #[must_use]
    pub fn report(&self) -> RetentionReport {
        let s = &self.facts.settings;
        let slot = self.facts.slot.as_ref();
        RetentionReport {
            headline: self.headline(),
            numbers: self.numbers(),
            unbounded: self.is_unbounded(),
            seconds: self.seconds(),
            wal_seconds: self.wal_seconds(),
            idle_seconds: self.idle_seconds(),
            max_slot_wal_keep_size_bytes: self.limit(),
            safe_wal_bytes: self.safe_wal_bytes(),
            wal_rate: self.wal_rate.map(WalRate::report),
            wal_sender_timeout_seconds: s.wal_sender_timeout.as_secs_f64(),
            idle_replication_slot_timeout_seconds: s
                .idle_replication_slot_timeout
                .map(|d| d.as_secs_f64()),
            slot_wal_status: slot.and_then(|s| s.wal_status.clone()),
            slot_active: slot.map(|s| s.active),
            inactive_since: slot.and_then(|s| s.inactive_since.clone()),
            inactive_seconds: slot.and_then(|s| s.inactive_seconds),
            takeover_seconds: self.takeover().map(|d| d.as_secs_f64()),
            takeover_budget_seconds: self.policy.budget.as_secs_f64(),
            checks: check_reports(&self.checks()),
        }
    }
}
