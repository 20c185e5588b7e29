//! Why the relay loop stopped with an error.

use pgoutput::Lsn;

use crate::frontier::FrontierError;
use crate::route::RouteError;
use crate::stage::{PublishError, SourceError, StoreError};

/// Why the loop stopped with an error. The confirmed position is never past the failure.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The source failed.
    #[error("replication stream failed")]
    Source(#[from] SourceError),
    /// A row could not be routed; the relay stops before its transaction.
    #[error(
        "cannot route outbox row (event id {}) of transaction {xid} (commit LSN {commit_lsn})",
        .event_id.as_deref().unwrap_or("NULL or empty")
    )]
    Route {
        /// The row's event id, when it has one (boxed: keeps the error small).
        event_id: Option<Box<str>>,
        /// Transaction id.
        xid: u32,
        /// Commit LSN of the transaction.
        commit_lsn: Lsn,
        /// Why.
        #[source]
        error: RouteError,
    },
    /// An outbox table no longer matches the configuration (renamed table, renamed, dropped or
    /// retyped mapped column); the relay stops before the transaction that shows it.
    #[error(
        "outbox table no longer matches the configuration (transaction {}, commit LSN {})",
        .xid.map_or_else(|| "?".to_owned(), |x| x.to_string()),
        .commit_lsn.map_or_else(|| "?".to_owned(), |l| l.to_string())
    )]
    Schema {
        /// Transaction id, when inside one.
        xid: Option<u32>,
        /// Commit LSN of the transaction, when inside one.
        commit_lsn: Option<Lsn>,
        /// What changed.
        #[source]
        error: RouteError,
    },
    /// The broker refused a message for good.
    #[error("JetStream refused event {event_id} on subject `{subject}`")]
    Publish {
        /// The event.
        event_id: String,
        /// Its subject.
        subject: String,
        /// Why.
        #[source]
        error: PublishError,
    },
    /// The broker acknowledged events that its own state cannot hold (a forged PubAck, or a
    /// stream deleted, reset or gone back): nothing is stored past them; the session resumes
    /// from the stored checkpoint and publishes them again.
    #[error(
        "acknowledgements up to stream sequence {highest_seq} are not held by the stream ({reason}): not taken as stored, nothing confirmed past checkpoint {stored}"
    )]
    AcksNotHeld {
        /// The highest sequence acknowledged since the last check.
        highest_seq: u64,
        /// What the stream said.
        reason: String,
        /// The checkpoint that stays stored.
        stored: Lsn,
    },
    /// The checkpoint could not be stored.
    #[error("cannot store checkpoint {lsn}")]
    Store {
        /// The position being stored.
        lsn: Lsn,
        /// Why.
        #[source]
        error: StoreError,
    },
    /// The stream broke the protocol's ordering rules.
    #[error("replication stream out of order")]
    Protocol(#[from] FrontierError),
}
