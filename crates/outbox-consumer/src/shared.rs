//! What the builder, the run loop, the workers and the parking code share: settings, errors,
//! the consumer's state and the test hooks. Kept below all of them so no two modules import
//! each other.

use std::time::Duration;

use async_nats::jetstream;
use tokio_postgres::Client;

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
    pub(crate) hook: Option<hooks::Hook>,
    pub(crate) stats: ConsumerStats,
}
