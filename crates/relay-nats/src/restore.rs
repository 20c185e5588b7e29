//! `outbox-relay restore`'s publisher: the relay's, and it notices JetStream dropping an event
//! as a duplicate of a message the stream no longer holds (a purge inside the duplicate window),
//! which is then not restored.

use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt as _;
use futures::future::BoxFuture;
use relay_core::Lsn;
use relay_core::message::{HEADER_MSG_ID, OutboundMessage};
use relay_core::route::MessageLimits;
use relay_core::stage::{PubReceipt, PublishError, Publisher};

use crate::connection::JetStream;
use crate::publisher::JetStreamPublisher;

/// The relay's publisher. A duplicate ack names the sequence of the copy JetStream remembers;
/// when that copy is gone (a purge inside the `duplicate_window`: the server still remembers
/// the id) the event was not restored, and its id is noted.
#[derive(Clone)]
pub struct RestorePublisher {
    inner: JetStreamPublisher,
    /// Shared by every ack future: one reference count per message, not a copy of each part.
    duplicates: Arc<DuplicateCheck>,
}

/// What an ack future needs to tell a duplicate the stream still holds from one it does not.
struct DuplicateCheck {
    jetstream: JetStream,
    stream: String,
    /// Event ids dropped as duplicates of a copy the stream no longer holds.
    not_stored: Mutex<Vec<String>>,
}

impl RestorePublisher {
    /// `inner`, publishing into `stream`.
    #[must_use]
    pub fn new(inner: JetStreamPublisher, stream: String) -> Self {
        inner.leave_lost_copies_to_caller();
        Self {
            duplicates: Arc::new(DuplicateCheck {
                jetstream: inner.jetstream().clone(),
                stream,
                not_stored: Mutex::new(Vec::new()),
            }),
            inner,
        }
    }

    /// The event ids JetStream dropped as duplicates of copies the stream no longer holds,
    /// so far (every clone of this publisher notes them in one list), taken out of the list.
    #[must_use]
    pub fn take_not_stored(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .duplicates
                .not_stored
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
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
            .get(HEADER_MSG_ID)
            .is_some_and(|v| v.as_str() == id),
        Err(_) => false,
    }
}

impl Publisher for RestorePublisher {
    type Ack = BoxFuture<'static, Result<PubReceipt, PublishError>>;

    async fn send(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Self::Ack, PublishError> {
        let ack = self.inner.send(msg, after).await?;
        Ok(self.checked(ack, msg))
    }

    async fn resend(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Self::Ack, PublishError> {
        let ack = self.inner.resend(msg, after).await?;
        Ok(self.checked(ack, msg))
    }

    // The window's transactions, so that batches follow them as in the relay.
    fn begin_transaction(&self, commit_lsn: Lsn) {
        self.inner.begin_transaction(commit_lsn);
    }

    fn end_transaction(&self) {
        self.inner.end_transaction();
    }

    fn hold(&self) {
        self.inner.hold();
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
