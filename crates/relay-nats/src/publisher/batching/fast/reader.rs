//! A fast batch's reader: one task per batch reads the batch's answers (flow acks, gaps and
//! errors, its PubAck) and hands each member its outcome, in batch order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind};
use tokio::sync::{mpsc, oneshot};

use super::FAST_BATCH_DISABLED;
use crate::publisher::chain::Link;
use crate::publisher::framing::{BatchAnswer, Reply, unknown};
use crate::publisher::path::Answers;

/// A message of a batch, by its batch sequence.
pub(super) struct Member {
    pub(super) seq: u64,
    pub(super) reply: Reply,
}

/// What the framing task tells a batch's reader, in order: each member before it is sent, then
/// the batch's place in the chain once no more members come.
pub(super) enum ToReader {
    Member(Member),
    Closed(Link),
}

/// Reads one batch's answers and settles its members.
pub(super) struct Reader {
    /// The relay's stream: the batch's PubAck must name it.
    stream: Arc<str>,
    disabled: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
    ack_timeout: Duration,
    /// Told the first answer: whether the batch goes on.
    started: Option<oneshot::Sender<bool>>,
    /// Sent, not yet covered by an answer, in batch order.
    pending: VecDeque<Member>,
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
    /// A reader for a batch into `stream` that tells `started` whether the batch goes on after
    /// its first answer, sets `ended` once the server ended it, and `disabled` where the server
    /// takes no fast batches; members without an answer within `ack_timeout` fail.
    pub(super) fn new(
        stream: Arc<str>,
        disabled: Arc<AtomicBool>,
        ended: Arc<AtomicBool>,
        ack_timeout: Duration,
        started: oneshot::Sender<bool>,
    ) -> Self {
        Self {
            stream,
            disabled,
            ended,
            ack_timeout,
            started: Some(started),
            pending: VecDeque::new(),
            flow_acks: 0,
            failed: 0,
            refusal: None,
            last: None,
        }
    }

    pub(super) async fn run(
        mut self,
        mut answers: Answers,
        mut members: mpsc::UnboundedReceiver<ToReader>,
    ) {
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
