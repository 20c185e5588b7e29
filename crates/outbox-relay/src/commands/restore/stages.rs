//! The restore's ends of the relay's pipeline: a source that stops at the end of the window, a
//! store that keeps nothing (a restore never moves the stored checkpoint), a publisher that
//! notices JetStream dropping an event as a duplicate of a message it no longer holds, and one
//! that publishes nothing (`--dry-run`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt as _;
use futures::future::BoxFuture;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::route::MessageLimits;
use relay_core::stage::{
    ChangeSource, CheckpointStore, PubReceipt, PublishError, Publisher, SourceError, SourceEvent,
    StoreError,
};
use relay_nats::{JetStream, JetStreamPublisher};
use relay_postgres::PgSource;

/// The copy slot's stream, up to (not including) the first transaction committed at or after
/// `end`. Nothing is ever confirmed to the copy: it is dropped at the end.
pub(super) struct WindowSource {
    pub(super) inner: PgSource,
    pub(super) end: Lsn,
    /// Inside a transaction (a keepalive past `end` ends the window only between them).
    pub(super) in_tx: bool,
    /// The last commit position read, for the progress lines.
    pub(super) reached: Arc<AtomicU64>,
}

impl ChangeSource for WindowSource {
    async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        let Some(event) = self.inner.next().await? else {
            return Ok(None);
        };
        match &event {
            // Begin carries the commit LSN: this transaction is past the window.
            SourceEvent::Begin { final_lsn, .. } if *final_lsn >= self.end => {
                self.reached.fetch_max(self.end.0, Ordering::Relaxed);
                return Ok(None);
            }
            SourceEvent::Begin { final_lsn, .. } => {
                self.in_tx = true;
                self.reached.fetch_max(final_lsn.0, Ordering::Relaxed);
            }
            SourceEvent::Commit { .. } => self.in_tx = false,
            // A keepalive names a position decoding has passed: every transaction committed
            // before it was sent already.
            SourceEvent::KeepAlive { wal_end } if !self.in_tx && *wal_end >= self.end => {
                self.reached.fetch_max(self.end.0, Ordering::Relaxed);
                return Ok(None);
            }
            _ => {}
        }
        Ok(Some(event))
    }

    fn confirm(&mut self, _lsn: Lsn) {}
}

/// Keeps the frontier in memory only.
pub(super) struct NoStore;

impl CheckpointStore for NoStore {
    async fn load(&mut self) -> Result<Option<Lsn>, StoreError> {
        Ok(None)
    }

    async fn save(&mut self, _lsn: Lsn) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The relay's publisher. A duplicate ack names the sequence of the copy JetStream remembers;
/// when that copy is gone (a purge inside the `duplicate_window`: the server still remembers
/// the id) the event was not restored, and its id is noted.
#[derive(Clone)]
pub(super) struct RestorePublisher {
    pub(super) inner: JetStreamPublisher,
    /// Shared by every ack future: one reference count per message, not a copy of each part.
    pub(super) duplicates: Arc<DuplicateCheck>,
}

/// What an ack future needs to tell a duplicate the stream still holds from one it does not.
pub(super) struct DuplicateCheck {
    pub(super) jetstream: JetStream,
    pub(super) stream: String,
    pub(super) not_stored: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for RestorePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestorePublisher")
            .field("stream", &self.duplicates.stream)
            .finish_non_exhaustive()
    }
}

/// Whether `stream` holds a message at `seq` with `Nats-Msg-Id` `id`; an error counts as no
/// (the next run's scan of the stream finds it, if it is there).
async fn holds(jetstream: &JetStream, stream: &str, seq: u64, id: &str) -> bool {
    let Ok(handle) = jetstream.context().get_stream_no_info(stream).await else {
        return false;
    };
    match handle.get_raw_message(seq).await {
        Ok(stored) => stored
            .headers
            .get(relay_core::message::HEADER_MSG_ID)
            .is_some_and(|v| v.as_str() == id),
        Err(_) => false,
    }
}

impl Publisher for RestorePublisher {
    type Ack = BoxFuture<'static, Result<PubReceipt, PublishError>>;

    async fn send(&self, msg: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
        let ack = self.inner.send(msg).await?;
        Ok(self.checked(ack, msg))
    }

    async fn resend(&self, msg: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
        let ack = self.inner.resend(msg).await?;
        Ok(self.checked(ack, msg))
    }

    // The window's transactions, so that batches follow them as in the relay.
    fn begin_transaction(&self, commit_lsn: Lsn) {
        self.inner.begin_transaction(commit_lsn);
    }

    fn end_transaction(&self) {
        self.inner.end_transaction();
    }

    fn limits(&self) -> MessageLimits {
        self.inner.limits()
    }

    fn max_server_closes(&self) -> u32 {
        self.inner.max_server_closes()
    }

    fn stream_name(&self) -> Option<Arc<str>> {
        self.inner.stream_name()
    }
}

impl RestorePublisher {
    /// `ack`, which notes the event as not restored when it is a duplicate of a copy the
    /// stream no longer holds.
    fn checked(
        &self,
        ack: <JetStreamPublisher as Publisher>::Ack,
        msg: &Arc<OutboundMessage>,
    ) -> BoxFuture<'static, Result<PubReceipt, PublishError>> {
        let (check, msg) = (self.duplicates.clone(), msg.clone());
        async move {
            let receipt = ack.await?;
            if receipt.duplicate
                && !holds(
                    &check.jetstream,
                    &check.stream,
                    receipt.stream_seq,
                    &msg.event_id,
                )
                .await
            {
                check
                    .not_stored
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(msg.event_id.clone());
            }
            Ok(receipt)
        }
        .boxed()
    }
}

/// `--dry-run`: counts the events it would publish, sends nothing.
#[derive(Debug, Clone)]
pub(super) struct DryRunPublisher {
    pub(super) limits: MessageLimits,
}

impl Publisher for DryRunPublisher {
    type Ack = std::future::Ready<Result<PubReceipt, PublishError>>;

    async fn send(&self, _msg: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
        Ok(std::future::ready(Ok(PubReceipt {
            stream_seq: 0,
            duplicate: false,
        })))
    }

    fn limits(&self) -> MessageLimits {
        self.limits
    }

    fn begin_transaction(&self, _commit_lsn: Lsn) {}

    fn end_transaction(&self) {}

    async fn resend(&self, msg: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
        self.send(msg).await
    }
}
