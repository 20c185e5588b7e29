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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use futures::future::BoxFuture;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use super::MessagePublisher;
use super::framing::{
    After, Command, Framer, FramingMode, Reply, alone_in_chain, batchable, reply_when_acked,
    unknown,
};
use super::message::Condition;
use crate::wire::LeanConnection;

mod outcome;

use super::chain::{Chain, Link, NoBase};
use outcome::{CommitOutcome, Verdict, judge};

/// Messages in one atomic batch, at most (nats-server's default `max_batch_size`).
pub(super) const MAX_BATCH: usize = 1000;
/// Atomic batches open at once per stream, at most (nats-server's default).
pub(super) const MAX_OPEN_BATCHES: usize = 50;

/// The failpoint between a batch's messages and its commit.
const BEFORE_COMMIT: &str = "atomic_batch_before_commit";

/// First wait before a batch is published again; doubled up to [`REPUBLISH_MAX_DELAY`].
const REPUBLISH_FIRST_DELAY: Duration = Duration::from_millis(100);
const REPUBLISH_MAX_DELAY: Duration = Duration::from_secs(5);
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

/// Starts the framing task over `per_message`, a publisher that sends each message on its own, and
/// returns the handle the publisher keeps.
pub(crate) fn start(per_message: MessagePublisher, max_in_flight: usize) -> Framer {
    let (framer, receiver) = Framer::new(FramingMode::AtomicBatch);
    let chain = Arc::new(Chain::default());
    let limit = MAX_BATCH.min(max_in_flight.max(1));
    let worker = Worker {
        chain: chain.clone(),
        per_message,
        limit,
        permits: Arc::new(Semaphore::new(MAX_OPEN_BATCHES)),
        ids: Arc::new(BatchIds::new()),
        current: None,
        part: 0,
        open: None,
        disabled: Arc::new(AtomicBool::new(false)),
    };
    tokio::spawn(worker.run(receiver));
    framer.with_chain(chain)
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
    held: Option<(Arc<OutboundMessage>, After, Reply)>,
    /// The first message's condition: the event it names as its predecessor.
    first_after: After,
    /// Its place in the commit-order chain, once its first message went out.
    link: Option<Link>,
    /// A publish of this batch could not even be handed to the connection.
    failed: Option<PublishError>,
    permit: OwnedSemaphorePermit,
    /// The lean connection every message of the batch and its commit go on, as the messages
    /// published on their own do; async-nats' where the publisher publishes through it.
    lean: Option<Arc<LeanConnection>>,
}

struct Worker {
    chain: Arc<Chain>,
    per_message: MessagePublisher,
    limit: usize,
    permits: Arc<Semaphore>,
    ids: Arc<BatchIds>,
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
                Command::Send(msg, after, reply) => {
                    if batchable(&msg, self.current, &self.disabled) {
                        self.add(msg, after, reply).await;
                    } else {
                        self.alone(msg, after, reply, false).await;
                    }
                }
                Command::Resend(msg, after, reply) => self.alone(msg, after, reply, true).await,
                Command::End => {
                    self.commit().await;
                    self.current = None;
                }
                // The transaction goes on in the next part.
                Command::Hold => self.commit().await,
            }
        }
    }

    /// Publishes `msg` on its condition, on its own; its ack goes to `reply`. `resend`: the
    /// pipeline's re-send (only on a stream where every condition names a sequence; elsewhere
    /// re-sends go around this task).
    async fn alone(&mut self, msg: Arc<OutboundMessage>, after: After, reply: Reply, resend: bool) {
        if self.per_message.by_sequence {
            // Its condition is a sequence the chain predicts, which an open batch's count
            // would change: the batch is committed first (a part of its transaction).
            self.commit().await;
            alone_in_chain(&self.per_message, &self.chain, &msg, &after, resend, reply).await;
            return;
        }
        let link = self.chain.alone(false);
        let sent = self
            .per_message
            .send_now(&msg, Condition::event(after.as_deref()))
            .await;
        reply_when_acked(sent.map(|ack| link.follow(ack)), reply);
    }

    async fn add(&mut self, msg: Arc<OutboundMessage>, after: After, reply: Reply) {
        if self.open.is_none() {
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                let _ = reply.send(Err(unknown("the batch publisher stopped")));
                return;
            };
            let lean = self
                .per_message
                .lean_path(self.per_message.ack_timeout)
                .await;
            self.open = Some(OpenBatch {
                lean,
                id: self.ids.mint(msg.commit_lsn, self.part),
                commit_lsn: msg.commit_lsn,
                part: self.part,
                sent: Vec::new(),
                held: None,
                first_after: after.clone(),
                link: None,
                failed: None,
                permit,
            });
            self.part += 1;
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if let Some((previous, _, previous_reply)) = open.held.take() {
            let sequence = open.sent.len() + 1;
            if sequence == 1 {
                // The batch takes its place in the commit order as its first message goes.
                match self.chain.open_batch(open.first_after.is_some()).await {
                    Ok(link) => open.link = Some(link),
                    Err(NoBase) => {
                        open.failed = Some(PublishError::new(
                            PublishErrorKind::OutOfTurn,
                            "the event before this atomic batch is not known stored and the stream's last sequence is unknown: re-sent in order".to_owned(),
                        ));
                    }
                }
            }
            let condition = open.link.as_ref().and_then(|link| link.base);
            if open.failed.is_none()
                && let Err(e) = send_member(
                    &self.per_message,
                    open.lean.as_deref(),
                    &previous,
                    &open.id,
                    sequence,
                    condition.filter(|_| sequence == 1),
                )
                .await
            {
                open.failed = Some(e);
            }
            open.sent.push((previous, previous_reply));
        }
        open.held = Some((msg, after, reply));
        if open.sent.len() + 1 >= self.limit {
            self.commit().await;
        }
    }

    /// Sends the held message with the commit header; a task sees the batch acknowledged.
    async fn commit(&mut self) {
        let Some(mut open) = self.open.take() else {
            return;
        };
        let Some((last, last_after, last_reply)) = open.held.take() else {
            return;
        };
        let count = open.sent.len() + 1;
        if let Some(link) = open.link.as_mut() {
            self.chain.close(link, count as u64);
        }
        if count == 1 && open.failed.is_none() {
            // One message is atomic on its own, and a batch costs the server a staging store
            // per batch (a directory created and deleted for a file-stored R1 stream:
            // nats-server's server/jetstream_batching.go, newBatchStore): ~160 batches/s here,
            // which made 1-row transactions 50x slower than per-message.
            drop(open.permit);
            Box::pin(self.alone(last, last_after, last_reply, false)).await;
            return;
        }
        let mut members = std::mem::take(&mut open.sent);
        members.push((last.clone(), last_reply));
        if relay_core::failpoint::is_armed(BEFORE_COMMIT) {
            // The fault suite's crash mid-batch: the other messages read by the server, no
            // commit.
            match &open.lean {
                Some(lean) => drop(lean.flush(self.per_message.ack_timeout).await),
                None => drop(self.per_message.client().flush().await),
            }
            relay_core::failpoint::hit(BEFORE_COMMIT);
        }
        let first = match open.failed.take() {
            // Some of the batch never reached the connection: nothing of it can be committed,
            // so it is published again whole, like any batch the server did not commit.
            Some(failed) => Err(failed),
            None => {
                send_commit(
                    &self.per_message,
                    open.lean.as_deref(),
                    &last,
                    &open.id,
                    count,
                )
                .await
            }
        };
        let condition = open.link.as_ref().and_then(|link| link.base);
        let settling = Settling {
            link: open.link.take(),
            condition,
            first_after: open.first_after.take(),
            per_message: self.per_message.clone(),
            disabled: self.disabled.clone(),
            ids: self.ids.clone(),
            commit_lsn: open.commit_lsn,
            part: open.part,
            id: open.id,
            members,
        };
        let permit = open.permit;
        tokio::spawn(async move {
            let outcome = match first {
                Ok(answer) => answer.await,
                Err(failed) if failed.kind == PublishErrorKind::OutOfTurn => {
                    // Never sent: the pipeline re-sends its events in order.
                    settling.conclude(Verdict::Refused(failed)).await;
                    drop(permit);
                    return;
                }
                Err(failed) => {
                    settling.republish_whole(failed, Instant::now()).await;
                    drop(permit);
                    return;
                }
            };
            settling.settle(outcome).await;
            // The server's limit counts open batches until they are committed or refused.
            drop(permit);
        });
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

/// Publishes a batch member other than the last (no answer: only the commit is acknowledged),
/// on `lean` or, without it, through async-nats.
async fn send_member(
    per_message: &MessagePublisher,
    lean: Option<&LeanConnection>,
    msg: &OutboundMessage,
    id: &str,
    sequence: usize,
    condition: Option<u64>,
) -> Result<(), PublishError> {
    let sequence = sequence.to_string();
    let condition = condition.map(|last| last.to_string());
    let lines = batch_lines(id, &sequence, false, condition.as_deref());
    if let Some(lean) = lean {
        return lean
            .publish_unanswered(&per_message.stream, msg, &lines)
            .map_err(crate::wire::publish_error);
    }
    per_message
        .client()
        .publish_with_headers(
            msg.subject.clone(),
            batch_headers(per_message, msg, &lines),
            msg.payload.clone(),
        )
        .await
        .map_err(|e| unknown(&format!("cannot publish to NATS: {e}")))
}

/// Publishes a batch's last message with the commit header; the future sees the answer.
async fn send_commit(
    per_message: &MessagePublisher,
    lean: Option<&LeanConnection>,
    last: &Arc<OutboundMessage>,
    id: &str,
    count: usize,
) -> Result<BoxFuture<'static, CommitOutcome>, PublishError> {
    let count = count.to_string();
    let lines = batch_lines(id, &count, true, None);
    let domain = per_message.domain.clone();
    let stream = per_message.stream.clone();
    if let Some(lean) = lean {
        let answer = lean
            .publish_raw(&per_message.stream, last, &lines)
            .map_err(crate::wire::publish_error)?;
        return Ok(Box::pin(async move {
            CommitOutcome::from_lean(
                answer
                    .await
                    .unwrap_or_else(|_| Err(crate::wire::connection_closed())),
            )
            .expecting(&stream, domain.as_deref())
        }));
    }
    let publish = PublishMessage::build()
        .headers(batch_headers(per_message, last, &lines))
        .payload(last.payload.clone());
    match per_message
        .context()
        .send_publish(last.subject.clone(), publish)
        .await
    {
        Ok(ack) => Ok(Box::pin(async move {
            CommitOutcome::from_nats(ack.await).expecting(&stream, domain.as_deref())
        })),
        Err(e) => Ok(Box::pin(std::future::ready(CommitOutcome::from_nats(Err(
            e,
        ))))),
    }
}

/// The headers of `msg` as the publisher sends it through async-nats, plus `lines`.
fn batch_headers(
    per_message: &MessagePublisher,
    msg: &OutboundMessage,
    lines: &[(&str, &str)],
) -> async_nats::HeaderMap {
    let mut headers = per_message.headers(msg);
    for (name, value) in lines {
        headers.insert(*name, *value);
    }
    headers
}

/// A batch whose commit was sent (or could not be), waiting for its outcome.
struct Settling {
    /// Its place in the commit-order chain (none when it was refused before it was sent).
    link: Option<Link>,
    /// The stream's last sequence its first message names, when it is conditional.
    condition: Option<u64>,
    /// The event its first message names as its predecessor.
    first_after: After,
    per_message: MessagePublisher,
    disabled: Arc<AtomicBool>,
    ids: Arc<BatchIds>,
    commit_lsn: Lsn,
    part: u32,
    /// The id it was last published under.
    id: String,
    members: Vec<(Arc<OutboundMessage>, Reply)>,
}

impl Settling {
    /// Hands each member its outcome from the commit's ack, publishing the batch again whole
    /// while it is not committed.
    async fn settle(self, outcome: CommitOutcome) {
        let since = Instant::now();
        match judge(&self.id, outcome, since) {
            Verdict::Again(error) => self.republish_whole(error, since).await,
            verdict => self.conclude(verdict).await,
        }
    }

    /// Publishes the batch again under a new id, with backoff, until its outcome is known;
    /// `since`: when it was first found not committed.
    async fn republish_whole(mut self, mut error: PublishError, since: Instant) {
        let mut delay = REPUBLISH_FIRST_DELAY;
        loop {
            if self.members.iter().all(|(_, reply)| reply.is_closed()) {
                // The session that waited for it ended; its transaction is read again.
                return;
            }
            tracing::warn!(
                batch = %self.id,
                error = %error,
                retry_in = ?delay,
                "atomic batch not committed or its outcome unknown; publishing the whole transaction again as a new batch"
            );
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(REPUBLISH_MAX_DELAY);
            self.id = self.ids.mint(self.commit_lsn, self.part);
            let outcome = self.publish_whole().await;
            match judge(&self.id, outcome, since) {
                Verdict::Again(again) => error = again,
                verdict => return self.conclude(verdict).await,
            }
        }
    }

    /// Sends every member under the current id, the last with the commit header, on the path
    /// the publisher takes now.
    async fn publish_whole(&self) -> CommitOutcome {
        let lean = self
            .per_message
            .lean_path(self.per_message.ack_timeout)
            .await;
        let count = self.members.len();
        for (i, (msg, _)) in self.members.iter().enumerate().take(count - 1) {
            let condition = self.condition.filter(|_| i == 0);
            if let Err(e) = send_member(
                &self.per_message,
                lean.as_deref(),
                msg,
                &self.id,
                i + 1,
                condition,
            )
            .await
            {
                return CommitOutcome::Failed(e);
            }
        }
        let (last, _) = &self.members[count - 1];
        match send_commit(&self.per_message, lean.as_deref(), last, &self.id, count).await {
            Ok(answer) => answer.await,
            Err(e) => CommitOutcome::Failed(e),
        }
    }

    async fn conclude(self, verdict: Verdict) {
        let Self {
            per_message,
            disabled,
            id,
            members,
            mut link,
            first_after,
            ..
        } = self;
        let mut answered = |stored: Option<(u64, bool)>| {
            if let Some(link) = link.as_mut() {
                link.answered(stored);
            }
        };
        match verdict {
            Verdict::Committed { seq, size } => {
                answered(Some((seq, false)));
                let stored = size.unwrap_or(members.len() as u64);
                let first = seq.saturating_sub(stored.saturating_sub(1));
                for (i, (_, reply)) in members.into_iter().enumerate() {
                    let _ = reply.send(Ok(PubReceipt {
                        stream_seq: first + i as u64,
                        duplicate: false,
                    }));
                }
            }
            Verdict::StoredOneByOne { seq, duplicate } => {
                answered(Some((seq, duplicate)));
                // The last one is acknowledged, the others' outcomes are unknown.
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
                            stream_seq: seq,
                            duplicate,
                        })
                    } else {
                        Err(unknown(
                            "the server stored the batch's messages one by one: re-sending it alone",
                        ))
                    };
                    let _ = reply.send(outcome);
                }
            }
            Verdict::StoredBefore | Verdict::NoBatches => {
                if matches!(verdict, Verdict::NoBatches) && !disabled.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(batch = %id, "JetStream refuses atomic batches here; publishing each message on its own from now on");
                } else {
                    tracing::debug!(batch = %id, "batch refused whole, its ids stored before; publishing its messages one by one");
                }
                one_by_one(&per_message, members, first_after).await;
                answered(None);
            }
            Verdict::Refused(error) | Verdict::Again(error) => {
                answered(None);
                for (_, reply) in members {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Publishes the messages of a batch of which nothing was stored each on its own, in order,
/// each naming the one before it (the first, the batch's predecessor), where the stream's
/// deduplication answers for those it already holds (all of them after 10201: the batch that
/// stored them was atomic too). The batch is still in flight in the chain until the last is
/// answered. Where every condition names a sequence, they are answered as failed instead, and
/// the pipeline re-sends them in order through the chain.
async fn one_by_one(
    per_message: &MessagePublisher,
    members: Vec<(Arc<OutboundMessage>, Reply)>,
    first_after: After,
) {
    if per_message.by_sequence {
        for (_, reply) in members {
            let _ = reply.send(Err(unknown(
                "the batch was refused whole: its messages are re-sent one by one in order",
            )));
        }
        return;
    }
    let mut after = first_after;
    for (msg, reply) in members {
        let outcome = match per_message
            .send_now(&msg, Condition::event(after.as_deref()))
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        after = Some(Arc::from(msg.event_id.as_str()));
        let _ = reply.send(outcome);
    }
}

/// Whether a server of version `version` (INFO) takes `Nats-Msg-Id` inside atomic batches:
/// 2.12.1 or later.
pub(crate) fn supports_atomic_batches(version: &str) -> bool {
    crate::native::version_triple(version) >= (2, 12, 1)
}

#[cfg(test)]
mod tests;
