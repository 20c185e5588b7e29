//! The durable pull consumer and its run loop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use futures::{StreamExt as _, TryStreamExt as _};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::handler::Handler;
use crate::ledger::ensure_ledger;
use crate::shared::{Error, Inner, LedgerConnections, Ordering};
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

impl Consumer {
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
