//! `outbox-relay restore`'s check on the relay's publisher: it notices JetStream dropping an
//! event as a duplicate of a message the stream no longer holds (a purge inside the duplicate
//! window), which is then not restored. A [`PublishHook`], so the publisher stays the relay's.

use std::sync::{Arc, Mutex, PoisonError};

use relay_core::message::{HEADER_MSG_ID, OutboundMessage};
use relay_core::stage::{AckWatch, PubReceipt, PublishError, PublishHook, Settling};

use crate::connection::JetStream;
use crate::publisher::JetStreamPublisher;

/// Notes the events a duplicate answer names a lost copy for. A duplicate answer names the
/// sequence of the copy JetStream remembers; when that copy is gone (a purge inside the
/// `duplicate_window`: the server still remembers the id) the event was not restored, and its
/// id is noted. Clones share one list.
#[derive(Clone)]
pub struct RestoreCheck(Arc<Shared>);

struct Shared {
    jetstream: JetStream,
    stream: String,
    /// Event ids dropped as duplicates of a copy the stream no longer holds.
    not_stored: Mutex<Vec<String>>,
}

impl RestoreCheck {
    /// `publisher` (into `stream`) with the check hooked in, and the check. From then on a
    /// duplicate answer naming a lost copy counts as answered for the publisher: the check
    /// names each such event instead.
    #[must_use]
    pub fn attach(publisher: JetStreamPublisher, stream: String) -> (JetStreamPublisher, Self) {
        publisher.leave_lost_copies_to_caller();
        let check = Self(Arc::new(Shared {
            jetstream: publisher.jetstream().clone(),
            stream,
            not_stored: Mutex::new(Vec::new()),
        }));
        (publisher.with_hook(Arc::new(check.clone())), check)
    }

    /// The event ids JetStream dropped as duplicates of copies the stream no longer holds,
    /// so far, taken out of the list.
    #[must_use]
    pub fn take_not_stored(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .0
                .not_stored
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

impl std::fmt::Debug for RestoreCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreCheck")
            .field("stream", &self.0.stream)
            .finish_non_exhaustive()
    }
}

impl PublishHook for RestoreCheck {
    fn handing(&self, msg: &Arc<OutboundMessage>) -> Option<Box<dyn AckWatch>> {
        Some(Box::new(Watch {
            check: self.0.clone(),
            event_id: msg.event_id.clone(),
        }))
    }
}

/// One event's attempt.
struct Watch {
    check: Arc<Shared>,
    event_id: String,
}

impl AckWatch for Watch {
    fn settled<'a>(self: Box<Self>, outcome: &'a Result<PubReceipt, PublishError>) -> Settling<'a> {
        Box::pin(async move {
            let Ok(receipt) = outcome else { return };
            let check = &self.check;
            if receipt.duplicate
                && !holds(
                    &check.jetstream,
                    &check.stream,
                    receipt.stream_seq,
                    &self.event_id,
                )
                .await
            {
                check
                    .not_stored
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(self.event_id.clone());
            }
        })
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
