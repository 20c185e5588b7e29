//! What the builder, the run loop, the workers and the parking code share: settings, errors,
//! the consumer's state and the test hooks. Kept below all of them so no two modules import
//! each other.

use std::time::{Duration, SystemTime};

use async_nats::jetstream;
use outbox_contract::Lsn;
use tokio_postgres::Client;

use crate::contracts::Contracts;
use crate::stats::ConsumerStats;

/// How messages are handled relative to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// One message outstanding at a time (`max_ack_pending = 1`): messages are applied in
    /// stream order, so in per-subject (and per-aggregate) order. A failing message blocks
    /// every later one until it succeeds or is parked.
    Strict,
    /// Up to `n` messages handled concurrently, each on its own PostgreSQL connection. A
    /// retried message is applied after messages that followed it: no order guarantee.
    Parallel(usize),
}

impl Ordering {
    pub(crate) fn workers(self) -> usize {
        match self {
            Self::Strict => 1,
            Self::Parallel(n) => n.max(1),
        }
    }
}

/// Where a **new** durable consumer starts in the stream ([`ConsumerBuilder::start_at`]
/// (crate::ConsumerBuilder::start_at)). An existing durable keeps its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartAt {
    /// This stream sequence, e.g. as printed by `outbox-relay position`.
    Sequence(u64),
    /// The first event committed at or after this commit LSN.
    Lsn(Lsn),
    /// The first event committed at or after this time.
    Time(SystemTime),
}

/// Applies events again that the ledger already records (the "bug fix" case), see
/// [`ConsumerBuilder::reapply`](crate::ConsumerBuilder::reapply) and `docs/replay.md`.
///
/// An event committed in `[from, until)` whose ledger row was written before `recorded_before`
/// is handed to the handler again ([`Event::reapplied`](crate::Event::reapplied) set); its
/// ledger row is replaced in the same transaction as the handler's writes, so the re-apply
/// commits whole or not at all, and never twice: the replaced row is newer than
/// `recorded_before`, so a redelivery or a second copy finds it and is skipped. Rows are never
/// deleted in advance. Keep `recorded_before` fixed (e.g. when the fix was deployed) for the
/// whole re-apply, across restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reapply {
    pub(crate) from: Lsn,
    pub(crate) until: Option<Lsn>,
    pub(crate) recorded_before: SystemTime,
}

impl Reapply {
    /// Re-apply the events committed at or after `from` whose ledger rows are older than
    /// `recorded_before`.
    pub fn new(from: Lsn, recorded_before: SystemTime) -> Self {
        Self {
            from,
            until: None,
            recorded_before,
        }
    }

    /// Only events committed before `until`.
    #[must_use]
    pub fn until(mut self, until: Lsn) -> Self {
        self.until = Some(until);
        self
    }

    /// Whether an event committed at `lsn` is in the range (`None`: no commit LSN, not in it).
    pub fn covers(&self, lsn: Option<Lsn>) -> bool {
        lsn.is_some_and(|lsn| lsn >= self.from && self.until.is_none_or(|u| lsn < u))
    }
}

/// Where the consumer's PostgreSQL connections come from.
#[derive(Debug)]
pub enum LedgerConnections {
    /// One connected client; [`Ordering::Strict`] only. If its connection is lost,
    /// [`Consumer::run`] returns an error.
    Client(Client),
    /// One connected client per worker (`Parallel(n)` needs `n`).
    Clients(Vec<Client>),
    /// A configuration; the consumer opens one connection per worker (without TLS) and
    /// reconnects after a lost connection.
    Config(tokio_postgres::Config),
}

impl From<Client> for LedgerConnections {
    fn from(c: Client) -> Self {
        Self::Client(c)
    }
}

impl From<Vec<Client>> for LedgerConnections {
    fn from(c: Vec<Client>) -> Self {
        Self::Clients(c)
    }
}

impl From<tokio_postgres::Config> for LedgerConnections {
    fn from(c: tokio_postgres::Config) -> Self {
        Self::Config(c)
    }
}

/// Errors that stop [`Consumer::run`] (or [`ConsumerBuilder::build`](crate::ConsumerBuilder::build)). Per-message problems
/// (handler errors, a failed ack) never surface here: they are retried or parked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The builder's settings are inconsistent.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// PostgreSQL failed where no retry is possible (connecting, the ledger migration, a lost
    /// connection without a [`LedgerConnections::Config`] to reconnect with).
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// A PostgreSQL connection given as a `Client` was lost; with [`LedgerConnections::Config`] the
    /// consumer would have reconnected.
    #[error("PostgreSQL connection lost and no tokio_postgres::Config to reconnect with")]
    ConnectionLost,
    /// The stream could not be looked up.
    #[error("JetStream stream {stream:?}: {source}")]
    Stream {
        /// Stream name.
        stream: String,
        /// Cause.
        source: jetstream::context::GetStreamError,
    },
    /// The durable consumer could not be created or updated.
    #[error("durable consumer {durable:?}: {source}")]
    CreateConsumer {
        /// Durable name.
        durable: String,
        /// Cause.
        source: jetstream::stream::ConsumerError,
    },
    /// Pulling messages failed for good (e.g. the consumer was deleted).
    #[error("pulling messages: {0}")]
    Pull(String),
    /// The start position of a new durable ([`StartAt`]) could not be found in the stream.
    #[error("start position: {0}")]
    StartPosition(String),
}

/// Test-only failpoints; not part of the supported API.
#[doc(hidden)]
pub mod hooks {
    use futures::future::BoxFuture;

    use crate::event::Event;

    /// Where a hook runs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Point {
        /// The handler returned `Ok`; the transaction is not committed yet.
        BeforeCommit,
        /// The transaction is committed; the message is not acked yet.
        BeforeAck,
    }

    /// Awaited at each [`Point`]; a hook that never completes simulates a hang, and aborting
    /// the `run` task then simulates a crash at that point.
    pub type Hook = std::sync::Arc<dyn Fn(Point, &Event) -> BoxFuture<'static, ()> + Send + Sync>;
}

/// The consumer's settings and counters, shared by the run loop, its workers and the parking
/// code.
pub(crate) struct Inner {
    pub(crate) jetstream: jetstream::Context,
    pub(crate) service: String,
    pub(crate) durable: String,
    pub(crate) stream: String,
    pub(crate) subjects: Vec<String>,
    pub(crate) ordering: Ordering,
    pub(crate) max_deliver: u32,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) ack_wait: Duration,
    pub(crate) dead_letter_subject: String,
    pub(crate) ensure_ledger: bool,
    pub(crate) start_at: Option<StartAt>,
    pub(crate) reapply: Option<Reapply>,
    pub(crate) hook: Option<hooks::Hook>,
    /// Set when events are checked against their contracts.
    pub(crate) contracts: Option<Contracts>,
    pub(crate) stats: ConsumerStats,
}
