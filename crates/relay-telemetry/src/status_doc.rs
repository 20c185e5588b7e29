//! The `/status` document a running relay serves, typed: the relay builds it from its state and
//! `outbox-relay status` reads it back over HTTP. It is served (and echoed by `status --json`)
//! as a JSON value, so its keys come out sorted whatever the field order here.

use std::collections::BTreeMap;

use relay_core::route::RefusedEvent;
use relay_postgres::catalog::SlotReport;
use relay_postgres::catalog::retention::RetentionReport;
use serde::{Deserialize, Serialize};

/// The `/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelayStatus {
    /// The relay's version.
    pub version: String,
    /// The commit it was built from.
    pub commit: String,
    /// Seconds since it started.
    pub uptime_seconds: u64,
    /// What `/readyz` answers.
    pub ready: bool,
    /// Why it is not ready.
    pub reasons: Vec<String>,
    /// The replication side.
    pub postgres: PostgresStatus,
    /// The broker side.
    pub nats: NatsStatus,
    /// The pipeline's counters.
    pub pipeline: PipelineStatus,
    /// Each `[outbox.contracts]` contract.
    pub contracts: Vec<ContractStatus>,
    /// The continuous audit (`[relay] audit_interval`), when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditStatus>,
}

/// `/status`'s `audit`: what the continuous audit found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditStatus {
    /// Audits finished.
    pub runs: u64,
    /// Events the last audit found missing from the stream.
    pub missing_events: u64,
    /// Events it published again (`[relay] audit_heal`).
    pub healed_events: u64,
    /// Audits that could not check their window.
    pub failures: u64,
}

/// `/status`'s `postgres`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PostgresStatus {
    /// The slot's name.
    pub slot: String,
    /// A replication session is streaming now.
    pub streaming: bool,
    /// Replication sessions started after the first.
    pub reconnects: u64,
    /// Why the last session ended.
    pub last_error: Option<String>,
    /// The confirmed position.
    pub checkpoint_lsn: String,
    /// The slot as last sampled; `None` when it does not exist (or was not sampled yet).
    pub slot_state: Option<SlotReport>,
    /// The retention window as last sampled.
    pub retention: Option<RetentionReport>,
    /// Each outbox table, by `schema.table`.
    pub tables: BTreeMap<String, TableStatus>,
}

/// One outbox table as last sampled, and what cleanup did to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableStatus {
    /// Rows, estimated.
    pub rows_estimate: Option<f64>,
    /// Bytes with indexes and TOAST.
    pub size_bytes: Option<i64>,
    /// Seconds since the oldest row not yet confirmed was created (0: none).
    pub oldest_unconfirmed_age_seconds: Option<f64>,
    /// What cleanup did, when it is on.
    pub cleanup: Option<CleanupStatus>,
}

/// What `[outbox.cleanup]` did to one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupStatus {
    /// `delete`, `mark`, `drop-partitions`.
    pub mode: String,
    /// Rows deleted or marked.
    pub rows_cleaned: u64,
    /// Partitions dropped.
    pub partitions_dropped: u64,
    /// Rows or partitions waiting for the checkpoint.
    pub waiting_for_checkpoint: u64,
    /// Failed cleanup rounds.
    pub errors: u64,
    /// The last cleanup error.
    pub last_error: Option<String>,
}

/// `/status`'s `nats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatsStatus {
    /// The client is connected.
    pub connected: bool,
    /// Reconnections so far.
    pub reconnects: u64,
    /// The stream's name.
    pub stream: String,
    /// The stream exists.
    pub stream_present: bool,
    /// Its last sequence.
    pub stream_last_sequence: u64,
    /// Messages it holds.
    pub stream_messages: u64,
}

/// `/status`'s `pipeline`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineStatus {
    /// Changes decoded from the WAL.
    pub events_received: u64,
    /// Events published.
    pub events_published: u64,
    /// Changes that are no events.
    pub changes_skipped: u64,
    /// Publishes the stream acknowledged as duplicates.
    pub duplicates_acknowledged: u64,
    /// Publishes retried.
    pub publish_retries: u64,
    /// Publishes not acknowledged yet.
    pub outstanding_acks: u64,
    /// The last stream sequence acknowledged.
    pub last_stream_seq: u64,
    /// The commit time of the last acknowledged transaction.
    pub last_acked_commit_time: Option<String>,
}

/// One contract with its tables, counts and last refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractStatus {
    /// The contract's key.
    pub contract: String,
    /// The file it was read from.
    pub file: String,
    /// The tables whose events it checks.
    pub tables: Vec<String>,
    /// Events checked.
    pub checked: u64,
    /// Events refused.
    pub refused: u64,
    /// The last event it refused.
    pub last_refused: Option<RefusedEvent>,
}
