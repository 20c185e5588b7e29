//! What a running relay knows about itself: metric names (all here, prefix `outbox_relay_`),
//! readiness, the `/status` document, and the log rate limiter; [`otlp`] adds spans to the
//! publisher.
//!
//! Every metric is read at scrape time from the pipeline's atomics ([`PipelineStats`]) and from
//! the sampler's last look at the slot and the stream, so nothing is counted twice. A
//! [`Telemetry`] belongs to one pipeline: nothing here is process-global, and the only IO is the
//! OTLP exporter's own thread. The binary serves it over HTTP and gives it its build
//! ([`BuildInfo`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use relay_core::Lsn;
use relay_core::pipeline::PipelineStats;
use relay_core::route::LoadedContract;
use relay_postgres::catalog::SlotInfo;
use relay_postgres::catalog::retention::RetentionWindow;

pub mod audit;
mod cleanup_report;
mod metrics;
pub mod otlp;
mod rate_limit;
mod status_doc;
#[cfg(test)]
mod tests;
pub use metrics::MetricsCollector;
pub use rate_limit::RateLimit;
pub use status_doc::{
    AuditStatus, CleanupStatus, ContractStatus, NatsStatus, PipelineStatus, PostgresStatus,
    RelayStatus, TableStatus,
};

// Metric names. Counters are exposed with the `_total` suffix, the info metric with `_info`.

/// Counter: outbox rows routed to messages.
pub const EVENTS_RECEIVED: &str = "outbox_relay_events_received";
/// Counter: messages acknowledged by JetStream (duplicates included).
pub const EVENTS_PUBLISHED: &str = "outbox_relay_events_published";
/// Counter: changes that were not outbox inserts (other tables, updates, deletes).
pub const CHANGES_SKIPPED: &str = "outbox_relay_changes_skipped";
/// Counter: logical decoding messages whose prefix no `[[messages]]` entry configures.
pub const MESSAGES_SKIPPED: &str = "outbox_relay_messages_skipped";
/// Counter: acks JetStream flagged as duplicates (already stored under that `Nats-Msg-Id`).
pub const DUPLICATES: &str = "outbox_relay_duplicates_acknowledged";
/// Counter: events not re-published because the stream already held them (restart after a
/// downtime longer than the duplicate window).
pub const ALREADY_PUBLISHED: &str = "outbox_relay_events_already_published";
/// Counter: rows that could not be routed and went to `[relay] dead_letter_subject`.
pub const DEAD_LETTERED: &str = "outbox_relay_events_dead_lettered";
/// Counter, label `contract` (`<name>.<version>`): events checked against the contract.
pub const CONTRACT_CHECKED: &str = "outbox_relay_contract_checked";
/// Counter, label `contract`: events the contract refused (dead-lettered, or the stop).
pub const CONTRACT_REFUSED: &str = "outbox_relay_contract_refused";
/// Counter, label `kind` = `unknown` | `no_stream` | `rejected` | `stream_full` |
/// `out_of_turn`: failed publish attempts.
pub const PUBLISH_ERRORS: &str = "outbox_relay_publish_errors";
/// Counter: re-publishes after an unknown outcome.
pub const PUBLISH_RETRIES: &str = "outbox_relay_publish_retries";
pub const ACKS_NOT_HELD: &str = "outbox_relay_acks_not_held";
pub const STREAM_WENT_BACK: &str = "outbox_relay_stream_went_back";
pub const AUDIT_RUNS: &str = "outbox_relay_audit_runs";
pub const AUDIT_MISSING: &str = "outbox_relay_audit_missing_events";
pub const AUDIT_HEALED: &str = "outbox_relay_audit_healed_events";
pub const AUDIT_FAILED: &str = "outbox_relay_audit_failures";
/// Gauge: events published and awaiting their ack.
pub const OUTSTANDING_ACKS: &str = "outbox_relay_outstanding_acks";
/// Gauge: 1 while the oldest unacknowledged event waits for room in a full stream.
pub const STREAM_FULL: &str = "outbox_relay_stream_full";
/// Histogram: PostgreSQL commit time to JetStream ack, seconds.
pub const COMMIT_TO_ACK: &str = "outbox_relay_commit_to_ack_seconds";
/// Gauge: the stored and confirmed LSN, as a number.
pub const CHECKPOINT_LSN: &str = "outbox_relay_checkpoint_lsn";
/// Gauge: bytes between the stored checkpoint and the position the relay confirmed to the slot:
/// the WAL kept for `outbox-relay restore` (`[relay] replay_retention`; 0 without it).
pub const REPLAY_WINDOW_BYTES: &str = "outbox_relay_replay_window_bytes";
/// Gauge: `pg_current_wal_lsn() - confirmed_flush_lsn` of the slot, bytes.
pub const SLOT_LAG_BYTES: &str = "outbox_relay_slot_lag_bytes";
/// Gauge: WAL the slot keeps on disk (`pg_current_wal_lsn() - restart_lsn`), bytes.
pub const SLOT_RETAINED_WAL_BYTES: &str = "outbox_relay_slot_retained_wal_bytes";
/// Gauge: bytes of WAL that can still be written before the slot is invalidated
/// (`safe_wal_size`; absent when `max_slot_wal_keep_size` is unlimited).
pub const SLOT_SAFE_WAL_SIZE_BYTES: &str = "outbox_relay_slot_safe_wal_size_bytes";
/// Gauge, label `status` = `reserved` | `extended` | `unreserved` | `lost` | `missing`: 1 for the
/// slot's current `wal_status`, 0 for the others.
pub const SLOT_WAL_STATUS: &str = "outbox_relay_slot_wal_status";
/// Gauge: `max_slot_wal_keep_size` in bytes (absent when it is -1, unlimited).
pub const MAX_SLOT_WAL_KEEP_SIZE_BYTES: &str = "outbox_relay_max_slot_wal_keep_size_bytes";
/// Gauge: bytes of WAL the server writes per second, a moving rate over the sampler's last
/// [`WAL_RATE_WINDOW`] of samples.
pub const WAL_RATE: &str = "outbox_relay_wal_rate_bytes_per_second";
/// Gauge: estimated seconds until the slot is invalidated if the relay stops now: the slot's
/// `safe_wal_size` at the WAL rate, or `idle_replication_slot_timeout` (PostgreSQL 18+) if
/// sooner; 0 when the slot is lost. Absent when nothing bounds it (unlimited
/// `max_slot_wal_keep_size`, no idle timeout) or no WAL was written (no estimate).
pub const SLOT_RETENTION: &str = "outbox_relay_slot_retention_seconds";
/// Gauge: `[relay] takeover_budget` in seconds, for alerts on [`SLOT_RETENTION`].
pub const TAKEOVER_BUDGET: &str = "outbox_relay_takeover_budget_seconds";
/// Gauge: seconds since the commit of the newest acknowledged event.
pub const LAST_ACKED_COMMIT_AGE: &str = "outbox_relay_last_acked_commit_age_seconds";
/// Gauge: the stream's last sequence.
pub const STREAM_LAST_SEQUENCE: &str = "outbox_relay_stream_last_sequence";
/// Gauge, label `dependency` = `postgres` | `nats` | `stream`: 1 when connected (postgres:
/// replication streaming; stream: the stream exists).
pub const CONNECTED: &str = "outbox_relay_connected";
/// Counter, label `dependency` = `postgres` | `nats`: reconnects after a lost connection.
pub const RECONNECTS: &str = "outbox_relay_reconnects";
/// Gauge: 1 when `/readyz` answers 200.
pub const READY: &str = "outbox_relay_ready";
/// Info, labels `version` and `commit`: the relay's build ([`BuildInfo`]).
pub const BUILD: &str = "outbox_relay_build";

/// Gauge, label `table`: rows of an outbox table, estimated from `pg_class.reltuples` (of all
/// its partitions).
pub const TABLE_ROWS: &str = "outbox_relay_table_rows_estimate";
/// Gauge, label `table`: bytes of an outbox table with its indexes and TOAST (all partitions).
pub const TABLE_SIZE: &str = "outbox_relay_table_size_bytes";
/// Gauge, label `table`: seconds since the oldest row of the table not yet confirmed was created
/// (by its `created_at`-like column; 0 when every row is confirmed). See
/// `outbox-relay`'s `run::background::spawn_outbox_upkeep` for how "not yet confirmed" is told.
pub const TABLE_OLDEST_UNCONFIRMED: &str = "outbox_relay_table_oldest_unconfirmed_age_seconds";
/// Counter, label `table`: rows deleted or marked by `[outbox.cleanup]`.
pub const CLEANUP_ROWS: &str = "outbox_relay_cleanup_rows";
/// Counter, label `table`: partitions dropped by `[outbox.cleanup] mode = "drop-partitions"`.
pub const CLEANUP_PARTITIONS: &str = "outbox_relay_cleanup_partitions_dropped";
/// Counter, label `table`: cleanup rounds that failed (the log says why).
pub const CLEANUP_ERRORS: &str = "outbox_relay_cleanup_errors";
/// Gauge, label `table`: rows (or detached partitions) cleanup selected that wait for the stored
/// checkpoint to pass them.
pub const CLEANUP_WAITING: &str = "outbox_relay_cleanup_waiting";

/// Over how long the sampler averages the WAL rate behind [`WAL_RATE`] and [`SLOT_RETENTION`]
/// (less right after the start).
pub const WAL_RATE_WINDOW: Duration = Duration::from_secs(300);

/// The build of the relay that runs: [`BUILD`]'s labels and the `/status` document's
/// `version` and `commit`. The binary knows them (its `build.rs`); this crate does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildInfo {
    /// The relay's version.
    pub version: &'static str,
    /// The commit it was built from.
    pub commit: &'static str,
}

/// The stream as last sampled.
#[derive(Debug, Clone, Default)]
pub struct StreamSample {
    /// The stream exists (false only when JetStream said "not found").
    pub present: bool,
    /// Its last sequence.
    pub last_seq: u64,
    /// Messages it holds.
    pub messages: u64,
}

/// One outbox table as last sampled, and what cleanup did to it.
#[derive(Debug, Clone, Default)]
pub struct TableStats {
    /// Rows, estimated (`pg_class.reltuples`).
    pub rows_estimate: Option<f64>,
    /// Bytes with indexes and TOAST.
    pub size_bytes: Option<i64>,
    /// Seconds since the oldest row not yet confirmed was created (0: none); `None` when the
    /// table has no such column.
    pub oldest_unconfirmed_age: Option<f64>,
    /// `delete`, `mark`, `drop-partitions`, when cleanup is on.
    pub cleanup_mode: Option<&'static str>,
    /// Rows deleted or marked.
    pub cleaned_rows: u64,
    /// Partitions dropped.
    pub dropped_partitions: u64,
    /// Rows or partitions waiting for the checkpoint.
    pub waiting: u64,
    /// Failed cleanup rounds.
    pub cleanup_errors: u64,
    /// The last cleanup error.
    pub last_cleanup_error: Option<String>,
}

impl TableStats {
    fn status(&self) -> TableStatus {
        TableStatus {
            rows_estimate: self.rows_estimate,
            size_bytes: self.size_bytes,
            oldest_unconfirmed_age_seconds: self.oldest_unconfirmed_age,
            cleanup: self.cleanup_mode.map(|mode| CleanupStatus {
                mode: mode.to_owned(),
                rows_cleaned: self.cleaned_rows,
                partitions_dropped: self.dropped_partitions,
                waiting_for_checkpoint: self.waiting,
                errors: self.cleanup_errors,
                last_error: self.last_cleanup_error.clone(),
            }),
        }
    }
}

/// Shared state of a running relay, read by `/metrics`, `/readyz` and `/status`.
#[derive(Debug)]
pub struct Telemetry {
    /// The pipeline's counters.
    pub stats: Arc<PipelineStats>,
    /// The slot's name.
    pub slot: String,
    /// The stream's name.
    pub stream: String,
    /// A replication session is streaming now.
    pub streaming: AtomicBool,
    /// Replication sessions started after the first.
    pub pg_reconnects: AtomicU64,
    build: BuildInfo,
    nats: OnceLock<async_nats::Client>,
    stream_sample: Mutex<StreamSample>,
    slot_sample: Mutex<SlotSample>,
    tables: Mutex<std::collections::BTreeMap<String, TableStats>>,
    /// `(table, contract)` of every `[outbox.contracts]` contract (see
    /// [`Telemetry::set_contracts`]).
    contracts: OnceLock<Vec<(String, Arc<LoadedContract>)>>,
    last_error: Mutex<Option<String>>,
    /// The pid of the process holding the slot while this relay waits as its standby.
    standby_for: Mutex<Option<i32>>,
    /// The continuous audit's findings (`[relay] audit_interval`).
    pub audit: audit::AuditState,
    started: Instant,
}

/// The sampler's last view of the slot: its row and its retention window, from one tick.
#[derive(Debug, Clone, Default)]
struct SlotSample {
    /// `None`: the slot does not exist (or was not sampled yet).
    slot: Option<SlotInfo>,
    retention: Option<RetentionWindow>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Telemetry {
    /// State for a relay of build `build` on `slot` publishing into `stream`.
    pub fn new(stats: Arc<PipelineStats>, slot: &str, stream: &str, build: BuildInfo) -> Self {
        Self {
            stats,
            slot: slot.to_owned(),
            stream: stream.to_owned(),
            streaming: AtomicBool::new(false),
            pg_reconnects: AtomicU64::new(0),
            build,
            nats: OnceLock::new(),
            stream_sample: Mutex::new(StreamSample::default()),
            slot_sample: Mutex::new(SlotSample::default()),
            tables: Mutex::new(std::collections::BTreeMap::new()),
            contracts: OnceLock::new(),
            last_error: Mutex::new(None),
            audit: audit::AuditState::default(),
            standby_for: Mutex::new(None),
            started: Instant::now(),
        }
    }

    /// The contracts every router of the process checks against, with their counters.
    pub fn set_contracts(&self, contracts: Vec<(String, Arc<LoadedContract>)>) {
        let _ = self.contracts.set(contracts);
    }

    /// The contracts, each once (a contract two tables share counts for both).
    pub fn contracts(&self) -> Vec<Arc<LoadedContract>> {
        let mut out: Vec<Arc<LoadedContract>> = Vec::new();
        for (_, contract) in self.contracts.get().into_iter().flatten() {
            if !out.iter().any(|c| Arc::ptr_eq(c, contract)) {
                out.push(contract.clone());
            }
        }
        out
    }

    /// `/status`'s `contracts`: each contract with its tables, counts and last refusal.
    fn contracts_status(&self) -> Vec<ContractStatus> {
        let all = self.contracts.get().map(Vec::as_slice).unwrap_or_default();
        self.contracts()
            .iter()
            .map(|c| ContractStatus {
                contract: c.contract().key().to_owned(),
                file: c.file().to_owned(),
                tables: all
                    .iter()
                    .filter(|(_, other)| Arc::ptr_eq(other, c))
                    .map(|(table, _)| table.clone())
                    .collect(),
                checked: c.checked(),
                refused: c.refused(),
                last_refused: c.last_refused(),
            })
            .collect()
    }

    /// The NATS client whose connection state readiness reflects.
    pub fn set_nats(&self, client: async_nats::Client) {
        let _ = self.nats.set(client);
    }

    /// Records the stream as sampled.
    pub fn set_stream(&self, sample: StreamSample) {
        *lock(&self.stream_sample) = sample;
    }

    /// Marks the stream as missing or present, keeping the last sequence.
    pub fn set_stream_present(&self, present: bool) {
        lock(&self.stream_sample).present = present;
    }

    /// Records one sampler tick: the slot (`Some(None)`: it does not exist) and its retention
    /// window, each kept as it was when its query failed (`None`). One lock, so that a scrape
    /// never shows one tick's `safe_wal_size` beside another tick's WAL rate.
    pub fn set_slot_and_retention(
        &self,
        slot: Option<Option<SlotInfo>>,
        window: Option<RetentionWindow>,
    ) {
        let mut sample = lock(&self.slot_sample);
        if let Some(slot) = slot {
            sample.slot = slot;
        }
        if let Some(window) = window {
            sample.retention = Some(window);
        }
    }

    /// Changes what is known about outbox table `table` (`schema.table`).
    pub fn update_table(&self, table: &str, change: impl FnOnce(&mut TableStats)) {
        change(lock(&self.tables).entry(table.to_owned()).or_default());
    }

    /// Every outbox table as last sampled.
    pub fn tables(&self) -> std::collections::BTreeMap<String, TableStats> {
        lock(&self.tables).clone()
    }

    /// Records why the last session ended (shown by `/readyz` and `/status`).
    pub fn set_last_error(&self, error: Option<String>) {
        *lock(&self.last_error) = error;
    }

    /// Records that this relay waits as a standby while the process `holder` streams the slot
    /// (`None`: it waits no longer). `/readyz` and `/status` give it as the reason it is not
    /// ready, instead of a slot that is not streaming.
    pub fn set_standby(&self, holder: Option<i32>) {
        *lock(&self.standby_for) = holder;
    }

    /// The pid of the process streaming the slot while this relay waits as its standby.
    pub fn standby_for(&self) -> Option<i32> {
        *lock(&self.standby_for)
    }

    fn nats_connected(&self) -> bool {
        self.nats.get().is_some_and(|c| {
            matches!(
                c.connection_state(),
                async_nats::connection::State::Connected
            )
        })
    }

    fn nats_reconnects(&self) -> u64 {
        self.nats.get().map_or(0, |c| {
            c.statistics()
                .connects
                .load(Ordering::Relaxed)
                .saturating_sub(1)
        })
    }

    /// Whether the relay is ready, and if not, why.
    pub fn readiness(&self) -> (bool, Vec<String>) {
        let mut reasons = Vec::new();
        if !self.streaming.load(Ordering::Relaxed) {
            reasons.push(self.not_streaming_reason());
        }
        if !self.nats_connected() {
            reasons.push("nats: not connected".into());
        }
        if !lock(&self.stream_sample).present {
            reasons.push(format!("nats: stream `{}` not found", self.stream));
        }
        (reasons.is_empty(), reasons)
    }

    /// Why no session streams: a standby waits for the process streaming the slot, or the
    /// last session ended (with its error, if any).
    fn not_streaming_reason(&self) -> String {
        if let Some(pid) = self.standby_for() {
            return format!(
                "standby: slot `{}` is held by another process (pid {pid})",
                self.slot
            );
        }
        let mut reason = format!("postgres: slot `{}` is not streaming", self.slot);
        if let Some(error) = lock(&self.last_error).as_ref() {
            reason.push_str(&format!(" (last error: {error})"));
        }
        reason
    }

    /// Bytes of WAL the slot's confirmed position is behind the server's, as last sampled.
    pub fn slot_lag_bytes(&self) -> Option<i64> {
        lock(&self.slot_sample)
            .slot
            .as_ref()
            .and_then(|s| s.lag_bytes)
    }

    /// The `/status` document, as served (keys sorted, as a JSON value has them).
    pub fn status(&self) -> serde_json::Value {
        serde_json::to_value(self.status_report()).unwrap_or_default()
    }

    /// The `/status` document, typed.
    pub fn status_report(&self) -> RelayStatus {
        let (ready, reasons) = self.readiness();
        let SlotSample { slot, retention } = lock(&self.slot_sample).clone();
        RelayStatus {
            version: self.build.version.to_owned(),
            commit: self.build.commit.to_owned(),
            uptime_seconds: self.started.elapsed().as_secs(),
            ready,
            reasons,
            postgres: PostgresStatus {
                slot: self.slot.clone(),
                streaming: self.streaming.load(Ordering::Relaxed),
                reconnects: self.pg_reconnects.load(Ordering::Relaxed),
                last_error: lock(&self.last_error).clone(),
                checkpoint_lsn: Lsn(self.stats.confirmed_lsn.load(Ordering::Relaxed)).to_string(),
                slot_state: slot.map(|s| s.report()),
                retention: retention.as_ref().map(RetentionWindow::report),
                tables: lock(&self.tables)
                    .iter()
                    .map(|(name, t)| (name.clone(), t.status()))
                    .collect(),
            },
            nats: self.nats_status(),
            pipeline: self.pipeline_status(),
            contracts: self.contracts_status(),
            audit: self.audit.status(),
        }
    }

    fn nats_status(&self) -> NatsStatus {
        let stream = lock(&self.stream_sample).clone();
        NatsStatus {
            connected: self.nats_connected(),
            reconnects: self.nats_reconnects(),
            stream: self.stream.clone(),
            stream_present: stream.present,
            stream_last_sequence: stream.last_seq,
            stream_messages: stream.messages,
        }
    }

    fn pipeline_status(&self) -> PipelineStatus {
        let stats = &self.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let last_commit = load(&stats.last_acked_commit_unix_micros);
        PipelineStatus {
            events_received: load(&stats.events_received),
            events_published: load(&stats.events_published),
            changes_skipped: load(&stats.changes_skipped),
            duplicates_acknowledged: load(&stats.duplicates),
            publish_retries: load(&stats.publish_retries),
            outstanding_acks: load(&stats.in_flight),
            last_stream_seq: load(&stats.last_stream_seq),
            last_acked_commit_time: (last_commit > 0).then(|| {
                humantime_serde::re::humantime::format_rfc3339_micros(
                    UNIX_EPOCH + Duration::from_micros(last_commit),
                )
                .to_string()
            }),
        }
    }
}

/// Seconds since a Unix-epoch microsecond timestamp (0 when unset).
fn age_seconds(unix_micros: u64) -> f64 {
    if unix_micros == 0 {
        return 0.0;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH + Duration::from_micros(unix_micros))
        .unwrap_or_default()
        .as_secs_f64()
}
