//! `[nats] publish_mode = "fast-batch"`: messages go out as JetStream fast (flow-controlled,
//! non-atomic) batches (ADR-50 "Fast-ingest Batch Publishing", nats-server 2.14+, a stream with
//! `allow_batched`; see `docs/message-format.md`, "Batch publishing").
//!
//! A fast batch carries its control state in each message's reply subject,
//! `<inbox>.<flow>.fail.<batch sequence>.<operation>.$FI` (the inbox's last token is the batch
//! id), not in headers: the message itself is sent exactly as in `per-message` mode, with its
//! `Nats-Msg-Id`. The server answers on that subject with a flow ack every `msgs` messages
//! (`{"type":"ack","seq":S}`: in gap mode `fail`, every message up to batch sequence `S` is
//! stored or was a duplicate the stream's deduplication dropped) and with a PubAck carrying the
//! number of messages the batch stored in order when it ends. So one answer acknowledges many
//! messages, instead of one PubAck each.
//!
//! One task frames the batches, in the order the pipeline hands messages over; a task per batch
//! reads its answers and hands each message its outcome. A message counts as acknowledged only
//! when a flow ack or the final PubAck covers it. Messages a batch did not store (it ended early
//! on an error or a gap), and those whose answer did not come within `ack_timeout`, are answered
//! as failed, and the pipeline re-sends them in commit order (deduplicated by `Nats-Msg-Id`).
//!
//! Commit order: a fast batch stores its messages in order up to the first it cannot store, and
//! nothing after it, so only its first message needs a condition. When that message follows an
//! unsettled event it carries `Nats-Expected-Last-Sequence`, the stream sequence the commit-order
//! chain (`chain`) predicts for that event; a batch refused on it (10071) stores nothing and its
//! events are re-sent in order. Its other messages go without a condition (a refused
//! `Nats-Expected-Last-Msg-Id` fails a replicated stream of 2.14+, where fast batches are not
//! used). Messages on their own (1-row transactions, dead letters, re-sends) keep their
//! event-id condition and are counted in the chain.
//!
//! A batch starts with a transaction's second message (a 1-row transaction is published on its
//! own) and stays open across transactions while the pipeline keeps handing messages over; it
//! is committed (end-of-batch, nothing stored) when a transaction ends and no other one begins
//! within [`LINGER`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::PubReceipt;
use tokio::sync::{mpsc, oneshot};

use super::MessagePublisher;
use super::chain::{Chain, Link, NoBase};
use super::framing::{
    After, BatchAnswer, Command, Framer, FramingMode, Reply, batchable, reply_when_acked, unknown,
};
use super::message::Condition;
use crate::wire::LeanConnection;
use relay_core::stage::{PublishError, PublishErrorKind};

/// The oldest nats-server with fast batches.
const MIN_SERVER: (u64, u64, u64) = (2, 14, 0);
/// 10205: the stream does not allow fast batches (`allow_batched`).
const FAST_BATCH_DISABLED: u64 = 10205;
/// The most messages the server may let pass between two flow acks (it starts lower when other
/// fast publishers share the stream, and never goes above this).
const MAX_FLOW: usize = 500;
/// How long an open batch waits after a transaction for the next one before it is committed:
/// the most a multi-row transaction's acks wait for it (1-row transactions go on their own at
/// once).
const LINGER: Duration = Duration::from_millis(1);

/// The most messages between two flow acks the relay asks for with `max_in_flight` messages
/// outstanding at most: a quarter of them, so acks come long before the window is full.
pub(crate) fn flow(max_in_flight: usize) -> usize {
    (max_in_flight / 4).clamp(1, MAX_FLOW)
}

/// Starts the framing task over `per_message`, a publisher that sends each message on its own, with
/// `flow` messages between flow acks, and returns the handle the publisher keeps.
pub(crate) fn start(per_message: MessagePublisher, flow: usize, ack_timeout: Duration) -> Framer {
    let (framer, receiver) = Framer::new(FramingMode::FastBatch);
    let chain = Arc::new(Chain::default());
    let worker = Worker {
        chain: chain.clone(),
        per_message,
        flow,
        ack_timeout,
        current: None,
        held: None,
        open: None,
        disabled: Arc::new(AtomicBool::new(false)),
    };
    tokio::spawn(worker.run(receiver));
    framer.with_chain(chain)
}

/// Whether a server of version `version` (INFO) has fast batches: 2.14.0 or later.
pub(crate) fn supports_fast_batches(version: &str) -> bool {
    crate::native::version_triple(version) >= MIN_SERVER
}

/// A message of a batch, by its batch sequence.
struct Member {
    seq: u64,
    reply: Reply,
}

/// What the framing task tells a batch's reader, in order: each member before it is sent, then
/// the batch's place in the chain once no more members come.
enum ToReader {
    Member(Member),
    Closed(Link),
}

/// A message handed to the framing task: the message, its condition and where its outcome goes.
type Handed = (Arc<OutboundMessage>, After, Reply);

/// A fast batch being published.
struct OpenBatch {
    /// `<inbox>.<flow>.fail`: every reply subject of the batch starts so.
    base: String,
    /// Batch sequence of the next message.
    next: u64,
    /// Subject of the newest message: the end-of-batch message goes there (a stream subject).
    last_subject: String,
    /// To the batch's reader, before each message is sent.
    members: mpsc::UnboundedSender<ToReader>,
    /// The stream sequence its first message names, when it follows an unsettled event.
    condition: Option<u64>,
    /// Its place in the commit-order chain, handed to the reader when the batch is dropped.
    link: Option<Link>,
    /// Set by the reader once the server ended the batch (or stopped answering).
    ended: Arc<AtomicBool>,
    /// The lean connection the batch's messages and commit go on, as the messages published
    /// on their own between batches do (one connection keeps commit order); async-nats' only
    /// where the server refused the lean connection.
    lean: Option<Arc<LeanConnection>>,
}

struct Worker {
    chain: Arc<Chain>,
    per_message: MessagePublisher,
    flow: usize,
    ack_timeout: Duration,
    /// Commit LSN of the open transaction.
    current: Option<Lsn>,
    /// A transaction's first message, held until a second one makes a batch worth starting.
    held: Option<Handed>,
    open: Option<OpenBatch>,
    /// Set once the server showed it cannot take fast batches: everything goes on its own.
    disabled: Arc<AtomicBool>,
}

impl Worker {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut next = None;
        loop {
            let command = match next.take() {
                Some(command) => command,
                None => match commands.recv().await {
                    Some(command) => command,
                    None => break,
                },
            };
            match command {
                Command::Begin(lsn) => self.current = Some(lsn),
                Command::Send(msg, after, reply) => {
                    if batchable(&msg, self.current, &self.disabled) {
                        self.add((msg, after, reply)).await;
                    } else {
                        // Re-sends, dead letters, non-transactional messages: after what
                        // came before them, on their own.
                        self.finish().await;
                        self.alone((msg, after, reply)).await;
                    }
                }
                // Fast batches are not used where re-sends come this way (a stream where every
                // condition names a sequence); should one come, it goes after what came before.
                Command::Resend(msg, after, reply) => {
                    self.finish().await;
                    self.alone((msg, after, reply)).await;
                }
                // What a fault left held back goes now; the transaction goes on in the next batch.
                Command::Hold => self.finish().await,
                Command::End => {
                    self.current = None;
                    if !commands.is_empty() {
                        // More waiting (catch-up): the batch goes on into the next transaction.
                        continue;
                    }
                    if self.open.is_some() {
                        // In catch-up the next transaction follows within microseconds: a new
                        // batch per transaction would cost a round trip and slow flow acks.
                        if let Ok(Some(command)) =
                            tokio::time::timeout(LINGER, commands.recv()).await
                        {
                            next = Some(command);
                            continue;
                        }
                    }
                    self.finish().await;
                }
            }
        }
    }

    /// Publishes a message on its own, on its condition; its ack goes to its reply.
    async fn alone(&self, (msg, after, reply): Handed) {
        let link = self.chain.alone(false);
        let sent = self
            .per_message
            .send_alone(&msg, Condition::event(after.as_deref()))
            .await;
        reply_when_acked(sent.map(|ack| link.follow(ack)), reply);
    }

    async fn add(&mut self, handed: Handed) {
        if self
            .open
            .as_ref()
            .is_some_and(|open| open.ended.load(Ordering::Relaxed))
        {
            self.open = None;
        }
        if self.open.is_none() {
            let Some(first) = self.held.take() else {
                self.held = Some(handed);
                return;
            };
            self.open = self.start(first).await;
            if self.open.is_none() {
                // The batch ended at its first message (refused, a duplicate, no answer):
                // this one waits for the next.
                self.held = Some(handed);
                return;
            }
        }
        if let Some(open) = self.open.as_mut() {
            send_member(&self.per_message, open, handed, 1).await;
        }
    }

    /// Starts a batch with `first` and waits for the server's first answer, as ADR-50 asks (it
    /// says whether the server takes the batch, and the flow to start at). `None` when the batch
    /// ended there; its reader then settles `first`.
    async fn start(&self, first: Handed) -> Option<OpenBatch> {
        let lean = self.per_message.lean_path(self.ack_timeout).await;
        // On the lean connection, the batch's answers come on its own subscription, made with
        // `CONNECT`: subscribed at the server before any message of the batch is sent.
        let subscribed = match &lean {
            Some(lean) => lean
                .batch_replies()
                .map(|replies| (replies.inbox.clone(), Answers::Lean(replies)))
                .map_err(|e| e.to_string()),
            None => {
                let client = self.per_message.client();
                let inbox = client.new_inbox();
                client
                    .subscribe(format!("{inbox}.>"))
                    .await
                    .map(|s| (inbox, Answers::Nats(s)))
                    .map_err(|e| e.to_string())
            }
        };
        let (inbox, answers) = match subscribed {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "cannot subscribe to a fast batch's replies; publishing on its own");
                self.alone(first).await;
                return None;
            }
        };
        // The batch takes its place in the commit order as its first message goes.
        let link = match self.chain.open_batch(first.1.is_some()).await {
            Ok(link) => link,
            Err(NoBase) => {
                answers.close().await;
                let _ = first.2.send(Err(PublishError::new(
                    PublishErrorKind::OutOfTurn,
                    "the event before this fast batch is not known stored and the stream's last sequence is unknown: re-sent in order".to_owned(),
                )));
                return None;
            }
        };
        let (members, receiver) = mpsc::unbounded_channel();
        let (started, is_started) = oneshot::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let reader = Reader {
            stream: self.per_message.stream.clone(),
            disabled: self.disabled.clone(),
            ended: ended.clone(),
            ack_timeout: self.ack_timeout,
            started: Some(started),
            pending: std::collections::VecDeque::new(),
            flow_acks: 0,
            failed: 0,
            refusal: None,
            last: None,
        };
        tokio::spawn(reader.run(answers, receiver));
        let mut open = OpenBatch {
            base: format!("{inbox}.{}.fail", self.flow),
            next: 1,
            last_subject: first.0.subject.clone(),
            members,
            condition: link.base,
            link: Some(link),
            ended,
            lean,
        };
        send_member(&self.per_message, &mut open, first, 0).await;
        match tokio::time::timeout(self.ack_timeout, is_started).await {
            Ok(Ok(true)) => Some(open),
            _ => None,
        }
    }

    /// Sends the held message on its own and commits the open batch (end-of-batch: the server
    /// stores nothing more and answers with the batch's PubAck).
    async fn finish(&mut self) {
        if let Some(open) = self.open.take()
            && !open.ended.load(Ordering::Relaxed)
        {
            let reply = format!("{}.{}.3.$FI", open.base, open.next);
            let sent = match &open.lean {
                Some(lean) => lean
                    .publish_empty(&open.last_subject, &reply)
                    .map_err(|e| e.to_string()),
                None => self
                    .per_message
                    .client()
                    .publish_with_reply(open.last_subject.clone(), reply, bytes::Bytes::new())
                    .await
                    .map_err(|e| e.to_string()),
            };
            if let Err(e) = sent {
                // The reader sees no answer and the outstanding messages are re-sent.
                tracing::debug!(error = %e, "cannot send a fast batch's commit");
            }
        }
        if let Some(held) = self.held.take() {
            self.alone(held).await;
        }
    }
}

/// Where a batch's answers come: the lean connection's batch subscription, or an async-nats
/// subscription where the batch goes through async-nats.
enum Answers {
    Lean(crate::wire::BatchReplies),
    Nats(async_nats::Subscriber),
}

impl Answers {
    async fn next(&mut self) -> Option<bytes::Bytes> {
        match self {
            Self::Lean(replies) => replies.next().await,
            Self::Nats(subscriber) => subscriber.next().await.map(|m| m.payload),
        }
    }

    async fn close(self) {
        if let Self::Nats(mut subscriber) = self {
            let _ = subscriber.unsubscribe().await;
        }
    }
}

impl Drop for OpenBatch {
    /// No more members come: the batch's count is known, and its reader settles its place in
    /// the chain once the batch's answers are in.
    fn drop(&mut self) {
        if let Some(mut link) = self.link.take() {
            link.close(self.next - 1);
            let _ = self.members.send(ToReader::Closed(link));
        }
    }
}

/// Publishes a message as the next message of `open` with `operation` (0 start, 1 append).
/// Only the first carries a condition (the batch's, by sequence: see the module's text); the
/// pipeline re-sends what the batch did not store, each on its own condition.
async fn send_member(
    per_message: &MessagePublisher,
    open: &mut OpenBatch,
    (msg, _, reply): Handed,
    operation: u8,
) {
    let seq = open.next;
    open.next += 1;
    open.last_subject = msg.subject.clone();
    let reply_to = format!("{}.{seq}.{operation}.$FI", open.base);
    // Registered before it is sent, so no answer can come for a message the reader lacks.
    let _ = open.members.send(ToReader::Member(Member { seq, reply }));
    let condition = open
        .condition
        .filter(|_| seq == 1)
        .map(|last| Condition::AfterSequence(last).header());
    let sent = match &open.lean {
        Some(lean) => {
            let extra: &[(&str, &str)] = match &condition {
                Some((name, value)) => &[(name, value.as_ref())],
                None => &[],
            };
            lean.publish_to(&per_message.stream, &msg, &reply_to, extra)
                .map_err(|e| e.to_string())
        }
        None => {
            let mut headers = per_message.headers(&msg);
            if let Some((name, value)) = &condition {
                headers.insert(*name, value.as_ref());
            }
            per_message
                .client()
                .publish_with_reply_and_headers(
                    msg.subject.clone(),
                    reply_to,
                    headers,
                    msg.payload.clone(),
                )
                .await
                .map_err(|e| e.to_string())
        }
    };
    if let Err(e) = sent {
        // No answer will cover it: the reader's timeout makes its outcome unknown.
        tracing::debug!(error = %e, "cannot publish a fast batch message");
    }
}

/// Reads one batch's answers and settles its members.
struct Reader {
    /// The relay's stream: the batch's PubAck must name it.
    stream: Arc<str>,
    disabled: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
    ack_timeout: Duration,
    /// Told the first answer: whether the batch goes on.
    started: Option<oneshot::Sender<bool>>,
    /// Sent, not yet covered by an answer, in batch order.
    pending: std::collections::VecDeque<Member>,
    /// Flow acks received (for the batch's debug line).
    flow_acks: u64,
    /// Members answered as failed (their outcome unknown, or not stored).
    failed: u64,
    /// Why the batch stored no more: the server's error, for the first member it did not store.
    refusal: Option<PublishError>,
    /// The stream sequence (and duplicate flag) of the last member the batch stored, if any.
    last: Option<(u64, bool)>,
}

impl Reader {
    async fn run(mut self, mut answers: Answers, mut members: mpsc::UnboundedReceiver<ToReader>) {
        let mut deadline = tokio::time::Instant::now() + self.ack_timeout;
        let mut more = true;
        let mut link = None;
        while !self.ended.load(Ordering::Relaxed) {
            tokio::select! {
                member = members.recv(), if more => match member {
                    Some(ToReader::Member(member)) => {
                        if self.pending.is_empty() {
                            deadline = tokio::time::Instant::now() + self.ack_timeout;
                        }
                        self.pending.push_back(member);
                    }
                    Some(ToReader::Closed(closed)) => link = Some(closed),
                    None => more = false,
                },
                answer = answers.next() => {
                    let Some(answer) = answer else { break };
                    deadline = tokio::time::Instant::now() + self.ack_timeout;
                    self.on_answer(&answer).await;
                }
                () = tokio::time::sleep_until(deadline), if !self.pending.is_empty() || self.started.is_some() => {
                    tracing::debug!(outstanding = self.pending.len(), "no answer to a fast batch within ack_timeout; re-sending its outstanding messages");
                    self.end(false);
                    self.refusal = Some(unknown("no flow ack or PubAck came for its fast batch"));
                    self.fail_pending();
                }
                else => break,
            }
        }
        self.end(false);
        answers.close().await;
        // Whatever was handed over after the end (or never answered) fails at once, so the
        // pipeline stops and re-sends it in order; the batch's place in the chain comes last.
        self.fail_pending();
        while let Some(next) = members.recv().await {
            match next {
                ToReader::Member(member) => {
                    self.pending.push_back(member);
                    self.fail_pending();
                }
                ToReader::Closed(closed) => link = Some(closed),
            }
        }
        if let Some(mut link) = link {
            link.settle(self.last, self.failed);
        }
    }

    /// Answers every pending member as failed: the first with why the batch stored no more,
    /// the others as out of turn (they follow one not stored). The pipeline re-sends them.
    fn fail_pending(&mut self) {
        for member in self.pending.drain(..) {
            self.failed += 1;
            let error = self.refusal.take().unwrap_or_else(|| {
                PublishError::new(
                    PublishErrorKind::OutOfTurn,
                    "its fast batch ended before it: re-sent in order".to_owned(),
                )
            });
            let _ = member.reply.send(Err(error));
        }
    }

    fn end(&mut self, going_on: bool) {
        if !going_on {
            self.ended.store(true, Ordering::Relaxed);
        }
        if let Some(started) = self.started.take() {
            let _ = started.send(going_on);
        }
    }

    async fn on_answer(&mut self, payload: &[u8]) {
        let answer: BatchAnswer = match serde_json::from_slice(payload) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "unreadable fast batch answer");
                return;
            }
        };
        match answer.kind.as_deref() {
            Some("ack") => {
                self.flow_acks += 1;
                self.end(true);
                self.acknowledge(answer.seq.unwrap_or(0), None);
            }
            Some(kind) => {
                // `gap` and `err` announce the batch's early end; its PubAck follows.
                let error = answer.error.map(|e| e.description).unwrap_or_default();
                tracing::debug!(kind, seq = answer.seq, error, "fast batch ends early");
            }
            None => self.on_pub_ack(answer).await,
        }
    }

    /// The batch's PubAck: the messages it stored are acknowledged, the rest go on their own.
    async fn on_pub_ack(&mut self, answer: BatchAnswer) {
        self.end(false);
        if let Some(error) = answer.error {
            if error.err_code == FAST_BATCH_DISABLED && !self.disabled.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    error = %error.description,
                    "JetStream refuses fast batches here (the stream lacks allow_batched); publishing each message on its own from now on"
                );
            } else {
                tracing::debug!(code = error.err_code, error = %error.description, "fast batch refused; its messages are re-sent in order");
            }
            self.refusal = Some(refusal(&error));
            self.fail_pending();
            return;
        }
        if answer.stream.as_deref() != Some(&*self.stream) {
            // Another client answered the batch's reply subject first (its flow acks name no
            // stream and cannot be told apart: docs/security.md).
            let named = answer.stream.as_deref().unwrap_or("");
            self.refusal = Some(crate::wire::other_stream(&self.stream, named));
            self.fail_pending();
            return;
        }
        if answer.batch.is_none() {
            // A per_message PubAck: the server stored the first message as an ordinary publish.
            if !self.disabled.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a NATS server answered a fast batch with a per_message PubAck (before 2.14); publishing each message on its own from now on"
                );
            }
        }
        let count = answer.count.unwrap_or(1);
        tracing::debug!(
            stored = count,
            flow_acks = self.flow_acks,
            unstored = self.pending.iter().filter(|m| m.seq > count).count(),
            "fast batch committed"
        );
        let last = (answer.seq.unwrap_or(0), answer.duplicate);
        if count > 0 {
            self.last = Some(last);
        }
        self.acknowledge(count, Some(last));
        if !self.pending.is_empty() {
            self.refusal = Some(unknown(
                "its fast batch ended before it (a gap or an error): re-sent in order",
            ));
        }
        self.fail_pending();
    }

    /// Every pending member up to batch sequence `upto` is stored; `last` is the stream
    /// sequence (and duplicate flag) of member `upto` when the answer names it. Flow acks carry
    /// no stream sequence: those members report 0, which the pipeline's positions skip.
    fn acknowledge(&mut self, upto: u64, last: Option<(u64, bool)>) {
        while self.pending.front().is_some_and(|m| m.seq <= upto) {
            let Some(member) = self.pending.pop_front() else {
                break;
            };
            let (stream_seq, duplicate) = match last {
                Some(last) if member.seq == upto => last,
                _ => (0, false),
            };
            let _ = member.reply.send(Ok(PubReceipt {
                stream_seq,
                duplicate,
            }));
        }
    }
}

/// The failure a refused batch hands its first member: out of turn for a refused condition,
/// an unknown outcome where fast batches are refused (the member then goes on its own), else
/// what the code says.
fn refusal(error: &crate::error_codes::ApiError) -> PublishError {
    let kind = match error.err_code {
        FAST_BATCH_DISABLED => PublishErrorKind::Unknown,
        code => crate::error_codes::kind_for_error_code(code),
    };
    PublishError::new(
        kind,
        format!(
            "fast batch refused: {} ({})",
            error.description, error.err_code
        ),
    )
}

#[cfg(test)]
mod tests;
