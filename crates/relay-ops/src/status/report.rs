//! The status document's types: `status --json` prints [`StatusDoc`] as a JSON value (keys
//! sorted), and `outbox-relay status` prints its text from the same fields.

use std::collections::BTreeMap;

use relay_nats::DurabilityReport;
use relay_postgres::catalog::SlotReport;
use relay_postgres::catalog::failover::FailoverReport;
use relay_postgres::catalog::retention::RetentionReport;
use relay_postgres::checkpoint::ReplayWindowReport;
use relay_telemetry::{CleanupStatus, RelayStatus};
use serde::Serialize;

/// The document `status --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusDoc {
    /// The slot's name.
    pub slot: String,
    /// The slot; `None` when it does not exist.
    pub slot_state: Option<SlotReport>,
    /// The stored checkpoint; `None` when none is stored.
    pub checkpoint: Option<CheckpointReport>,
    /// The slot's confirmed position minus the stored checkpoint (> 0: the slot is ahead).
    pub slot_minus_checkpoint_bytes: Option<i64>,
    /// How long a stopped relay has before the slot is invalidated.
    pub retention: Section<RetentionReport>,
    /// The WAL kept behind the checkpoint for `outbox-relay restore`.
    pub replay_window: Section<ReplayWindowReport>,
    /// What a failover needs.
    pub failover: Section<FailoverReport>,
    /// The stream's name.
    pub stream: String,
    /// The stream.
    pub stream_state: StreamState,
    /// Where a running relay answers, when known.
    pub relay: Option<String>,
    /// What it answered on `/status`; `None` without an address or when it answered no
    /// `/status` document.
    pub relay_status: Option<RelayAnswer>,
    /// Each outbox table, by `schema.table`.
    pub tables: BTreeMap<String, Section<TableReport>>,
    /// Each backfill of the slot.
    pub backfills: Section<Vec<BackfillReport>>,
}

/// A section, or why it could not be read (`{"error": …}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Section<T> {
    /// It could not be read.
    Failed {
        /// Why.
        error: String,
    },
    /// Read.
    Read(T),
}

impl<T> Section<T> {
    /// `Err(error)` or `Ok(section)`.
    pub fn as_result(&self) -> Result<&T, &str> {
        match self {
            Section::Failed { error } => Err(error),
            Section::Read(section) => Ok(section),
        }
    }
}

/// The stored checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointReport {
    /// Its position.
    pub lsn: String,
    /// Seconds since it was stored.
    pub stored_seconds_ago: f64,
}

/// The stream: its state, missing (`{"present": false}`), or why it is unknown.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StreamState {
    /// It cannot be looked at.
    Failed {
        /// Why.
        error: String,
    },
    /// It exists.
    Found(Box<StreamFound>),
    /// It does not exist; `present` is `false`.
    Missing {
        /// `false`.
        present: bool,
    },
}

/// A stream that exists.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamFound {
    /// `true`.
    pub present: bool,
    /// Its last sequence.
    pub last_sequence: u64,
    /// Messages it holds.
    pub messages: u64,
    /// Its subjects.
    pub subjects: Vec<String>,
    /// How durable it is.
    pub durability: DurabilityReport,
}

/// What a running relay answered on `/status`: its document, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RelayAnswer {
    /// It answered an error or not at all.
    Failed {
        /// Why.
        error: String,
    },
    /// Its `/status` document.
    Status(Box<RelayStatus>),
}

impl RelayAnswer {
    /// Its `/status` document, when it answered one.
    #[must_use]
    pub fn status(&self) -> Option<&RelayStatus> {
        match self {
            RelayAnswer::Status(status) => Some(status),
            RelayAnswer::Failed { .. } => None,
        }
    }
}

/// One outbox table as sampled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableReport {
    /// Rows, estimated.
    pub rows_estimate: f64,
    /// Bytes with indexes and TOAST.
    pub size_bytes: i64,
    /// Seconds since the oldest row not yet confirmed was created (0: none); `None` when the
    /// table has no such column.
    pub oldest_unconfirmed_age_seconds: Option<f64>,
    /// What measured it: `relay`, `position map`, or the oldest row.
    pub oldest_unconfirmed_measured_by: String,
    /// Its `[outbox.cleanup]`, when on.
    pub cleanup: Option<TableCleanup>,
}

/// A table's `[outbox.cleanup]` and what a running relay says it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableCleanup {
    /// `delete`, `mark`, `drop-partitions`.
    pub mode: String,
    /// How long confirmed rows are kept.
    pub retain_seconds: u64,
    /// What the running relay did; `None` without one.
    pub running: Option<CleanupStatus>,
}

/// Where a backfill is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackfillState {
    /// Done.
    Finished,
    /// Unfinished, and its cursor has not moved for a while.
    Stopped,
    /// Unfinished, and moving.
    Running,
}

/// One backfill of the slot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackfillReport {
    /// Its table.
    pub table: String,
    /// Its `WHERE` filter, when it has one.
    pub filter: Option<String>,
    /// The relay's backfill at slot creation.
    pub on_create: bool,
    /// Where it is.
    pub state: BackfillState,
    /// Rows done.
    pub rows_done: i64,
    /// Rows it expects.
    pub rows_estimate: Option<i64>,
    /// Percent done, when the estimate is known.
    pub percent: Option<f64>,
    /// The key column it walks.
    pub key_column: String,
    /// The last key done.
    pub last_key: Option<String>,
    /// The key it stops at.
    pub end_key: Option<String>,
    /// When it started.
    pub started_at: String,
    /// When it finished.
    pub finished_at: Option<String>,
    /// Seconds since its cursor last moved, rounded.
    pub updated_seconds_ago: f64,
}
