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

use relay_core::stage::{PublishError, PublishErrorKind};
use tokio::sync::{mpsc, oneshot};

use super::Shared;
use crate::publisher::chain::{Link, NoBase};
use crate::publisher::framing::Handed;
use crate::publisher::message::Condition;
use crate::publisher::path::Path;

mod reader;

use reader::{Member, Reader, ToReader};

/// 10205: the stream does not allow fast batches (`allow_batched`).
const FAST_BATCH_DISABLED: u64 = 10205;
/// The most messages the server may let pass between two flow acks (it starts lower when other
/// fast publishers share the stream, and never goes above this).
const MAX_FLOW: usize = 500;
/// How long an open batch waits after a transaction for the next one before it is committed:
/// the most a multi-row transaction's acks wait for it (1-row transactions go on their own at
/// once).
pub(super) const LINGER: Duration = Duration::from_millis(1);

/// The most messages between two flow acks the relay asks for with `max_in_flight` messages
/// outstanding at most: a quarter of them, so acks come long before the window is full.
pub(crate) fn flow(max_in_flight: usize) -> usize {
    (max_in_flight / 4).clamp(1, MAX_FLOW)
}

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
    /// The connection the batch's messages and commit go on, the one the messages published
    /// on their own between batches go on (one connection keeps commit order).
    path: Path,
}

/// What the fast-batch mode keeps between commands.
pub(crate) struct Fast {
    /// Messages between two flow acks.
    flow: usize,
    /// A transaction's first message, held until a second one makes a batch worth starting.
    held: Option<Handed>,
    open: Option<OpenBatch>,
}

impl Fast {
    /// Fast batches with `flow` messages between flow acks.
    pub(crate) fn new(flow: usize) -> Self {
        Self {
            flow,
            held: None,
            open: None,
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Adds a message of the open transaction: a transaction's first message is held until a
    /// second one comes, which starts a batch with it.
    pub(super) async fn add(&mut self, shared: &Shared, handed: Handed) -> Option<Handed> {
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
                return None;
            };
            match self.start(shared, first).await {
                Ok(open) => self.open = Some(open),
                Err(alone) => {
                    // The batch ended at its first message (refused, a duplicate, no answer,
                    // no subscription): this one waits for the next.
                    self.held = Some(handed);
                    return alone;
                }
            }
        }
        if let Some(open) = self.open.as_mut() {
            send_member(shared, open, handed, 1).await;
        }
        None
    }

    /// Starts a batch with `first` and waits for the server's first answer, as ADR-50 asks (it
    /// says whether the server takes the batch, and the flow to start at). An error when the
    /// batch ended there: its reader then settles `first`, or, when the batch could not even
    /// subscribe to its replies, `first` is returned to go on its own.
    async fn start(&self, shared: &Shared, first: Handed) -> Result<OpenBatch, Option<Handed>> {
        let per_message = &shared.per_message;
        let ack_timeout = per_message.ack_timeout;
        let path = per_message.path(ack_timeout).await;
        let (inbox, answers) = match path.batch_replies().await {
            Ok(subscribed) => subscribed,
            Err(e) => {
                tracing::debug!(error = %e, "cannot subscribe to a fast batch's replies; publishing on its own");
                return Err(Some(first));
            }
        };
        // The batch takes its place in the commit order as its first message goes.
        let link = match shared.chain.open_batch(first.1.is_some()).await {
            Ok(link) => link,
            Err(NoBase) => {
                answers.close().await;
                let _ = first.2.send(Err(PublishError::new(
                    PublishErrorKind::OutOfTurn,
                    "the event before this fast batch is not known stored and the stream's last sequence is unknown: re-sent in order".to_owned(),
                )));
                return Err(None);
            }
        };
        let (members, receiver) = mpsc::unbounded_channel();
        let (started, is_started) = oneshot::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let reader = Reader::new(
            per_message.stream.clone(),
            shared.disabled.clone(),
            ended.clone(),
            ack_timeout,
            started,
        );
        tokio::spawn(reader.run(answers, receiver));
        let mut open = OpenBatch {
            base: format!("{inbox}.{}.fail", self.flow),
            next: 1,
            last_subject: first.0.subject.clone(),
            members,
            condition: link.base,
            link: Some(link),
            ended,
            path,
        };
        send_member(shared, &mut open, first, 0).await;
        match tokio::time::timeout(ack_timeout, is_started).await {
            Ok(Ok(true)) => Ok(open),
            _ => Err(None),
        }
    }

    /// Commits the open batch (end-of-batch: the server stores nothing more and answers with
    /// the batch's PubAck); the held message is returned, to go on its own after it.
    pub(super) async fn finish(&mut self) -> Option<Handed> {
        if let Some(open) = self.open.take()
            && !open.ended.load(Ordering::Relaxed)
        {
            let reply = format!("{}.{}.3.$FI", open.base, open.next);
            if let Err(e) = open.path.publish_empty(&open.last_subject, &reply).await {
                // The reader sees no answer and the outstanding messages are re-sent.
                tracing::debug!(error = %e, "cannot send a fast batch's commit");
            }
        }
        self.held.take()
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
    shared: &Shared,
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
    let extra: &[(&str, &str)] = match &condition {
        Some((name, value)) => &[(name, value.as_ref())],
        None => &[],
    };
    let stream = &shared.per_message.stream;
    if let Err(e) = open.path.publish_to(stream, &msg, &reply_to, extra).await {
        // No answer will cover it: the reader's timeout makes its outcome unknown.
        tracing::debug!(error = %e, "cannot publish a fast batch message");
    }
}

#[cfg(test)]
mod tests;
