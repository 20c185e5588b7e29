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

use std::error::Error as _;
use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::message::PublishMessage;
use futures::future::BoxFuture;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use super::MessagePublisher;
use super::framing::{
    BatchAnswer, Command, Framer, FramingMode, Reply, batchable, reply_when_acked, unknown,
};
use crate::error_codes::kind_for_error_code;
use crate::wire::LeanConnection;

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
/// 10175: a batch message without `Nats-Batch-Sequence`.
const BATCH_MISSING_SEQUENCE: u64 = 10175;
/// 10176: the server holds no complete batch under this id: a gap in its sequence, an id it
/// still holds open for a batch abandoned mid-way, or a batch it timed out.
const BATCH_INCOMPLETE: u64 = 10176;
/// 10179: the batch id is over 64 characters.
const BATCH_INVALID_ID: u64 = 10179;
/// 10199: more messages than the server's `max_batch_size`.
const BATCH_TOO_LARGE: u64 = 10199;
/// 10200: a `Nats-Batch-Commit` value the server does not know.
const BATCH_INVALID_COMMIT: u64 = 10200;
/// 10210: the stream or the server has its most open batches already.
const BATCH_TOO_MANY_OPEN: u64 = 10210;

/// The failpoint between a batch's messages and its commit.
const BEFORE_COMMIT: &str = "atomic_batch_before_commit";

/// First wait before a batch is published again; doubled up to [`REPUBLISH_MAX_DELAY`].
const REPUBLISH_FIRST_DELAY: Duration = Duration::from_millis(100);
const REPUBLISH_MAX_DELAY: Duration = Duration::from_secs(5);
/// How long "no responders" (a leader election) is retried before it counts as no stream, as
/// the pipeline's `no_stream_grace` default.
const NO_STREAM_GRACE: Duration = Duration::from_secs(30);

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
    let limit = MAX_BATCH.min(max_in_flight.max(1));
    let worker = Worker {
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
    framer
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
    held: Option<(Arc<OutboundMessage>, Reply)>,
    /// A publish of this batch could not even be handed to the connection.
    failed: Option<PublishError>,
    permit: OwnedSemaphorePermit,
    /// The lean connection every message of the batch and its commit go on, as the messages
    /// published on their own do; async-nats' where the publisher publishes through it.
    lean: Option<Arc<LeanConnection>>,
}

struct Worker {
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
        reply_when_acked(self.per_message.send_now(&msg).await, reply);
    }

    async fn add(&mut self, msg: Arc<OutboundMessage>, reply: Reply) {
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
            if open.failed.is_none()
                && let Err(e) = send_member(
                    &self.per_message,
                    open.lean.as_deref(),
                    &previous,
                    &open.id,
                    sequence,
                )
                .await
            {
                open.failed = Some(e);
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
        let settling = Settling {
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

/// What the server answered to a batch's commit, from either path.
#[derive(Debug)]
enum CommitOutcome {
    /// A PubAck: the batch's id and size when the server stored it as a batch.
    Stored {
        stream: String,
        /// The JetStream domain of the stream (`None`: none).
        domain: Option<String>,
        seq: u64,
        duplicate: bool,
        batch_id: Option<String>,
        batch_size: Option<u64>,
    },
    /// A JetStream API error with its error code.
    Refused { code: u64, error: PublishError },
    /// No answer (a timeout, a lost connection) or a 503.
    Failed(PublishError),
}

impl CommitOutcome {
    /// The outcome async-nats reports.
    fn from_nats(
        outcome: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
    ) -> Self {
        match outcome {
            Ok(ack) => Self::Stored {
                stream: ack.stream,
                domain: Some(ack.domain).filter(|d| !d.is_empty()),
                seq: ack.sequence,
                duplicate: ack.duplicate,
                batch_id: ack.batch_id,
                batch_size: ack.batch_size,
            },
            Err(error) => {
                let code = error
                    .source()
                    .and_then(|s| s.downcast_ref::<jetstream::Error>())
                    .map(|e| e.error_code().0);
                let error = crate::publisher::classify(error);
                match code {
                    Some(code) => Self::Refused { code, error },
                    None => Self::Failed(error),
                }
            }
        }
    }

    /// The outcome an answer on the lean connection says.
    fn from_lean(outcome: crate::wire::RawOutcome) -> Self {
        let payload = match outcome {
            Ok(payload) => payload,
            Err(error) => return Self::Failed(crate::wire::publish_error(error)),
        };
        let unreadable = |why: &str| {
            Self::Failed(unknown(&format!(
                "the answer to an atomic batch's commit is {why}: {}",
                String::from_utf8_lossy(&payload[..payload.len().min(200)])
            )))
        };
        let Ok(answer) = serde_json::from_slice::<BatchAnswer>(&payload) else {
            return unreadable("not JSON");
        };
        if let Some(error) = answer.error {
            return Self::Refused {
                code: error.err_code,
                error: PublishError::new(
                    kind_for_error_code(error.err_code),
                    format!(
                        "{} (status {}, error code {})",
                        error.description, error.code, error.err_code
                    ),
                ),
            };
        }
        match (answer.stream, answer.seq) {
            (Some(stream), Some(seq)) => Self::Stored {
                stream,
                domain: answer.domain.filter(|d| !d.is_empty()),
                seq,
                duplicate: answer.duplicate,
                batch_id: answer.batch,
                batch_size: answer.count,
            },
            _ => unreadable("not a PubAck"),
        }
    }
}

impl CommitOutcome {
    /// This outcome where `[nats] domain` is `expected`: a batch stored in another domain's
    /// stream is refused (the relay stops before its transaction), as a single PubAck is.
    fn in_domain(self, expected: Option<&str>) -> Self {
        match self {
            Self::Stored {
                ref stream,
                ref domain,
                ..
            } => match crate::domain::check_ack_domain(expected, stream, domain.as_deref()) {
                Ok(()) => self,
                Err(error) => Self::Failed(error),
            },
            other => other,
        }
    }
}

/// The batch headers (ADR-50), as the lean connection writes them; a test holds them to
/// async-nats' names.
const BATCH_ID: &str = "Nats-Batch-Id";
const BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
const BATCH_COMMIT: &str = "Nats-Batch-Commit";

/// The header lines of a batch member, beside the message's own.
fn batch_lines<'a>(id: &'a str, sequence: &'a str, commit: bool) -> Vec<(&'a str, &'a str)> {
    let mut lines = vec![(BATCH_ID, id), (BATCH_SEQUENCE, sequence)];
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
) -> Result<(), PublishError> {
    let sequence = sequence.to_string();
    let lines = batch_lines(id, &sequence, false);
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
    let lines = batch_lines(id, &count, true);
    let domain = per_message.domain.clone();
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
            .in_domain(domain.as_deref())
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
            CommitOutcome::from_nats(ack.await).in_domain(domain.as_deref())
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
    per_message: MessagePublisher,
    disabled: Arc<AtomicBool>,
    ids: Arc<BatchIds>,
    commit_lsn: Lsn,
    part: u32,
    /// The id it was last published under.
    id: String,
    members: Vec<(Arc<OutboundMessage>, Reply)>,
}

/// What a commit's outcome means for the batch.
#[derive(Debug)]
enum Verdict {
    /// Committed: every member is stored, in consecutive sequences ending at `seq`.
    Committed { seq: u64, size: Option<u64> },
    /// A server that ignores batch headers stored each message as it came.
    StoredOneByOne { seq: u64, duplicate: bool },
    /// Refused whole because the stream has one of its ids: stored before.
    StoredBefore,
    /// The stream or server takes no batches (10174, 10177).
    NoBatches,
    /// Not committed, or the outcome is unknown: publish it again as a new batch.
    Again(PublishError),
    /// Refused for good; nothing of it is stored.
    Refused(PublishError),
}

/// What the outcome of the commit of batch `id` means; `since`: when the batch was first
/// found not committed (for the grace of "no responders").
fn judge(id: &str, outcome: CommitOutcome, since: Instant) -> Verdict {
    let (code, error) = match outcome {
        CommitOutcome::Stored {
            seq,
            batch_id,
            batch_size,
            ..
        } if batch_id.as_deref() == Some(id) => {
            return Verdict::Committed {
                seq,
                size: batch_size,
            };
        }
        CommitOutcome::Stored { seq, duplicate, .. } => {
            return Verdict::StoredOneByOne { seq, duplicate };
        }
        CommitOutcome::Refused { code, error } => (Some(code), error),
        CommitOutcome::Failed(error) => (None, error),
    };
    let refused = |fix: &str| {
        Verdict::Refused(PublishError::new(
            PublishErrorKind::Rejected,
            format!(
                "JetStream refused atomic batch {id} ({}): {fix}",
                error.message
            ),
        ))
    };
    match code {
        Some(BATCH_DUPLICATE) => Verdict::StoredBefore,
        Some(BATCH_DISABLED | BATCH_UNSUPPORTED_HEADER) => Verdict::NoBatches,
        Some(BATCH_INCOMPLETE | BATCH_MISSING_SEQUENCE | BATCH_TOO_MANY_OPEN) => {
            Verdict::Again(error)
        }
        Some(BATCH_TOO_LARGE) => refused(
            "the server's jetstream max_batch_size is below the relay's batch size, min(1000, [relay] max_in_flight); set max_in_flight at or below the server's max_batch_size",
        ),
        Some(BATCH_INVALID_ID | BATCH_INVALID_COMMIT) => refused(
            "the server does not take this relay's batch headers; set [nats] publish_mode = \"per-message\" and report the server version",
        ),
        _ => match error.kind {
            PublishErrorKind::Unknown => Verdict::Again(error),
            PublishErrorKind::NoStream if since.elapsed() < NO_STREAM_GRACE => {
                Verdict::Again(error)
            }
            _ => Verdict::Refused(error),
        },
    }
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
            if let Err(e) =
                send_member(&self.per_message, lean.as_deref(), msg, &self.id, i + 1).await
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
            ..
        } = self;
        match verdict {
            Verdict::Committed { seq, size } => {
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
                // Nothing of this batch was stored: each message on its own, in order, where
                // the stream's deduplication answers for those it already holds (all of them
                // after 10201: the batch that stored them was atomic too).
                for (msg, reply) in members {
                    let outcome = match per_message.send_now(&msg).await {
                        Ok(ack) => ack.await,
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(outcome);
                }
            }
            Verdict::Refused(error) | Verdict::Again(error) => {
                for (_, reply) in members {
                    let _ = reply.send(Err(error.clone()));
                }
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
    use relay_core::Lsn;

    use super::*;

    /// With `[nats] domain`, a batch stored in another domain's stream (or one without a
    /// domain) is refused for good, as a single PubAck is; one from the domain commits.
    #[test]
    fn a_commit_from_another_domain_is_refused() {
        let answer = |domain: &str| {
            CommitOutcome::from_lean(Ok(bytes::Bytes::from(format!(
                r#"{{"stream":"OUTBOX"{domain},"seq":7,"batch":"b-1","count":2}}"#
            ))))
        };
        let from_leaf = || answer(r#","domain":"leaf""#);
        let since = Instant::now();
        for outcome in [
            from_leaf().in_domain(None),
            from_leaf().in_domain(Some("leaf")),
            answer("").in_domain(None),
        ] {
            assert!(
                matches!(
                    judge("b-1", outcome, since),
                    Verdict::Committed { seq: 7, .. }
                ),
                "stored in the expected domain"
            );
        }
        for outcome in [
            from_leaf().in_domain(Some("hub")),
            answer("").in_domain(Some("hub")),
        ] {
            match judge("b-1", outcome, since) {
                Verdict::Refused(error) => {
                    assert_eq!(error.kind, PublishErrorKind::Rejected);
                    assert!(error.message.contains("[nats] domain = \"hub\""), "{error}");
                }
                other => panic!("not refused: {other:?}"),
            }
        }
    }

    /// The lean connection's batch header names are async-nats' (and ADR-50's).
    #[test]
    fn batch_header_names_are_the_protocol_names() {
        use async_nats::header::{NATS_BATCH_COMMIT, NATS_BATCH_ID, NATS_BATCH_SEQUENCE};
        assert_eq!(BATCH_ID, NATS_BATCH_ID.to_string());
        assert_eq!(BATCH_SEQUENCE, NATS_BATCH_SEQUENCE.to_string());
        assert_eq!(BATCH_COMMIT, NATS_BATCH_COMMIT.to_string());
    }

    /// An answer on the lean connection reads as the same outcome async-nats reports: a
    /// commit's PubAck with its batch, an API error with its code, and what is not a PubAck.
    #[test]
    fn lean_commit_answers_read_as_outcomes() {
        let stored = CommitOutcome::from_lean(Ok(bytes::Bytes::from_static(
            br#"{"stream":"OUTBOX","seq":12,"batch":"b-1","count":3}"#,
        )));
        assert!(
            matches!(&stored, CommitOutcome::Stored { seq: 12, batch_size: Some(3), batch_id: Some(id), duplicate: false, .. } if id == "b-1"),
            "{stored:?}"
        );
        let since = Instant::now();
        assert!(matches!(
            judge("b-1", stored, since),
            Verdict::Committed {
                seq: 12,
                size: Some(3)
            }
        ));
        for (code, committed_never) in [
            (BATCH_INCOMPLETE, "again"),
            (BATCH_TOO_MANY_OPEN, "again"),
            (BATCH_MISSING_SEQUENCE, "again"),
            (BATCH_DUPLICATE, "before"),
            (BATCH_DISABLED, "none"),
            (BATCH_TOO_LARGE, "refused"),
        ] {
            let answer = format!(
                r#"{{"error":{{"code":400,"err_code":{code},"description":"x"}},"stream":"OUTBOX","seq":0}}"#
            );
            let outcome = CommitOutcome::from_lean(Ok(answer.into()));
            let verdict = judge("b-1", outcome, since);
            let got = match verdict {
                Verdict::Again(_) => "again",
                Verdict::StoredBefore => "before",
                Verdict::NoBatches => "none",
                Verdict::Refused(_) => "refused",
                _ => "other",
            };
            assert_eq!(got, committed_never, "error code {code}");
        }
        for not_an_ack in [&b"nonsense"[..], br#"{"seq":3}"#] {
            let outcome = CommitOutcome::from_lean(Ok(bytes::Bytes::copy_from_slice(not_an_ack)));
            assert!(
                matches!(judge("b-1", outcome, since), Verdict::Again(_)),
                "{not_an_ack:?}: its outcome is unknown, the batch goes again"
            );
        }
        let per_message = CommitOutcome::from_lean(Ok(bytes::Bytes::from_static(
            br#"{"stream":"OUTBOX","seq":4}"#,
        )));
        assert!(matches!(
            judge("b-1", per_message, since),
            Verdict::StoredOneByOne {
                seq: 4,
                duplicate: false
            }
        ));
    }

    /// An id never repeats in a process, differs between two processes' minters (a restarted
    /// or standby relay), names its transaction and part, and fits the server's 64 characters.
    #[test]
    fn batch_ids_never_repeat_and_fit_the_server() {
        let (dead, restarted) = (BatchIds::new(), BatchIds::new());
        assert_ne!(dead.run, restarted.run);
        let lsn = Lsn(0x1_0000_2000);
        let first = dead.mint(lsn, 0);
        assert!(first.starts_with("1-2000-0-"), "{first}");
        assert_ne!(
            dead.mint(lsn, 0),
            first,
            "the same transaction again: a new id"
        );
        assert_ne!(restarted.mint(lsn, 0), first);
        let longest = BatchIds {
            run: 0xFFFF_FFFF_FFFF,
            next: u64::MAX.into(),
        }
        .mint(Lsn(u64::MAX), u32::MAX);
        assert!(
            longest.len() <= 64,
            "{longest}: {} characters",
            longest.len()
        );
    }

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
