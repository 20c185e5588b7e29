//! The three IO boundaries of the pipeline, as traits: where changes come from, where messages
//! go, and where progress is kept. Production implementations live in `relay-postgres` and
//! `relay-nats`; tests use in-memory ones.

use std::future::Future;
use std::sync::Arc;

use pgoutput::{LogicalMessage, Lsn};

use crate::message::OutboundMessage;
use crate::route::MessageLimits;

mod hook;
mod inert;

pub use hook::{AckWatch, PublishHook, PublishHooks, Settling, Watches};
pub use inert::{DryRunPublisher, NoStore, WouldPublish};

/// What a [`ChangeSource`] yields, in WAL order. Begin and Commit are split out because the
/// replication client already parses them; every other pgoutput message arrives decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceEvent {
    /// A transaction starts.
    Begin {
        /// Transaction id.
        xid: u32,
        /// LSN of its commit record.
        final_lsn: Lsn,
        /// Commit time, µs since 2000-01-01 UTC.
        commit_time_micros: i64,
    },
    /// Any other decoded pgoutput message (Relation, Insert, Update, Delete, ...).
    Message(LogicalMessage),
    /// The transaction ends.
    Commit {
        /// LSN of the commit record.
        commit_lsn: Lsn,
        /// End of the commit record: the position to confirm once the transaction is delivered.
        end_lsn: Lsn,
    },
    /// The server's WAL position while no transaction is being sent.
    KeepAlive {
        /// Server WAL position.
        wal_end: Lsn,
    },
}

/// Classifies an error for the supervisor: retry (reconnect) or stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Worth retrying after a backoff (connection lost, server restarting, timeouts).
    Transient,
    /// Retrying cannot help until an operator acts (bad config, refused login).
    Fatal,
    /// The replication slot is gone or invalidated: continuing with a new one would skip
    /// events, so the relay stops and an operator reconciles.
    SlotLost,
    /// Another process streams the replication slot (it admits one reader): nothing is wrong,
    /// the relay waits as that process's standby and tries again soon.
    SlotInUse,
}

/// A failure at one of the pipeline's IO boundaries (the change source, the checkpoint store):
/// how the supervisor should treat it, what happened, and why.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct BoundaryError {
    /// Retry or stop.
    pub class: ErrorClass,
    /// What happened, naming the slot, publication, table or LSN involved.
    pub message: String,
    /// The underlying error.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl BoundaryError {
    /// An error of `class`.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
}

/// A failure of the change source.
pub type SourceError = BoundaryError;

/// A failure of the checkpoint store.
pub type StoreError = BoundaryError;

/// Committed changes in commit order.
pub trait ChangeSource: Send {
    /// The next event; `Ok(None)` when the stream ended cleanly. Must be cancel-safe: the
    /// pipeline polls it inside `select!`.
    fn next(&mut self) -> impl Future<Output = Result<Option<SourceEvent>, SourceError>> + Send;

    /// Everything before `lsn` is delivered and stored: the server may recycle that WAL.
    /// Called only with increasing values, and only after the checkpoint store saved `lsn`.
    fn confirm(&mut self, lsn: Lsn);
}

/// What JetStream said about a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubReceipt {
    /// Stream sequence of the message (of the first copy, for a duplicate).
    pub stream_seq: u64,
    /// JetStream recognized the `Nats-Msg-Id` and did not store a second copy.
    pub duplicate: bool,
}

/// What the broker's state says of acknowledgements ([`Publisher::check_acks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckCheck {
    /// The stream exists and its last sequence is at or past every acknowledged one.
    Held,
    /// The stream cannot hold them: it does not exist, or its last sequence is before the
    /// highest acknowledged one. What it said.
    NotHeld(String),
    /// The stream could not be asked now (a timeout, a reconnect): asked again at the next
    /// checkpoint; nothing is stored past them meanwhile.
    Unknown(String),
}

/// A failure to publish one message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct PublishError {
    /// How the pipeline should treat it.
    pub kind: PublishErrorKind,
    /// What happened.
    pub message: String,
    /// The server closed the connection right after a protocol error about what this client
    /// sent (`-ERR 'maximum control line exceeded'`, `'Maximum Payload Violation'`), while this
    /// message's outcome was pending. The outcome is unknown like any connection loss, but a
    /// message that meets this on every send is the cause: see
    /// [`Publisher::max_server_closes`].
    pub closed_by_server: bool,
}

/// Publish failure classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishErrorKind {
    /// Outcome unknown (timeout, connection lost): publish again with the same `Nats-Msg-Id`.
    Unknown,
    /// No stream answered (no responders): a stream leader election, or no stream captures
    /// the subject. Retried for a grace period, then fatal.
    NoStream,
    /// The broker refused the message for good (too large, permissions, another stream).
    /// Fatal.
    Rejected,
    /// The stream is at one of its limits (`max_msgs`, `max_bytes`, `max_msgs_per_subject` with
    /// `discard: new`) or out of storage, and stored nothing: a definite refusal, not an
    /// unknown outcome. Not the row's fault: re-sent in commit order once there is room, never
    /// dead-lettered, never skipped.
    StreamFull,
    /// The stream refused the message because its predecessor in commit order was not the
    /// stream's last message (`Nats-Expected-Last-Msg-Id`, see [`Publisher::send`]): stored
    /// nothing. Re-sent in commit order after everything before it is settled.
    OutOfTurn,
    /// The stream already holds this event id with a different subject or payload: two outbox
    /// rows share an id. Fatal, or dead-lettered when a dead-letter subject is set.
    Collision,
}

impl PublishError {
    /// A publish error of `kind`.
    pub fn new(kind: PublishErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            closed_by_server: false,
        }
    }

    /// An unknown outcome: the server closed the connection over a protocol error after the
    /// message was sent (see [`PublishError::closed_by_server`]).
    pub fn closed_by_server(message: impl Into<String>) -> Self {
        Self {
            closed_by_server: true,
            ..Self::new(PublishErrorKind::Unknown, message)
        }
    }
}

/// The broker side. `Ok` from the ack future means stored by JetStream, never merely sent.
pub trait Publisher: Clone + Send + Sync + 'static {
    /// Resolves when the broker acknowledged (or refused) the message.
    type Ack: Future<Output = Result<PubReceipt, PublishError>> + Send + 'static;

    /// Hands `msg` to the broker connection, in call order, returning its pending ack. The ack
    /// future may keep `msg` (a reference count, no copy).
    ///
    /// `after` keeps commit order under broker faults: when it is `Some(id)`, the message
    /// published just before this one (event id `id`) is not yet known to be stored, and the
    /// broker must store this one only if the stream's last message is `id`
    /// (`Nats-Expected-Last-Msg-Id`), answering [`PublishErrorKind::OutOfTurn`] otherwise.
    /// `None`: everything before it is stored. A publisher that cannot make the condition
    /// (a dry run, a batch member) ignores it.
    fn send(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> impl Future<Output = Result<Self::Ack, PublishError>> + Send;

    /// What the broker accepts for one message: the route stage refuses a row whose message
    /// would not fit as a row-level error (fail closed, or the dead-letter subject), instead of
    /// handing the broker something it refuses on every re-send. Default: no limits known.
    fn limits(&self) -> MessageLimits {
        MessageLimits::NONE
    }

    /// After how many attempts in a row that each ended with
    /// [`PublishError::closed_by_server`] a message counts as refused for good. Default: never
    /// (a publisher that cannot tell a protocol close from an outage must keep retrying).
    fn max_server_closes(&self) -> u32 {
        u32::MAX
    }

    // The next four have no default on purpose: a publisher that wraps another must hand them
    // on, or its inner publisher's batches silently stop following transactions (`restore` once
    // published atomic-batch windows per message). To watch a publisher, give it a
    // [`PublishHook`] instead of wrapping it.

    /// A transaction begins (pgoutput Begin, or a non-transactional logical message, which is
    /// a transaction of its own): the messages of commit LSN `commit_lsn` handed to
    /// [`Publisher::send`] until [`Publisher::end_transaction`] are its events. A publisher
    /// that publishes a transaction as one atomic batch opens it here; one that publishes
    /// every message on its own does nothing.
    fn begin_transaction(&self, commit_lsn: Lsn);

    /// The transaction begun last is complete: a batching publisher commits its batch now.
    fn end_transaction(&self);

    /// A fault: the pipeline sends nothing new until everything in flight is settled, possibly
    /// in the middle of a transaction. A batching publisher sends what it holds back now (the
    /// open batch is committed as a part of its transaction), or the pipeline would wait for
    /// it for ever; the rest of the transaction follows as another part.
    fn hold(&self);

    /// Publishes again a message whose outcome was unknown: [`Publisher::send`] for a publisher
    /// without batches; a batching publisher sends it on its own (its transaction's batch is
    /// over).
    /// `after` as in [`Publisher::send`].
    fn resend(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> impl Future<Output = Result<Self::Ack, PublishError>> + Send;

    /// Whether the broker's own state can hold what it acknowledged since the last check,
    /// `highest_seq` being the highest stream sequence among those acknowledgements: asked
    /// once per checkpoint, before the checkpoint moves past them. An answer from a stream that
    /// does not exist, or a sequence past the stream's last, was not JetStream's (a forged
    /// PubAck) or names what the stream no longer holds. Default: trusted (a publisher without
    /// a stream, a dry run).
    fn check_acks(&self, highest_seq: u64) -> impl Future<Output = AckCheck> + Send + 'static {
        let _ = highest_seq;
        std::future::ready(AckCheck::Held)
    }

    /// The stream whose sequences [`PubReceipt::stream_seq`] counts, when every message lands in
    /// one stream (a JetStream publisher with `Nats-Expected-Stream`). The pipeline records
    /// [`PositionAnchor`]s only for a publisher that names it. Default: none.
    fn stream_name(&self) -> Option<Arc<str>> {
        None
    }
}

/// Where the events a checkpoint moved past are in the stream, stored with the checkpoint so a
/// commit LSN or a commit time can later be mapped to a stream sequence (`outbox-relay
/// position`, `docs/replay.md`).
///
/// The pipeline builds one per checkpoint that moved past at least one acknowledged event. The
/// checkpoints of all sessions, taken in order, cover every event exactly once: each covers
/// the transactions committed after the previous checkpoint up to its own. What an anchor
/// promises: every event of its transactions, and every event committed later that was
/// acknowledged or sent by the time of the checkpoint, has a copy in the stream at a sequence
/// at or after `stream_seq` (the lowest sequence acknowledged for any of them, and for events
/// still in flight the highest sequence known stored before each was sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionAnchor {
    /// The stream the sequence counts in ([`Publisher::stream_name`]).
    pub stream: Arc<str>,
    /// Commit LSN of the earliest transaction with an acknowledged event behind this checkpoint.
    pub commit_lsn: Lsn,
    /// Its commit time, µs since 2000-01-01 UTC.
    pub commit_time_micros: i64,
    /// See the type's documentation.
    pub stream_seq: u64,
    /// An event in flight at the checkpoint was sent before this session learned any stream
    /// sequence: its copies can only be bounded by the previous anchor of the stream. The store
    /// then records the lower of `stream_seq` and the previous anchor's (0 without one).
    pub floor_unknown: bool,
}

/// Durable relay progress, kept apart from the slot so a restart resumes exactly where the
/// broker's acks ended, and a slot that moved on its own is detected.
pub trait CheckpointStore: Send {
    /// The stored position, if any.
    fn load(&mut self) -> impl Future<Output = Result<Option<Lsn>, StoreError>> + Send;
    /// Durably stores `lsn` (a position the ack frontier reached).
    fn save(&mut self, lsn: Lsn) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Durably stores `lsn` and, in the same transaction, `anchor` (where the events it moved
    /// past are in the stream). Storing the anchor must never fail a save that would have
    /// succeeded without it. Default: stores `lsn` only.
    fn save_with_anchor(
        &mut self,
        lsn: Lsn,
        anchor: Option<PositionAnchor>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        drop(anchor);
        self.save(lsn)
    }
}
