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
//! Every batch gets an id no batch had before, in this process or any other (see [`BatchIds`]):
//! nats-server keeps an abandoned batch open for its `max_batch_timeout` (10 s) and refuses its
//! id until then (10176 "incomplete"), so a relay restarted, taken over or reconnected within
//! that time must not reuse the id of a batch its predecessor left half sent.
//!
//! A batch that was not committed, or whose outcome is unknown, is published again **whole**,
//! under a new id, never message by message: a crash during a message-by-message re-send would
//! leave consumers with part of a transaction. The outcomes (`docs/message-format.md`, "Batch
//! errors"):
//! - incomplete (10176), missing sequence (10175), too many open batches (10210), a timeout, a
//!   lost connection, a store failure: published again as a new batch, with backoff, until it
//!   is committed (the server stores nothing of a batch it did not commit);
//! - an id the stream already has (10201): the batch was stored before (a re-send after a lost
//!   ack or a crash): each message is re-sent on its own and answered as a duplicate;
//! - atomic publish disabled (10174) or `Nats-Msg-Id` refused (10177, 2.12.0): batching ends
//!   for the process with a warning, and the batch's messages go on their own;
//! - too large (10199), an invalid id (10179) or commit (10200): refused for good, with the fix;
//!   nothing of the batch is stored and the relay stops before the checkpoint passes it.
//!
//! A commit ack without the batch's id comes from a server that ignored the batch headers and
//! stored each message as it came: batching ends, and the other messages of the batch are
//! re-sent on their own (duplicates).

use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PublishError, PublishErrorKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Shared;
use crate::publisher::MessagePublisher;
use crate::publisher::chain::{Link, NoBase};
use crate::publisher::framing::{After, Handed, Reply, unknown};
use crate::publisher::path::Path;

mod outcome;
mod settle;

use outcome::CommitOutcome;
use settle::Settling;

/// Messages in one atomic batch, at most (nats-server's default `max_batch_size`).
pub(super) const MAX_BATCH: usize = 1000;
/// Atomic batches open at once per stream, at most (nats-server's default).
pub(super) const MAX_OPEN_BATCHES: usize = 50;

/// The failpoint between a batch's messages and its commit.
const BEFORE_COMMIT: &str = "atomic_batch_before_commit";

/// Mints batch ids: `<commit LSN as HI-LO hex>-<part>-<run>-<n>`, where `<run>` is 48 random
/// bits drawn when the process starts and `<n>` counts the batches it framed. No id repeats
/// within a process (the count), and two processes share one with a chance of 2^-48 per pair
/// (the run): a restarted or standby relay never reuses an id the server may still hold open.
/// Deduplication does not need the id: it is by `Nats-Msg-Id`, the event id.
#[derive(Debug)]
pub(crate) struct BatchIds {
    run: u64,
    next: AtomicU64,
}

impl BatchIds {
    pub(crate) fn new() -> Self {
        // RandomState is seeded from the operating system's randomness once per process.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            hasher.write_u128(now.as_nanos());
        }
        Self {
            run: hasher.finish() & 0xFFFF_FFFF_FFFF,
            next: AtomicU64::new(0),
        }
    }

    /// A new id for part `part` of the transaction committed at `commit_lsn`.
    pub(crate) fn mint(&self, commit_lsn: Lsn, part: u32) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let lsn = commit_lsn.0;
        // At most 8+1+8+1+10+1+12+1+16 = 58 characters; the server takes 64.
        format!(
            "{:X}-{:X}-{part}-{:012X}-{n:X}",
            lsn >> 32,
            lsn & 0xFFFF_FFFF,
            self.run
        )
    }
}

/// A batch being framed.
struct OpenBatch {
    id: String,
    /// The transaction's commit LSN and this batch's part of it, for a new id if it is
    /// published again.
    commit_lsn: Lsn,
    part: u32,
    /// Published already, without the commit header, in batch order.
    sent: Vec<(Arc<OutboundMessage>, Reply)>,
    /// The newest message, held back: it carries the commit header if nothing follows.
    held: Option<Handed>,
    /// The first message's condition: the event it names as its predecessor.
    first_after: After,
    /// Its place in the commit-order chain, once its first message went out.
    link: Option<Link>,
    /// A publish of this batch could not even be handed to the connection.
    failed: Option<PublishError>,
    permit: OwnedSemaphorePermit,
    /// The connection every message of the batch and its commit go on, the one the messages
    /// published on their own go on.
    path: Path,
}

/// What the atomic-batch mode keeps between commands.
pub(crate) struct Atomic {
    limit: usize,
    permits: Arc<Semaphore>,
    ids: Arc<BatchIds>,
    /// Part number of the next batch of the open transaction.
    part: u32,
    open: Option<OpenBatch>,
}

impl Atomic {
    /// Batches of at most `max_in_flight` messages (and at most [`MAX_BATCH`]).
    pub(crate) fn new(max_in_flight: usize) -> Self {
        Self {
            limit: MAX_BATCH.min(max_in_flight.max(1)),
            permits: Arc::new(Semaphore::new(MAX_OPEN_BATCHES)),
            ids: Arc::new(BatchIds::new()),
            part: 0,
            open: None,
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// A transaction begins.
    pub(super) fn begin(&mut self) {
        // A batch still open belongs to a session that ended inside its transaction: nobody
        // waits for it, and the server drops it unfinished.
        self.open = None;
        self.part = 0;
    }

    /// Adds a message of the open transaction: the message held back goes out as the batch's
    /// next member and this one is held; the batch is committed at its limit.
    pub(super) async fn add(&mut self, shared: &Shared, handed: Handed) -> Option<Handed> {
        if self.open.is_none() {
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                let _ = handed.2.send(Err(unknown("the batch publisher stopped")));
                return None;
            };
            let per_message = &shared.per_message;
            self.open = Some(OpenBatch {
                path: per_message.path(per_message.ack_timeout).await,
                id: self.ids.mint(handed.0.commit_lsn, self.part),
                commit_lsn: handed.0.commit_lsn,
                part: self.part,
                sent: Vec::new(),
                held: None,
                first_after: handed.1.clone(),
                link: None,
                failed: None,
                permit,
            });
            self.part += 1;
        }
        let open = self.open.as_mut()?;
        if let Some((previous, _, previous_reply)) = open.held.take() {
            open.send_next(shared, previous, previous_reply).await;
        }
        open.held = Some(handed);
        if open.sent.len() + 1 >= self.limit {
            return self.commit(shared).await;
        }
        None
    }

    /// Sends the held message with the commit header; a task sees the batch acknowledged. A
    /// batch of one message is returned instead, to go on its own.
    pub(super) async fn commit(&mut self, shared: &Shared) -> Option<Handed> {
        let mut open = self.open.take()?;
        let (last, last_after, last_reply) = open.held.take()?;
        let count = open.sent.len() + 1;
        if let Some(link) = open.link.as_mut() {
            shared.chain.close(link, count as u64);
        }
        if count == 1 && open.failed.is_none() {
            // One message is atomic on its own, and a batch costs the server a staging store
            // per batch (a directory created and deleted for a file-stored R1 stream:
            // nats-server's server/jetstream_batching.go, newBatchStore): ~160 batches/s here,
            // which made 1-row transactions 50x slower than per-message.
            drop(open.permit);
            return Some((last, last_after, last_reply));
        }
        let per_message = &shared.per_message;
        let mut members = std::mem::take(&mut open.sent);
        members.push((last.clone(), last_reply));
        if relay_core::failpoint::is_armed(BEFORE_COMMIT) {
            // The fault suite's crash mid-batch: the other messages read by the server, no
            // commit.
            open.path.flush(per_message.ack_timeout).await;
            relay_core::failpoint::hit(BEFORE_COMMIT);
        }
        let first = match open.failed.take() {
            // Some of the batch never reached the connection: nothing of it can be committed,
            // so it is published again whole, like any batch the server did not commit.
            Some(failed) => Err(failed),
            None => send_commit(per_message, &open.path, &last, &open.id, count).await,
        };
        let condition = open.link.as_ref().and_then(|link| link.base);
        let settling = Settling {
            link: open.link.take(),
            condition,
            first_after: open.first_after.take(),
            per_message: per_message.clone(),
            disabled: shared.disabled.clone(),
            ids: self.ids.clone(),
            commit_lsn: open.commit_lsn,
            part: open.part,
            id: open.id,
            members,
        };
        tokio::spawn(settling.run(first, open.permit));
        None
    }
}

impl OpenBatch {
    /// Sends `msg` as the batch's next member (no commit header); the first takes the batch's
    /// place in the commit order.
    async fn send_next(&mut self, shared: &Shared, msg: Arc<OutboundMessage>, reply: Reply) {
        let sequence = self.sent.len() + 1;
        if sequence == 1 {
            // The batch takes its place in the commit order as its first message goes.
            match shared.chain.open_batch(self.first_after.is_some()).await {
                Ok(link) => self.link = Some(link),
                Err(NoBase) => {
                    self.failed = Some(PublishError::new(
                        PublishErrorKind::OutOfTurn,
                        "the event before this atomic batch is not known stored and the stream's last sequence is unknown: re-sent in order".to_owned(),
                    ));
                }
            }
        }
        let condition = self.link.as_ref().and_then(|link| link.base);
        if self.failed.is_none()
            && let Err(e) = send_member(
                &shared.per_message,
                &self.path,
                &msg,
                &self.id,
                sequence,
                condition.filter(|_| sequence == 1),
            )
            .await
        {
            self.failed = Some(e);
        }
        self.sent.push((msg, reply));
    }
}

/// The batch headers (ADR-50), as the lean connection writes them; a test holds them to
/// async-nats' names.
const BATCH_ID: &str = "Nats-Batch-Id";
const BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
const BATCH_COMMIT: &str = "Nats-Batch-Commit";

/// The header lines of a batch member, beside the message's own; `condition` as text, on the
/// first.
fn batch_lines<'a>(
    id: &'a str,
    sequence: &'a str,
    commit: bool,
    condition: Option<&'a str>,
) -> Vec<(&'a str, &'a str)> {
    let mut lines = vec![(BATCH_ID, id), (BATCH_SEQUENCE, sequence)];
    if let Some(last) = condition {
        // The only condition an atomic batch takes (see `chain`).
        lines.push((relay_core::message::HEADER_EXPECTED_LAST_SEQUENCE, last));
    }
    if commit {
        lines.push((BATCH_COMMIT, "1"));
    }
    lines
}

/// Publishes a batch member other than the last on `path` (no answer: only the commit is
/// acknowledged).
async fn send_member(
    per_message: &MessagePublisher,
    path: &Path,
    msg: &OutboundMessage,
    id: &str,
    sequence: usize,
    condition: Option<u64>,
) -> Result<(), PublishError> {
    let sequence = sequence.to_string();
    let condition = condition.map(|last| last.to_string());
    let lines = batch_lines(id, &sequence, false, condition.as_deref());
    path.publish_unanswered(&per_message.stream, msg, &lines)
        .await
}

/// Publishes a batch's last message with the commit header on `path`; the future sees the
/// answer, checked for the publisher's stream and domain.
async fn send_commit(
    per_message: &MessagePublisher,
    path: &Path,
    last: &Arc<OutboundMessage>,
    id: &str,
    count: usize,
) -> Result<BoxFuture<'static, CommitOutcome>, PublishError> {
    let count = count.to_string();
    let lines = batch_lines(id, &count, true, None);
    let domain = per_message.domain.clone();
    let stream = per_message.stream.clone();
    let answer = path
        .publish_commit(&per_message.stream, last, &lines)
        .await?;
    Ok(Box::pin(async move {
        CommitOutcome::from_answer(answer.await).expecting(&stream, domain.as_deref())
    }))
}

#[cfg(test)]
mod tests;
