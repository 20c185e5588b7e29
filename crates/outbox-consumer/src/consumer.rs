//! The durable pull consumer and its per-message transaction.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, AckKind};
use futures::future::BoxFuture;
use futures::{StreamExt as _, TryStreamExt as _};
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls, Statement, Transaction};
use tracing::{debug, error, info, warn};

use crate::event::{Event, HEADER_MSG_ID};
use crate::ledger::{INSERT_SQL, ensure_ledger};

/// Boxed error a [`Handler`] returns. `anyhow::Error`, `tokio_postgres::Error`,
/// `serde_json::Error` and `String` all convert into it with `?` / `.into()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Dead-letter header: why the message was parked.
pub const HEADER_DLQ_REASON: &str = "Outbox-Dlq-Reason";
/// Dead-letter header: the subject the message was delivered on.
pub const HEADER_DLQ_SUBJECT: &str = "Outbox-Dlq-Subject";
/// Dead-letter header: the event id (`Nats-Msg-Id` of the original message).
pub const HEADER_DLQ_EVENT_ID: &str = "Outbox-Dlq-Event-Id";
/// Dead-letter header: how many times the message had been delivered.
pub const HEADER_DLQ_DELIVERIES: &str = "Outbox-Dlq-Deliveries";
/// Dead-letter header: the consumer (service) that parked it.
pub const HEADER_DLQ_CONSUMER: &str = "Outbox-Dlq-Consumer";
/// Dead-letter header: stream and sequence of the original message, `STREAM:SEQ`.
pub const HEADER_DLQ_SOURCE: &str = "Outbox-Dlq-Source";

/// Longest `Outbox-Dlq-Reason` value; longer reasons are cut.
const MAX_REASON_LEN: usize = 1024;

/// The user's code: applies one event inside the open transaction.
///
/// The transaction already holds this event's ledger row; the library commits it after the
/// handler returns `Ok`, and rolls it back on `Err` (the event is then retried, see
/// [`ConsumerBuilder::max_deliver`]). Do all business writes through `tx`: writes through
/// any other connection are not covered by the exactly-once guarantee.
///
/// Implement it for a struct, or wrap a closure with [`handler_fn`].
pub trait Handler: Send + Sync + 'static {
    /// Applies `event` in `tx`.
    fn handle<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<(), BoxError>>;
}

impl<F> Handler for F
where
    F: for<'a> Fn(&'a Transaction<'a>, &'a Event) -> BoxFuture<'a, Result<(), BoxError>>
        + Send
        + Sync
        + 'static,
{
    fn handle<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        self(tx, event)
    }
}

/// Pins down a closure's signature so it can be used as a [`Handler`]:
///
/// ```no_run
/// use futures::FutureExt as _;
/// let handler = outbox_consumer::handler_fn(|tx, event| {
///     async move {
///         tx.execute("INSERT INTO seen (id) VALUES ($1)", &[&event.id]).await?;
///         Ok(())
///     }
///     .boxed()
/// });
/// ```
pub fn handler_fn<F>(f: F) -> F
where
    F: for<'a> Fn(&'a Transaction<'a>, &'a Event) -> BoxFuture<'a, Result<(), BoxError>>
        + Send
        + Sync
        + 'static,
{
    f
}

/// A handler error that retrying cannot fix (for example a payload that does not decode):
/// the message is parked on the dead-letter subject at once instead of after
/// [`ConsumerBuilder::max_deliver`] deliveries.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Permanent(pub BoxError);

impl Permanent {
    /// Wraps `err` as permanent.
    pub fn new(err: impl Into<BoxError>) -> Self {
        Self(err.into())
    }
}

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
    fn workers(self) -> usize {
        match self {
            Self::Strict => 1,
            Self::Parallel(n) => n.max(1),
        }
    }
}

/// Where the consumer's PostgreSQL connections come from.
#[derive(Debug)]
pub enum PgSource {
    /// One connected client; [`Ordering::Strict`] only. If its connection is lost,
    /// [`Consumer::run`] returns an error.
    Client(Client),
    /// One connected client per worker (`Parallel(n)` needs `n`).
    Clients(Vec<Client>),
    /// A configuration; the consumer opens one connection per worker (without TLS) and
    /// reconnects after a lost connection.
    Config(tokio_postgres::Config),
}

impl From<Client> for PgSource {
    fn from(c: Client) -> Self {
        Self::Client(c)
    }
}

impl From<Vec<Client>> for PgSource {
    fn from(c: Vec<Client>) -> Self {
        Self::Clients(c)
    }
}

impl From<tokio_postgres::Config> for PgSource {
    fn from(c: tokio_postgres::Config) -> Self {
        Self::Config(c)
    }
}

/// Errors that stop [`Consumer::run`] (or [`ConsumerBuilder::build`]). Per-message problems
/// (handler errors, a failed ack) never surface here: they are retried or parked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The builder's settings are inconsistent.
    #[error("invalid consumer configuration: {0}")]
    Config(String),
    /// PostgreSQL failed where no retry is possible (connecting, the ledger migration, a lost
    /// connection without a [`PgSource::Config`] to reconnect with).
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// A PostgreSQL connection given as a `Client` was lost; with [`PgSource::Config`] the
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

/// Counters of what the consumer did; cheap to clone, read with [`ConsumerStats::snapshot`].
#[derive(Debug, Clone, Default)]
pub struct ConsumerStats(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    applied: AtomicU64,
    duplicates: AtomicU64,
    retried: AtomicU64,
    parked: AtomicU64,
    park_failures: AtomicU64,
    infra_errors: AtomicU64,
}

/// A snapshot of [`ConsumerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Events whose handler ran and committed.
    pub applied: u64,
    /// Deliveries skipped because the ledger already had the event id.
    pub duplicates: u64,
    /// Handler failures answered with a delayed NAK.
    pub retried: u64,
    /// Messages published to the dead-letter subject and terminated.
    pub parked: u64,
    /// Attempts to park that failed (the message was NAKed and will be parked later).
    pub park_failures: u64,
    /// PostgreSQL / NATS failures outside the handler (the message was NAKed).
    pub infra_errors: u64,
}

impl ConsumerStats {
    /// Current values.
    pub fn snapshot(&self) -> StatsSnapshot {
        let c = &self.0;
        let get = |a: &AtomicU64| a.load(AtomicOrdering::Relaxed);
        StatsSnapshot {
            applied: get(&c.applied),
            duplicates: get(&c.duplicates),
            retried: get(&c.retried),
            parked: get(&c.parked),
            park_failures: get(&c.park_failures),
            infra_errors: get(&c.infra_errors),
        }
    }

    fn inc(&self, f: impl Fn(&Counters) -> &AtomicU64) {
        f(&self.0).fetch_add(1, AtomicOrdering::Relaxed);
    }
}

/// Test-only failpoints; not part of the supported API.
#[doc(hidden)]
pub mod hooks {
    use super::{BoxFuture, Event};

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

/// Builder for [`Consumer`]; see [`Consumer::builder`].
pub struct ConsumerBuilder {
    jetstream: jetstream::Context,
    pg: PgSource,
    service: String,
    durable: Option<String>,
    stream: String,
    subjects: Vec<String>,
    ordering: Ordering,
    max_deliver: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    ack_wait: Duration,
    dead_letter_subject: Option<String>,
    ensure_ledger: bool,
    hook: Option<hooks::Hook>,
}

impl std::fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("service", &self.service)
            .field("durable", &self.durable)
            .field("stream", &self.stream)
            .field("subjects", &self.subjects)
            .field("ordering", &self.ordering)
            .field("max_deliver", &self.max_deliver)
            .field("ack_wait", &self.ack_wait)
            .field("dead_letter_subject", &self.dead_letter_subject)
            .finish_non_exhaustive()
    }
}

impl ConsumerBuilder {
    /// The JetStream stream to read (default `OUTBOX`).
    pub fn stream(mut self, name: impl Into<String>) -> Self {
        self.stream = name.into();
        self
    }

    /// Subject filters (default `["outbox.>"]`). More than one filter needs nats-server 2.10.
    pub fn subjects<I, S>(mut self, subjects: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.subjects = subjects.into_iter().map(Into::into).collect();
        self
    }

    /// The durable consumer name (default: the service name). Its position in the stream is
    /// kept by the server across restarts; never share it between different services.
    pub fn durable_name(mut self, name: impl Into<String>) -> Self {
        self.durable = Some(name.into());
        self
    }

    /// [`Ordering::Strict`] (default) or [`Ordering::Parallel`].
    pub fn ordering(mut self, ordering: Ordering) -> Self {
        self.ordering = ordering;
        self
    }

    /// Shorthand for `ordering(Ordering::Parallel(n))`.
    pub fn parallel(self, n: usize) -> Self {
        self.ordering(Ordering::Parallel(n))
    }

    /// Deliveries after which a message whose handler keeps failing is parked on the
    /// dead-letter subject (default 5, at least 1).
    pub fn max_deliver(mut self, n: u32) -> Self {
        self.max_deliver = n.max(1);
        self
    }

    /// Redelivery delay after a failure: `initial * 2^(delivery - 1)`, at most `max`
    /// (default 1 s .. 60 s).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }

    /// How long the server waits for an ack before redelivering (default 30 s). While a
    /// handler runs, the consumer sends progress acks every third of it.
    pub fn ack_wait(mut self, d: Duration) -> Self {
        self.ack_wait = d;
        self
    }

    /// Where parked messages go (default `dlq.<service>`). The subject must be captured by a
    /// JetStream stream: a message is only acked after the dead-letter publish is confirmed.
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = Some(subject.into());
        self
    }

    /// Whether [`Consumer::run`] applies the ledger migration at start (default `true`).
    pub fn ensure_ledger(mut self, yes: bool) -> Self {
        self.ensure_ledger = yes;
        self
    }

    #[doc(hidden)]
    pub fn test_hook(mut self, hook: hooks::Hook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Checks the settings.
    pub fn build(self) -> Result<Consumer, Error> {
        let valid_name = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !valid_name(&self.service) {
            return Err(Error::Config(format!(
                "service name {:?} must be non-empty ASCII letters, digits, '-' or '_'",
                self.service
            )));
        }
        let durable = self.durable.unwrap_or_else(|| self.service.clone());
        if !valid_name(&durable) {
            return Err(Error::Config(format!(
                "durable name {durable:?} must be non-empty ASCII letters, digits, '-' or '_'"
            )));
        }
        if self.subjects.is_empty() {
            return Err(Error::Config("no subjects".into()));
        }
        let workers = self.ordering.workers();
        match &self.pg {
            PgSource::Client(_) if workers > 1 => {
                return Err(Error::Config(format!(
                    "Parallel({workers}) needs {workers} PostgreSQL clients or a \
                     tokio_postgres::Config, got one client"
                )));
            }
            PgSource::Clients(c) if c.len() < workers => {
                return Err(Error::Config(format!(
                    "{workers} workers need {workers} PostgreSQL clients, got {}",
                    c.len()
                )));
            }
            _ => {}
        }
        if self.ack_wait < Duration::from_millis(300) {
            return Err(Error::Config("ack_wait must be at least 300 ms".into()));
        }
        let dead_letter_subject = self
            .dead_letter_subject
            .unwrap_or_else(|| format!("dlq.{}", self.service));
        Ok(Consumer {
            inner: Arc::new(Inner {
                jetstream: self.jetstream,
                service: self.service,
                durable,
                stream: self.stream,
                subjects: self.subjects,
                ordering: self.ordering,
                max_deliver: self.max_deliver,
                backoff_initial: self.backoff_initial,
                backoff_max: self.backoff_max,
                ack_wait: self.ack_wait,
                dead_letter_subject,
                ensure_ledger: self.ensure_ledger,
                hook: self.hook,
                stats: ConsumerStats::default(),
            }),
            pg: self.pg,
        })
    }

    /// [`Self::build`] then [`Consumer::run`].
    pub async fn run<H: Handler>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        self.build()?.run(handler, shutdown).await
    }
}

/// An idempotent JetStream consumer for one service: each event is applied at most once in
/// the service's database (the ledger), and at least once overall (explicit acks after
/// commit), so exactly once in effect.
pub struct Consumer {
    inner: Arc<Inner>,
    pg: PgSource,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("service", &self.inner.service)
            .field("durable", &self.inner.durable)
            .field("stream", &self.inner.stream)
            .finish_non_exhaustive()
    }
}

struct Inner {
    jetstream: jetstream::Context,
    service: String,
    durable: String,
    stream: String,
    subjects: Vec<String>,
    ordering: Ordering,
    max_deliver: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    ack_wait: Duration,
    dead_letter_subject: String,
    ensure_ledger: bool,
    hook: Option<hooks::Hook>,
    stats: ConsumerStats,
}

/// One worker's PostgreSQL connection.
struct Slot {
    client: Option<Client>,
    insert: Option<Statement>,
    config: Option<tokio_postgres::Config>,
}

impl Slot {
    async fn connect(config: &tokio_postgres::Config) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                warn!(error = %e, "outbox-consumer: PostgreSQL connection ended");
            }
        });
        Ok(client)
    }

    /// The client and the prepared ledger insert; reconnects if possible.
    async fn ready(&mut self) -> Result<(&mut Client, Statement), SlotError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.insert = None;
            self.client = None;
            let Some(config) = &self.config else {
                return Err(SlotError::Fatal);
            };
            self.client = Some(Self::connect(config).await.map_err(SlotError::Retry)?);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(SlotError::Fatal);
        };
        let stmt = match &self.insert {
            Some(s) => s.clone(),
            None => {
                let s = client.prepare(INSERT_SQL).await.map_err(SlotError::Retry)?;
                self.insert = Some(s.clone());
                s
            }
        };
        Ok((client, stmt))
    }
}

enum SlotError {
    /// No connection and nothing to reconnect with.
    Fatal,
    Retry(tokio_postgres::Error),
}

/// The result of one attempt at one message.
enum Attempt {
    Applied,
    Duplicate,
    HandlerFailed(BoxError),
    /// PostgreSQL trouble outside the handler: retry, never park.
    Infra(String),
}

impl Consumer {
    /// Starts a builder for service `service` (also the default durable name and the ledger's
    /// `consumer` key). `pg` is a [`tokio_postgres::Client`], a `Vec` of them, or a
    /// [`tokio_postgres::Config`].
    pub fn builder(
        jetstream: jetstream::Context,
        pg: impl Into<PgSource>,
        service: impl Into<String>,
    ) -> ConsumerBuilder {
        ConsumerBuilder {
            jetstream,
            pg: pg.into(),
            service: service.into(),
            durable: None,
            stream: "OUTBOX".into(),
            subjects: vec!["outbox.>".into()],
            ordering: Ordering::Strict,
            max_deliver: 5,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            ack_wait: Duration::from_secs(30),
            dead_letter_subject: None,
            ensure_ledger: true,
            hook: None,
        }
    }

    /// Counters; clone before [`Self::run`] to watch them while it runs.
    pub fn stats(&self) -> ConsumerStats {
        self.inner.stats.clone()
    }

    /// Creates (or updates) the durable consumer, then handles messages until `shutdown`
    /// completes; messages in flight are finished (committed and acked) before it returns.
    ///
    /// Returns an error only for problems it cannot retry: see [`Error`].
    pub async fn run<H: Handler>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), Error> {
        let inner = self.inner;
        let workers = inner.ordering.workers();
        let slots = open_slots(self.pg, workers).await?;
        if inner.ensure_ledger
            && let Some(client) = slots.first().and_then(|s| s.client.as_ref())
        {
            ensure_ledger(client).await?;
        }
        let slots: Vec<Mutex<Slot>> = slots.into_iter().map(Mutex::new).collect();

        let stream = inner
            .jetstream
            .get_stream(&inner.stream)
            .await
            .map_err(|source| Error::Stream {
                stream: inner.stream.clone(),
                source,
            })?;
        let mut config = pull::Config {
            durable_name: Some(inner.durable.clone()),
            description: Some(format!("outbox-consumer for service {}", inner.service)),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: inner.ack_wait,
            // Unlimited on the server: the consumer itself parks after `max_deliver`, so that
            // no message is ever dropped by the server without reaching the dead-letter subject.
            max_deliver: -1,
            max_ack_pending: match inner.ordering {
                Ordering::Strict => 1,
                Ordering::Parallel(_) => i64::try_from(workers * 2).unwrap_or(i64::MAX),
            },
            ..Default::default()
        };
        if let [single] = inner.subjects.as_slice() {
            config.filter_subject = single.clone();
        } else {
            config.filter_subjects = inner.subjects.clone();
        }
        let consumer =
            stream
                .create_consumer(config)
                .await
                .map_err(|source| Error::CreateConsumer {
                    durable: inner.durable.clone(),
                    source,
                })?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(workers)
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
            .map_err(|e| Error::Pull(e.to_string()))?;
        info!(
            service = %inner.service,
            durable = %inner.durable,
            stream = %inner.stream,
            subjects = ?inner.subjects,
            ordering = ?inner.ordering,
            "outbox-consumer: running"
        );

        let handler = Arc::new(handler);
        let inner_ref = &inner;
        let slots_ref = &slots;
        let result = messages
            .take_until(shutdown)
            .filter_map(|item| async move {
                match item {
                    Ok(msg) => Some(Ok(msg)),
                    Err(e) => match e.kind() {
                        MessagesErrorKind::ConsumerDeleted
                        | MessagesErrorKind::PushBasedConsumer
                        | MessagesErrorKind::RequestLimitExceeded => {
                            Some(Err(Error::Pull(e.to_string())))
                        }
                        _ => {
                            warn!(error = %e, "outbox-consumer: pull problem (retrying)");
                            None
                        }
                    },
                }
            })
            .try_for_each_concurrent(workers, |msg| {
                let handler = Arc::clone(&handler);
                async move {
                    let mut slot = lock_free_slot(slots_ref).await;
                    inner_ref.process(&mut slot, handler.as_ref(), msg).await
                }
            })
            .await;
        info!(service = %inner.service, ok = result.is_ok(), "outbox-consumer: stopped");
        result
    }
}

async fn open_slots(pg: PgSource, workers: usize) -> Result<Vec<Slot>, Error> {
    let slot = |client, config| Slot {
        client,
        insert: None,
        config,
    };
    Ok(match pg {
        PgSource::Client(c) => vec![slot(Some(c), None)],
        PgSource::Clients(cs) => cs.into_iter().map(|c| slot(Some(c), None)).collect(),
        PgSource::Config(config) => {
            let mut v = Vec::with_capacity(workers);
            for _ in 0..workers {
                v.push(slot(
                    Some(Slot::connect(&config).await?),
                    Some(config.clone()),
                ));
            }
            v
        }
    })
}

/// A slot nobody uses; with at most `slots.len()` concurrent workers one is always free.
async fn lock_free_slot(slots: &[Mutex<Slot>]) -> tokio::sync::MutexGuard<'_, Slot> {
    for s in slots {
        if let Ok(guard) = s.try_lock() {
            return guard;
        }
    }
    // Unreachable in practice; waiting is still correct.
    slots[0].lock().await
}

impl Inner {
    /// Handles one message to the end: acked, NAKed or parked. `Err` only for fatal errors.
    async fn process<H: Handler>(
        &self,
        slot: &mut Slot,
        handler: &H,
        msg: jetstream::Message,
    ) -> Result<(), Error> {
        let event = match Event::from_message(&msg) {
            Ok(e) => e,
            Err(e) => {
                let delivered = msg
                    .info()
                    .map(|i| u64::try_from(i.delivered).unwrap_or(0))
                    .unwrap_or(0);
                self.park(&msg, None, delivered, &format!("invalid message: {e}"))
                    .await;
                return Ok(());
            }
        };

        let attempt = {
            let work = self.attempt(slot, handler, &event);
            tokio::pin!(work);
            // Keep the server from redelivering while a slow handler runs.
            let mut progress = tokio::time::interval(self.ack_wait / 3);
            progress.tick().await;
            loop {
                tokio::select! {
                    res = &mut work => break res,
                    _ = progress.tick() => {
                        let _ = msg.ack_with(AckKind::Progress).await;
                    }
                }
            }
        };
        let attempt = match attempt {
            Ok(a) => a,
            Err(()) => {
                return Err(Error::ConnectionLost);
            }
        };

        match attempt {
            Attempt::Applied | Attempt::Duplicate => {
                if matches!(attempt, Attempt::Applied) {
                    self.stats.inc(|c| &c.applied);
                    debug!(event_id = %event.id, seq = event.stream_sequence, "applied");
                } else {
                    self.stats.inc(|c| &c.duplicates);
                    debug!(event_id = %event.id, seq = event.stream_sequence, "duplicate skipped");
                }
                if let Some(hook) = &self.hook {
                    hook(hooks::Point::BeforeAck, &event).await;
                }
                if let Err(e) = msg.ack_with(AckKind::Ack).await {
                    // The ledger absorbs the redelivery.
                    warn!(event_id = %event.id, error = %e, "ack failed; will be redelivered");
                }
            }
            Attempt::HandlerFailed(err) => {
                let reason = error_chain(err.as_ref());
                let permanent = err.downcast_ref::<Permanent>().is_some();
                if permanent || event.delivered >= u64::from(self.max_deliver) {
                    let why = if permanent {
                        format!("permanent handler error: {reason}")
                    } else {
                        format!(
                            "handler failed {} times; last error: {reason}",
                            event.delivered
                        )
                    };
                    self.park(&msg, Some(&event), event.delivered, &why).await;
                } else {
                    self.stats.inc(|c| &c.retried);
                    let delay = self.backoff(event.delivered);
                    warn!(
                        service = %self.service,
                        event_id = %event.id,
                        delivered = event.delivered,
                        max_deliver = self.max_deliver,
                        retry_in = ?delay,
                        error = %reason,
                        "outbox-consumer: handler failed; will retry"
                    );
                    let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
                }
            }
            Attempt::Infra(reason) => {
                self.stats.inc(|c| &c.infra_errors);
                let delay = self.backoff(event.delivered);
                warn!(
                    service = %self.service,
                    event_id = %event.id,
                    retry_in = ?delay,
                    error = %reason,
                    "outbox-consumer: PostgreSQL error outside the handler; will retry"
                );
                let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
                // Do not spin on a database that is down.
                tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
            }
        }
        Ok(())
    }

    /// BEGIN; ledger insert; handler; COMMIT. `Err(())` when the connection is gone for good.
    async fn attempt<H: Handler>(
        &self,
        slot: &mut Slot,
        handler: &H,
        event: &Event,
    ) -> Result<Attempt, ()> {
        let (client, insert) = match slot.ready().await {
            Ok(c) => c,
            Err(SlotError::Fatal) => return Err(()),
            Err(SlotError::Retry(e)) => return Ok(Attempt::Infra(error_chain(&e))),
        };
        let tx = match client.transaction().await {
            Ok(tx) => tx,
            Err(e) => return Ok(Attempt::Infra(error_chain(&e))),
        };
        let seq = i64::try_from(event.stream_sequence).unwrap_or(i64::MAX);
        let lsn = event.commit_lsn.map(|l| l.to_string());
        let inserted = match tx
            .execute(
                &insert,
                &[&self.service, &event.id, &event.subject, &seq, &lsn],
            )
            .await
        {
            Ok(n) => n,
            Err(e) => return Ok(Attempt::Infra(error_chain(&e))),
        };
        if inserted == 0 {
            // Already applied: nothing to do; the transaction rolls back on drop.
            let _ = tx.rollback().await;
            return Ok(Attempt::Duplicate);
        }
        if let Err(err) = handler.handle(&tx, event).await {
            let _ = tx.rollback().await;
            if client.is_closed() {
                // The handler failed because the database went away, not because of the event.
                return Ok(Attempt::Infra(error_chain(err.as_ref())));
            }
            return Ok(Attempt::HandlerFailed(err));
        }
        if let Some(hook) = &self.hook {
            hook(hooks::Point::BeforeCommit, event).await;
        }
        match tx.commit().await {
            Ok(()) => Ok(Attempt::Applied),
            // Unknown outcome if the connection broke during COMMIT: the redelivery finds the
            // ledger row if the commit happened, and applies the event if it did not.
            Err(e) => Ok(Attempt::Infra(error_chain(&e))),
        }
    }

    fn backoff(&self, delivered: u64) -> Duration {
        backoff_delay(self.backoff_initial, self.backoff_max, delivered)
    }

    /// Publishes the message to the dead-letter subject (waiting for the stream's ack), then
    /// terminates it. If the publish fails the message is NAKed and parked on a later delivery.
    async fn park(
        &self,
        msg: &jetstream::Message,
        event: Option<&Event>,
        delivered: u64,
        reason: &str,
    ) {
        let reason = sanitize_reason(reason);
        let event_id = event
            .map(|e| e.id.clone())
            .or_else(|| {
                msg.headers
                    .as_ref()
                    .and_then(|h| h.get(HEADER_MSG_ID))
                    .map(|v| v.as_str().to_owned())
            })
            .unwrap_or_default();
        let (stream, seq) = msg
            .info()
            .map(|i| (i.stream.to_owned(), i.stream_sequence))
            .unwrap_or_default();
        let mut headers: HeaderMap = msg.headers.clone().unwrap_or_default();
        headers.insert(HEADER_DLQ_REASON, reason.as_str());
        headers.insert(HEADER_DLQ_SUBJECT, msg.subject.as_str());
        headers.insert(HEADER_DLQ_EVENT_ID, event_id.as_str());
        headers.insert(HEADER_DLQ_DELIVERIES, delivered.to_string().as_str());
        headers.insert(HEADER_DLQ_CONSUMER, self.service.as_str());
        headers.insert(HEADER_DLQ_SOURCE, format!("{stream}:{seq}").as_str());
        // Dedupe a re-park (crash between the dead-letter publish and the TERM).
        headers.insert(
            HEADER_MSG_ID,
            format!("dlq:{}:{stream}:{seq}", self.service).as_str(),
        );

        let published = async {
            self.jetstream
                .publish_with_headers(
                    self.dead_letter_subject.clone(),
                    headers,
                    msg.payload.clone(),
                )
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        match published {
            Ok(_) => {
                self.stats.inc(|c| &c.parked);
                error!(
                    service = %self.service,
                    event_id = %event_id,
                    subject = %msg.subject,
                    stream_seq = seq,
                    delivered,
                    dead_letter_subject = %self.dead_letter_subject,
                    reason = %reason,
                    "outbox-consumer: message parked on the dead-letter subject"
                );
                if let Err(e) = msg.ack_with(AckKind::Term).await {
                    warn!(event_id = %event_id, error = %e, "TERM after parking failed");
                }
            }
            Err(e) => {
                self.stats.inc(|c| &c.park_failures);
                let delay = self.backoff(delivered);
                error!(
                    service = %self.service,
                    event_id = %event_id,
                    dead_letter_subject = %self.dead_letter_subject,
                    error = %e,
                    retry_in = ?delay,
                    "outbox-consumer: cannot publish to the dead-letter subject; message kept"
                );
                let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
            }
        }
    }
}

/// `initial * 2^(delivered - 1)`, at most `max`.
fn backoff_delay(initial: Duration, max: Duration, delivered: u64) -> Duration {
    let exp = u32::try_from(delivered.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(20);
    initial.saturating_mul(1u32 << exp).min(max)
}

/// `err: source: source ...`.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let next = e.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = e.source();
    }
    s
}

/// One line, at most [`MAX_REASON_LEN`] bytes (header values cannot hold CR/LF).
fn sanitize_reason(reason: &str) -> String {
    let mut s: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.len() > MAX_REASON_LEN {
        let mut cut = MAX_REASON_LEN;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let (i, m) = (Duration::from_millis(100), Duration::from_secs(1));
        let d: Vec<u128> = [0, 1, 2, 3, 4, 5, 1000]
            .into_iter()
            .map(|n| backoff_delay(i, m, n).as_millis())
            .collect();
        assert_eq!(d, [100, 100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn reasons_are_one_bounded_line() {
        assert_eq!(sanitize_reason("a\r\nb"), "a  b");
        let long = "é".repeat(2000);
        let s = sanitize_reason(&long);
        assert!(s.len() <= MAX_REASON_LEN);
        assert!(s.chars().all(|c| c == 'é'));
    }

    #[test]
    fn error_chain_includes_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
    }
}
