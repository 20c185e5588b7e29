//! The message the relay publishes for one outbox row, and the header names it carries.
//!
//! Header names are part of the relay's public contract: consumers (and `outbox-consumer`) read
//! them. They are defined once, in `outbox-contract`, which the consumer library uses too. See
//! `docs/message-format.md`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use pgoutput::Lsn;

pub use outbox_contract::{
    HEADER_BACKFILL, HEADER_COMMIT_LSN, HEADER_COMMIT_TIME, HEADER_EVENT_ID,
    HEADER_EXPECTED_LAST_MSG_ID, HEADER_EXPECTED_LAST_SEQUENCE, HEADER_EXPECTED_STREAM,
    HEADER_MSG_ID, HEADER_TABLE, HEADER_TX_INDEX, HEADER_XID,
};

/// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 UTC).
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

/// Transaction context shared by every event of one transaction.
#[derive(Debug, Clone)]
pub struct TxContext {
    /// Transaction id.
    pub xid: u32,
    /// LSN of the commit record (pgoutput Begin `final_lsn`).
    pub commit_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 UTC.
    pub commit_time_micros: i64,
    /// `commit_lsn` rendered once per transaction.
    pub commit_lsn_text: Arc<str>,
    /// Commit time rendered once per transaction.
    pub commit_time_text: Arc<str>,
    /// `xid` rendered once per transaction.
    pub xid_text: Arc<str>,
}

impl TxContext {
    /// Context for the transaction a pgoutput Begin announces.
    pub fn new(xid: u32, commit_lsn: Lsn, commit_time_micros: i64) -> Self {
        Self {
            xid,
            commit_lsn,
            commit_time_micros,
            commit_lsn_text: commit_lsn.to_string().into(),
            commit_time_text: format_pg_timestamp(commit_time_micros).into(),
            xid_text: xid.to_string().into(),
        }
    }

    /// Commit time as wall-clock time.
    pub fn commit_time(&self) -> SystemTime {
        pg_time_to_system(self.commit_time_micros)
    }
}

/// Converts microseconds since 2000-01-01 UTC to `SystemTime`.
pub fn pg_time_to_system(micros: i64) -> SystemTime {
    let epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
    let offset = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        epoch + offset
    } else {
        epoch.checked_sub(offset).unwrap_or(UNIX_EPOCH)
    }
}

/// Renders a PostgreSQL timestamp (µs since 2000) as RFC 3339 UTC with microseconds.
pub fn format_pg_timestamp(micros: i64) -> String {
    humantime::format_rfc3339_micros(pg_time_to_system(micros)).to_string()
}

/// One JetStream message built from one outbox row.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboundMessage {
    /// Subject from the mapping's template.
    pub subject: String,
    /// Event id: the `Nats-Msg-Id`, stable across re-sends.
    pub event_id: String,
    /// Headers other than `Nats-Msg-Id`, in a fixed order.
    pub headers: Vec<(Arc<str>, Arc<str>)>,
    /// How many leading `headers` every event of this transaction and table shares, as the same
    /// `Arc`s (commit LSN, xid, commit time, table): a publisher may prepare them once per
    /// transaction instead of once per event.
    pub shared_headers: usize,
    /// Message body.
    pub payload: Bytes,
    /// The source table, `schema.table`.
    pub table: Arc<str>,
    /// LSN of the commit record of the row's transaction.
    pub commit_lsn: Lsn,
    /// Commit time of the row's transaction, µs since 2000-01-01 UTC (for latency metrics,
    /// without parsing the header back).
    pub commit_time_micros: i64,
}

impl OutboundMessage {
    /// A message of table `public.outbox` with no header but its id, committed at `commit_lsn`:
    /// what tests and tools that publish without a route (the benchmarks) start from.
    pub fn bare(
        subject: impl Into<String>,
        event_id: impl Into<String>,
        payload: Bytes,
        commit_lsn: Lsn,
    ) -> Self {
        Self {
            subject: subject.into(),
            event_id: event_id.into(),
            headers: Vec::new(),
            shared_headers: 0,
            payload,
            table: "public.outbox".into(),
            commit_lsn,
            commit_time_micros: 0,
        }
    }

    /// The value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        if name.eq_ignore_ascii_case(HEADER_MSG_ID) {
            return Some(&self.event_id);
        }
        self.headers
            .iter()
            .find(|(n, _)| n.as_ref() == name)
            .map(|(_, v)| v.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_timestamps_render_as_rfc3339_utc() {
        assert_eq!(format_pg_timestamp(0), "2000-01-01T00:00:00.000000Z");
        // 2026-11-29T11:38:44.123456Z
        let micros = (1_795_952_324_i64 - 946_684_800) * 1_000_000 + 123_456;
        assert_eq!(format_pg_timestamp(micros), "2026-11-29T11:38:44.123456Z");
        assert_eq!(
            format_pg_timestamp(-1_000_000),
            "1999-12-31T23:59:59.000000Z"
        );
    }
}
