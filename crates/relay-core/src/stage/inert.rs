//! Pipeline ends that keep or send nothing: a run that must never move a stored checkpoint
//! (`restore` replays a window and drops its copy slot) and one that only counts what it would
//! publish (`restore --dry-run`).

use std::sync::Arc;

use crate::Lsn;
use crate::message::OutboundMessage;
use crate::route::MessageLimits;

use super::{CheckpointStore, PubReceipt, PublishError, Publisher, StoreError};

/// Keeps the ack frontier in memory only: loads nothing, stores nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoStore;

impl CheckpointStore for NoStore {
    async fn load(&mut self) -> Result<Option<Lsn>, StoreError> {
        Ok(None)
    }

    async fn save(&mut self, _lsn: Lsn) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Acknowledges every message at once without sending it, so a run counts what it would
/// publish. Checks messages against `limits`, the real publisher's, so a row the broker would
/// refuse is refused here too.
#[derive(Debug, Clone)]
pub struct DryRunPublisher {
    /// The limits of the publisher this one stands in for.
    pub limits: MessageLimits,
    /// Where the events it would publish are written down (`verify`: what the stream lacks).
    pub record: Option<Arc<WouldPublish>>,
}

/// The events a dry run would publish: how many, and the first [`WouldPublish::KEPT`] of them
/// (event id, commit LSN) in commit order.
#[derive(Debug, Default)]
pub struct WouldPublish {
    pub count: std::sync::atomic::AtomicU64,
    pub first: std::sync::Mutex<Vec<(String, Lsn)>>,
}

impl WouldPublish {
    /// How many events are kept by id.
    pub const KEPT: usize = 1000;

    fn note(&self, msg: &OutboundMessage) {
        self.count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if first.len() < Self::KEPT {
            first.push((msg.event_id.to_string(), msg.commit_lsn));
        }
    }
}

impl Publisher for DryRunPublisher {
    type Ack = std::future::Ready<Result<PubReceipt, PublishError>>;

    async fn send(
        &self,
        msg: &Arc<OutboundMessage>,
        _after: Option<&str>,
    ) -> Result<Self::Ack, PublishError> {
        if let Some(record) = &self.record {
            record.note(msg);
        }
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

    fn hold(&self) {}

    async fn resend(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Self::Ack, PublishError> {
        self.send(msg, after).await
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn message() -> Arc<OutboundMessage> {
        Arc::new(OutboundMessage {
            subject: "outbox.x".into(),
            event_id: "e1".into(),
            headers: Vec::new(),
            shared_headers: 0,
            payload: Bytes::from_static(b"{}"),
            table: "public.outbox".into(),
            commit_lsn: Lsn(7),
            commit_time_micros: 0,
        })
    }

    #[tokio::test]
    async fn no_store_keeps_nothing() {
        let mut store = NoStore;
        store.save(Lsn(42)).await.unwrap();
        assert_eq!(store.load().await.unwrap(), None, "a save is not kept");
    }

    #[tokio::test]
    async fn dry_run_acks_without_a_duplicate_and_keeps_the_limits() {
        let limits = MessageLimits {
            max_payload: 1234,
            ..MessageLimits::NONE
        };
        let publisher = DryRunPublisher {
            limits,
            record: None,
        };
        for ack in [
            publisher.send(&message(), None).await.unwrap(),
            publisher.resend(&message(), None).await.unwrap(),
        ] {
            let receipt = ack.await.unwrap();
            assert!(!receipt.duplicate, "a dry run counts every event as new");
        }
        assert_eq!(publisher.limits().max_payload, 1234);
    }
}
