//! The durable pull consumer and its run loop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use futures::{StreamExt as _, TryStreamExt as _};
use outbox_position::{Limits, Target};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::handler::Handler;
use crate::ledger::ensure_ledger;
use crate::shared::{Error, Inner, LedgerConnections, Ordering, StartAt};
use crate::stats::ConsumerStats;
use crate::worker::{Slot, lock_free_slot, open_slots};

/// An idempotent JetStream consumer for one service: each event is applied at most once in
/// the service's database (the ledger), and at least once overall (explicit acks after
/// commit), so exactly once in effect.
pub struct Consumer {
    pub(crate) inner: Arc<Inner>,
    pub(crate) pg: LedgerConnections,
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

/// What an existing durable keeps when [`Consumer::run`] updates it.
struct Kept {
    deliver_policy: DeliverPolicy,
    /// It has no subject filter and the service's filters are the stream's subjects: leave it
    /// without (the same messages), instead of an update nats-server before 2.10 gets wrong.
    unfiltered: bool,
}

/// The deliver policy (and filter) to create or update the durable with. JetStream refuses to change the
/// deliver policy (or start) of an existing consumer, so an existing durable keeps its own:
/// one `outbox-relay replay` re-created with a start sequence stays as it is. A new one starts
/// at [`StartAt`] (default: the stream's first message).
async fn deliver_policy(
    inner: &Inner,
    stream: &async_nats::jetstream::stream::Stream,
) -> Result<Kept, Error> {
    use async_nats::jetstream::context::ConsumerInfoErrorKind;
    let new = |deliver_policy| Kept {
        deliver_policy,
        unfiltered: false,
    };
    match stream.consumer_info(&inner.durable).await {
        Ok(info) => {
            if inner.start_at.is_some() {
                info!(durable = %inner.durable, "outbox-consumer: the durable exists; it keeps its position (start_at applies to a new one)");
            }
            let mut ours = inner.subjects.clone();
            let mut all = stream.cached_info().config.subjects.clone();
            ours.sort();
            all.sort();
            return Ok(Kept {
                deliver_policy: info.config.deliver_policy,
                unfiltered: info.config.filter_subject.is_empty()
                    && info.config.filter_subjects.is_empty()
                    && ours == all,
            });
        }
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {}
        // Creating will tell.
        Err(_) => return Ok(new(DeliverPolicy::All)),
    }
    let start_sequence = match inner.start_at {
        None => return Ok(new(DeliverPolicy::All)),
        Some(StartAt::Sequence(seq)) => seq.max(1),
        Some(StartAt::Lsn(lsn)) => locate(inner, Target::Lsn(lsn)).await?,
        Some(StartAt::Time(time)) => locate(inner, Target::Time(time)).await?,
    };
    info!(durable = %inner.durable, start_sequence, start_at = ?inner.start_at, "outbox-consumer: creating the durable at its start position");
    Ok(new(DeliverPolicy::ByStartSequence { start_sequence }))
}

/// The first sequence of the events committed at or after `target` (stream search).
async fn locate(inner: &Inner, target: Target) -> Result<u64, Error> {
    let found = outbox_position::locate(
        &inner.jetstream,
        &inner.stream,
        target,
        None,
        Limits::default(),
    )
    .await
    .map_err(|e| Error::StartPosition(e.to_string()))?;
    info!(
        %target,
        sequence = found.sequence,
        scanned = found.scanned,
        direct_gets = found.gets,
        "outbox-consumer: start position found in the stream"
    );
    Ok(found.sequence)
}

impl Consumer {
    /// Counters; clone before [`Self::run`] to watch them while it runs.
    pub fn stats(&self) -> ConsumerStats {
        self.inner.stats.clone()
    }

    /// Creates (or updates) the durable consumer, then handles messages until `shutdown`
    /// completes; messages in flight are finished (committed and acked) before it returns.
    ///
    /// Returns an error only for problems it cannot retry: see [`Error`].
    // Long: one `select!` loop over messages, finished work and shutdown; its arms share the worker
    // slots and the drain state
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
        let kept = deliver_policy(&inner, &stream).await?;
        let mut config = pull::Config {
            durable_name: Some(inner.durable.clone()),
            description: Some(format!("outbox-consumer for service {}", inner.service)),
            deliver_policy: kept.deliver_policy,
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
        match inner.subjects.as_slice() {
            _ if kept.unfiltered => {}
            [single] => config.filter_subject = single.clone(),
            many => config.filter_subjects = many.to_vec(),
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
