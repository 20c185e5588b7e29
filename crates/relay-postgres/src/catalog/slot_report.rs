//! A slot as `/status` and `status --json` show it.

/// A slot as `/status` and `status --json` show it (see [`super::SlotInfo`]; positions as text).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlotReport {
    /// `logical` or `physical`.
    pub slot_type: String,
    /// Output plugin.
    pub plugin: Option<String>,
    /// Database the slot belongs to.
    pub database: Option<String>,
    /// Backend pid streaming from it now.
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved`, `lost`.
    pub wal_status: Option<String>,
    /// Confirmed position.
    pub confirmed_flush_lsn: Option<String>,
    /// Oldest WAL kept.
    pub restart_lsn: Option<String>,
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`.
    pub lag_bytes: Option<i64>,
    /// `pg_current_wal_lsn() - restart_lsn`.
    pub retained_wal_bytes: Option<i64>,
    /// `safe_wal_size` (NULL when `max_slot_wal_keep_size = -1`).
    pub safe_wal_size: Option<i64>,
}
