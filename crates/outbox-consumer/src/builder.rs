//! [`ConsumerBuilder`]: the consumer's settings, checked, into a [`Consumer`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use crate::consumer::Consumer;
use crate::contracts::{ContractSettings, Contracts};
use crate::handler::Handler;
use crate::shared::{Error, Inner, LedgerConnections, Ordering, Reapply, StartAt, hooks};
use crate::stats::ConsumerStats;

/// Builder for [`Consumer`]; see [`Consumer::builder`].
pub struct ConsumerBuilder {
    jetstream: jetstream::Context,
    pg: LedgerConnections,
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
    start_at: Option<StartAt>,
    reapply: Option<Reapply>,
    hook: Option<hooks::Hook>,
    contracts: Option<ContractSettings>,
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
            .field("contracts", &self.contracts)
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

    /// Where the durable consumer starts when [`Consumer::run`] creates it (default: the
    /// stream's first message). For a new service that should not see the whole history. A
    /// commit LSN or time is looked up in the stream (`outbox-position`, no position map: see
    /// `docs/replay.md` for its clock assumption); `outbox-relay position` answers from the
    /// relay's position map and prints a [`StartAt::Sequence`]. An existing durable keeps its
    /// position (reposition it with `outbox-relay replay`).
    pub fn start_at(mut self, start: StartAt) -> Self {
        self.start_at = Some(start);
        self
    }

    /// Re-apply events the ledger already records, in a range (see [`Reapply`]): for a handler
    /// bug fixed after the events were applied. Combine with repositioning the durable
    /// (`outbox-relay replay --from-lsn`), so the events are delivered again.
    pub fn reapply(mut self, reapply: Reapply) -> Self {
        self.reapply = Some(reapply);
        self
    }

    /// Checks each event that names its contract (header `Outbox-Schema`, the contract's key
    /// `<name>.<version>`) against that contract before the handler sees it. The contract is
    /// read from the relay's contracts KV bucket ([`crate::CONTRACTS_BUCKET`] unless
    /// [`Self::contracts_bucket`] says otherwise) once per key, and compiled with the relay's
    /// own code. An event whose payload breaks it, whose key the bucket does not hold, or whose
    /// stored bytes are not the version the key names is parked, not applied, with a reason
    /// `contract <key>: …` (the JSON Pointer, keyword, expected and found value of a
    /// violation). Events without the header are handled as before (see
    /// [`Self::require_contract`]). A contract that cannot be read for NATS reasons (the
    /// bucket is missing, a request timed out) is retried like a database error: the event
    /// waits, it is never parked or applied unchecked.
    ///
    /// ```no_run
    /// use futures::FutureExt as _;
    /// use outbox_consumer::{Consumer, Permanent, handler_fn};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct OrderPlaced {
    ///     order_id: String,
    /// }
    ///
    /// # async fn demo(pg: tokio_postgres::Config) -> Result<(), Box<dyn std::error::Error>> {
    /// let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
    /// let jetstream = async_nats::jetstream::new(nats);
    /// // Only events that satisfy their contract (or name none) reach the handler.
    /// let handler = handler_fn(|tx, event| {
    ///     async move {
    ///         let order: OrderPlaced = event.json().map_err(Permanent::new)?;
    ///         tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&order.order_id]).await?;
    ///         Ok(())
    ///     }
    ///     .boxed()
    /// });
    /// let consumer = Consumer::builder(jetstream, pg, "billing")
    ///     .subjects(["outbox.Order.>"])
    ///     .validate_contracts() // KV bucket `outbox-contracts`; see contracts_bucket
    ///     .require_contract() // optional: park events that name no contract too
    ///     .build()?;
    /// let stats = consumer.stats(); // contracts_passed, contracts_refused, parked
    /// consumer.run(handler, async { let _ = tokio::signal::ctrl_c().await; }).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn validate_contracts(mut self) -> Self {
        self.contracts.get_or_insert_with(ContractSettings::default);
        self
    }

    /// The KV bucket the relay stores contracts in (default `outbox-contracts`); turns on
    /// [`Self::validate_contracts`].
    pub fn contracts_bucket(mut self, bucket: impl Into<String>) -> Self {
        self.contracts
            .get_or_insert_with(ContractSettings::default)
            .bucket = bucket.into();
        self
    }

    /// Parks events without an `Outbox-Schema` header too (reason `contract required: …`):
    /// for a service that must only see checked events. Turns on
    /// [`Self::validate_contracts`].
    pub fn require_contract(mut self) -> Self {
        self.contracts
            .get_or_insert_with(ContractSettings::default)
            .required = true;
        self
    }

    /// Bounds on a payload's size and nesting when it is checked (default
    /// [`Limits::default`](outbox_schema::Limits): 1 MiB, 64 levels); a payload beyond them is
    /// refused. Give the limits the relay checks with, if they differ. Turns on
    /// [`Self::validate_contracts`].
    pub fn contract_limits(mut self, limits: outbox_schema::Limits) -> Self {
        self.contracts
            .get_or_insert_with(ContractSettings::default)
            .limits = limits;
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
            LedgerConnections::Client(_) if workers > 1 => {
                return Err(Error::Config(format!(
                    "Parallel({workers}) needs {workers} PostgreSQL clients or a \
                     tokio_postgres::Config, got one client"
                )));
            }
            LedgerConnections::Clients(c) if c.len() < workers => {
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
        if let Some(contracts) = &self.contracts
            && !valid_name(&contracts.bucket)
        {
            return Err(Error::Config(format!(
                "contracts bucket {:?} must be non-empty ASCII letters, digits, '-' or '_'",
                contracts.bucket
            )));
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
                start_at: self.start_at,
                reapply: self.reapply,
                hook: self.hook,
                contracts: self.contracts.map(Contracts::new),
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

impl Consumer {
    /// Starts a builder for service `service` (also the default durable name and the ledger's
    /// `consumer` key). `pg` is a [`tokio_postgres::Client`], a `Vec` of them, or a
    /// [`tokio_postgres::Config`].
    pub fn builder(
        jetstream: jetstream::Context,
        pg: impl Into<LedgerConnections>,
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
            start_at: None,
            reapply: None,
            hook: None,
            contracts: None,
        }
    }
}
