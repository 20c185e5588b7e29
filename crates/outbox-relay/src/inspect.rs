//! Read-only looks at the slot, the checkpoint and the stream, shared by `status`, the
//! metrics sampler and `validate --connect`.

use std::str::FromStr;

use async_nats::jetstream;
use relay_core::Lsn;
use serde_json::json;
use tokio_postgres::Client;

/// A row of `pg_replication_slots`, with lag computed against the server's WAL position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
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
    pub confirmed_flush_lsn: Option<Lsn>,
    /// Oldest WAL kept.
    pub restart_lsn: Option<Lsn>,
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`.
    pub lag_bytes: Option<i64>,
    /// `pg_current_wal_lsn() - restart_lsn`.
    pub retained_bytes: Option<i64>,
    /// `safe_wal_size` (NULL when `max_slot_wal_keep_size = -1`).
    pub safe_wal_size: Option<i64>,
}

impl SlotInfo {
    /// For `/status` and `status --json`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "slot_type": self.slot_type,
            "plugin": self.plugin,
            "database": self.database,
            "active_pid": self.active_pid,
            "wal_status": self.wal_status,
            "confirmed_flush_lsn": self.confirmed_flush_lsn.map(|l| l.to_string()),
            "restart_lsn": self.restart_lsn.map(|l| l.to_string()),
            "lag_bytes": self.lag_bytes,
            "retained_wal_bytes": self.retained_bytes,
            "safe_wal_size": self.safe_wal_size,
        })
    }
}

fn lsn(text: Option<String>) -> Option<Lsn> {
    text.and_then(|t| Lsn::from_str(&t).ok())
}

/// The slot, or `None` when it does not exist.
pub async fn slot(client: &Client, slot: &str) -> Result<Option<SlotInfo>, tokio_postgres::Error> {
    // pg_current_wal_lsn() fails during recovery (a standby): lag is then unknown.
    let row = client
        .query_opt(
            "SELECT slot_type, plugin, database, active_pid, wal_status, \
                    confirmed_flush_lsn::text, restart_lsn::text, \
                    CASE WHEN pg_is_in_recovery() THEN NULL \
                         ELSE (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint END, \
                    CASE WHEN pg_is_in_recovery() THEN NULL \
                         ELSE (pg_current_wal_lsn() - restart_lsn)::bigint END, \
                    safe_wal_size \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|r| SlotInfo {
        slot_type: r.get(0),
        plugin: r.get(1),
        database: r.get(2),
        active_pid: r.get(3),
        wal_status: r.get(4),
        confirmed_flush_lsn: lsn(r.get(5)),
        restart_lsn: lsn(r.get(6)),
        lag_bytes: r.get(7),
        retained_bytes: r.get(8),
        safe_wal_size: r.get(9),
    }))
}

/// The stored checkpoint: position and seconds since it was stored. `Ok(None)` when the table
/// or the row does not exist.
pub async fn checkpoint(
    client: &Client,
    slot: &str,
) -> Result<Option<(Lsn, f64)>, tokio_postgres::Error> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('outbox_relay.checkpoint') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let row = client
        .query_opt(
            "SELECT confirmed_lsn::text, extract(epoch FROM now() - updated_at)::float8 \
             FROM outbox_relay.checkpoint WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.and_then(|r| lsn(r.get(0)).map(|l| (l, r.get::<_, f64>(1)))))
}

/// What a stream lookup found.
#[derive(Debug)]
pub enum StreamLookup {
    /// The stream and its info.
    Found(Box<jetstream::stream::Info>),
    /// JetStream answered: no such stream.
    NotFound,
    /// JetStream is not enabled on the server.
    NotEnabled(String),
    /// No answer (disconnected, timeout).
    Failed(String),
}

/// Looks up `name`.
pub async fn stream(context: &jetstream::Context, name: &str) -> StreamLookup {
    use jetstream::context::GetStreamErrorKind;
    match context.get_stream(name).await {
        Ok(mut s) => match s.info().await {
            Ok(info) => StreamLookup::Found(Box::new(info.clone())),
            Err(e) => StreamLookup::Failed(e.to_string()),
        },
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(js)
                if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                StreamLookup::NotFound
            }
            GetStreamErrorKind::JetStream(js)
                if js.error_code() == jetstream::ErrorCode::JETSTREAM_NOT_ENABLED =>
            {
                StreamLookup::NotEnabled(e.to_string())
            }
            _ => StreamLookup::Failed(e.to_string()),
        },
    }
}
