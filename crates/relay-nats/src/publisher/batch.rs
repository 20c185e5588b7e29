//! `[nats] publish_mode = "atomic-batch"`: one PostgreSQL transaction = one JetStream atomic
//! batch (ADR-50, nats-server 2.12.1+; see `docs/message-format.md`, "Batch publishing").
//! A transaction of one message is published on its own: it is atomic without a batch.
//!
//! One task frames the batches, so everything reaches the connection in the order the pipeline
//! handed it over. The messages of a transaction (between [`Publisher::begin_transaction`] and
//! [`Publisher::end_transaction`], with its commit LSN) are published with `Nats-Batch-Id`
//! and `Nats-Batch-Sequence`; the last one is held back until the transaction ends and then
//! sent with `Nats-Batch-Commit: 1`, and the commit's PubAck acknowledges every message of the
//! batch. A transaction larger than the batch limit is committed in parts. Everything else (a
//! dead letter of an earlier transaction, a non-transactional logical message, a re-send) is
//! published on its own, as in `per-message` mode.
//!
//! A batch the server refuses whole — one of its ids is already stored (10201: a re-send after
//! a lost ack or a crash), atomic publish disabled (10174) or `Nats-Msg-Id` refused (10177,
//! 2.12.0) — is published again message by message, where JetStream's deduplication answers
//! for each; the last two also end batching for the process. A commit ack without the batch's
//! id comes from a server that ignored the batch headers and stored each message as it came:
//! batching ends, and the other messages of the batch are re-sent on their own (duplicates).

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ErrorCode};
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PubReceipt, PublishError, Publisher};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::JetStreamPublisher;
use super::framing::{Command, Framer, FramingMode, Reply, batchable, reply_when_acked, unknown};

/// Messages in one atomic batch, at most (nats-server's default `max_batch_size`).
pub const MAX_BATCH: usize = 1000;
/// Atomic batches open at once per stream, at most (nats-server's default).
pub const MAX_OPEN_BATCHES: usize = 50;

/// 10201: the batch holds a message id the stream already has (or one id twice).
const BATCH_DUPLICATE: u64 = 10201;
/// 10174: the stream does not allow atomic publish.
const BATCH_DISABLED: u64 = 10174;
/// 10177: a header the server does not allow in a batch (`Nats-Msg-Id` before 2.12.1).
const BATCH_UNSUPPORTED_HEADER: u64 = 10177;

/// Starts the framing task over `plain`, a publisher that sends each message on its own, and
/// returns the handle the publisher keeps.
pub(crate) fn start(plain: JetStreamPublisher, max_in_flight: usize) -> Framer {
    let (framer, receiver) = Framer::new(FramingMode::AtomicBatch);
    let limit = MAX_BATCH.min(max_in_flight.max(1));
    let worker = Worker {
        plain,
        limit,
        permits: Arc::new(Semaphore::new(MAX_OPEN_BATCHES)),
        current: None,
        part: 0,
        open: None,
        disabled: Arc::new(AtomicBool::new(false)),
    };
    tokio::spawn(worker.run(receiver));
    framer
}

/// A batch being framed.
struct OpenBatch {
    id: String,
    /// Published already, without the commit header, in batch order.
    sent: Vec<(Arc<OutboundMessage>, Reply)>,
    /// The newest message, held back: it carries the commit header if nothing follows.
    held: Option<(Arc<OutboundMessage>, Reply)>,
    /// A publish of this batch could not even be handed to the connection.
    failed: Option<PublishError>,
    permit: OwnedSemaphorePermit,
}

struct Worker {
    plain: JetStreamPublisher,
    limit: usize,
    permits: Arc<Semaphore>,
    /// Commit LSN of the open transaction.
    current: Option<Lsn>,
    /// Part number of the next batch of the open transaction.
    part: u32,
    open: Option<OpenBatch>,
    /// Set once the server showed it cannot take batches: everything goes on its own.
    disabled: Arc<AtomicBool>,
}

impl Worker {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        while let Some(command) = commands.recv().await {
            match command {
                Command::Begin(lsn) => {
                    // A batch still open belongs to a session that ended inside its
                    // transaction: nobody waits for it, and the server drops it unfinished.
                    self.open = None;
                    self.current = Some(lsn);
                    self.part = 0;
                }
                Command::Send(msg, reply) => {
                    if batchable(&msg, self.current, &self.disabled) {
                        self.add(msg, reply).await;
                    } else {
                        self.alone(msg, reply).await;
                    }
                }
                Command::End => {
                    self.commit().await;
                    self.current = None;
                }
            }
        }
    }

    /// Publishes `msg` on its own; its ack goes to `reply`.
    async fn alone(&self, msg: Arc<OutboundMessage>, reply: Reply) {
        reply_when_acked(self.plain.send(&msg).await, reply);
    }

    async fn add(&mut self, msg: Arc<OutboundMessage>, reply: Reply) {
        if self.open.is_none() {
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                let _ = reply.send(Err(unknown("the batch publisher stopped")));
                return;
            };
            let lsn = msg.commit_lsn.0;
            self.open = Some(OpenBatch {
                // Readable in the stream: the transaction's commit LSN and the part.
                id: format!("{:X}-{:X}-{}", lsn >> 32, lsn & 0xFFFF_FFFF, self.part),
                sent: Vec::new(),
                held: None,
                failed: None,
                permit,
            });
            self.part += 1;
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if let Some((previous, previous_reply)) = open.held.take() {
            let sequence = open.sent.len() + 1;
            if open.failed.is_none() {
                let headers = batch_headers(&self.plain, &previous, &open.id, sequence, false);
                if let Err(e) = self
                    .plain
                    .client()
                    .publish_with_headers(
                        previous.subject.clone(),
                        headers,
                        previous.payload.clone(),
                    )
                    .await
                {
                    open.failed = Some(unknown(&format!("cannot publish to NATS: {e}")));
                }
            }
            open.sent.push((previous, previous_reply));
        }
        open.held = Some((msg, reply));
        if open.sent.len() + 1 >= self.limit {
            self.commit().await;
        }
    }

    /// Sends the held message with the commit header; a task sees the batch acknowledged.
    async fn commit(&mut self) {
        let Some(mut open) = self.open.take() else {
            return;
        };
        let Some((last, last_reply)) = open.held.take() else {
            return;
        };
        let count = open.sent.len() + 1;
        if count == 1 && open.failed.is_none() {
            // One message is atomic on its own, and a batch costs the server a staging store
            // per batch (a directory created and deleted for a file-stored R1 stream:
            // nats-server's server/jetstream_batching.go, newBatchStore): ~160 batches/s here,
            // which made 1-row transactions 50x slower than per-message.
            drop(open.permit);
            self.alone(last, last_reply).await;
            return;
        }
        let mut members = std::mem::take(&mut open.sent);
        members.push((last.clone(), last_reply));
        if let Some(failed) = open.failed.take() {
            for (_, reply) in members {
                let _ = reply.send(Err(failed.clone()));
            }
            return;
        }
        let headers = batch_headers(&self.plain, &last, &open.id, count, true);
        let publish = PublishMessage::build()
            .headers(headers)
            .payload(last.payload.clone());
        let ack = self
            .plain
            .context()
            .send_publish(last.subject.clone(), publish)
            .await;
        let plain = self.plain.clone();
        let disabled = self.disabled.clone();
        let id = open.id.clone();
        let permit = open.permit;
        tokio::spawn(async move {
            let outcome = match ack {
                Ok(ack) => ack.await,
                Err(e) => Err(e),
            };
            drop(permit);
            settle(plain, disabled, id, members, outcome).await;
        });
    }
}

/// The headers of `msg` as the publisher sends it, plus the batch's.
fn batch_headers(
    plain: &JetStreamPublisher,
    msg: &OutboundMessage,
    id: &str,
    sequence: usize,
    commit: bool,
) -> async_nats::HeaderMap {
    let mut headers = plain.headers(msg);
    headers.insert(async_nats::header::NATS_BATCH_ID, id);
    headers.insert(
        async_nats::header::NATS_BATCH_SEQUENCE,
        sequence.to_string().as_str(),
    );
    if commit {
        headers.insert(async_nats::header::NATS_BATCH_COMMIT, "1");
    }
    headers
}

/// Hands each member of a batch its outcome from the commit's ack.
async fn settle(
    plain: JetStreamPublisher,
    disabled: Arc<AtomicBool>,
    id: String,
    members: Vec<(Arc<OutboundMessage>, Reply)>,
    outcome: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
) {
    let count = members.len() as u64;
    match outcome {
        Ok(ack) if ack.batch_id.as_deref() == Some(id.as_str()) => {
            let stored = ack.batch_size.unwrap_or(count);
            let first = ack.sequence.saturating_sub(stored.saturating_sub(1));
            for (i, (_, reply)) in members.into_iter().enumerate() {
                let _ = reply.send(Ok(PubReceipt {
                    stream_seq: first + i as u64,
                    duplicate: false,
                }));
            }
        }
        Ok(ack) => {
            // The server stored each message as it came (it ignores the batch headers): the
            // last one is acknowledged, the others' outcomes are unknown.
            if !disabled.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    batch = %id,
                    "a NATS server acknowledged an atomic batch without its id: it ignores batch headers (before 2.12); publishing each message on its own from now on"
                );
            }
            let last = members.len().saturating_sub(1);
            for (i, (_, reply)) in members.into_iter().enumerate() {
                let outcome = if i == last {
                    Ok(PubReceipt {
                        stream_seq: ack.sequence,
                        duplicate: ack.duplicate,
                    })
                } else {
                    Err(unknown(
                        "the server stored the batch's messages one by one: re-sending it alone",
                    ))
                };
                let _ = reply.send(outcome);
            }
        }
        Err(error) => {
            let code = error
                .source()
                .and_then(|s| s.downcast_ref::<jetstream::Error>())
                .map(|e| e.error_code());
            let refused_whole = [BATCH_DUPLICATE, BATCH_DISABLED, BATCH_UNSUPPORTED_HEADER]
                .map(ErrorCode)
                .into_iter()
                .any(|c| Some(c) == code);
            if !refused_whole {
                let error = crate::publisher::classify(error);
                for (_, reply) in members {
                    let _ = reply.send(Err(error.clone()));
                }
                return;
            }
            if code != Some(ErrorCode(BATCH_DUPLICATE)) && !disabled.swap(true, Ordering::Relaxed) {
                tracing::warn!(batch = %id, error = %error, "JetStream refuses atomic batches here; publishing each message on its own from now on");
            } else {
                tracing::debug!(batch = %id, error = %error, "batch refused whole; publishing its messages one by one");
            }
            // Nothing of the batch was stored: each message on its own, in order, where the
            // stream's deduplication answers for those it already holds.
            for (msg, reply) in members {
                let outcome = match plain.send(&msg).await {
                    Ok(ack) => ack.await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(outcome);
            }
        }
    }
}

/// Whether a server of version `version` (INFO) takes `Nats-Msg-Id` inside atomic batches:
/// 2.12.1 or later.
pub(crate) fn supports_atomic_batches(version: &str) -> bool {
    crate::native::version_triple(version) >= (2, 12, 1)
}

#[cfg(test)]
mod tests {
    use super::supports_atomic_batches;

    #[test]
    fn nats_msg_id_in_batches_needs_2_12_1() {
        for yes in [
            "2.12.1",
            "2.12.15",
            "2.14.0",
            "2.15.1",
            "v2.14.5",
            "3.0.0",
            "2.13.0-RC.1",
        ] {
            assert!(supports_atomic_batches(yes), "{yes}");
        }
        for no in ["2.12.0", "2.11.9", "2.9.10", "", "garbage", "2.12.0-RC.5"] {
            assert!(!supports_atomic_batches(no), "{no}");
        }
    }
}
