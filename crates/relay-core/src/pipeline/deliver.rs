//! Delivery in commit order: the window of messages sent and not yet acknowledged, each
//! publish attempt's outcome, and the re-sends after a fault.
//!
//! Commit order must hold in the stream under every broker fault, with up to `max_in_flight`
//! messages outstanding. Two rules give it:
//! - **A chain.** Each message is sent with the event id of the nearest earlier message not yet
//!   known stored (`after`, see [`Publisher::send`]); the broker stores it only if the stream's
//!   last message is that one. So a message is never stored while an earlier one that is not
//!   yet stored is missing, whatever the broker lost (a leader change, a restart, a full
//!   stream that freed room between two messages). A message sent when everything before it is
//!   acknowledged needs no condition.
//! - **Stop, settle, re-send in order.** On any failure that may be retried (unknown outcome,
//!   no responders within the grace, a full stream, a refused turn), nothing new is sent; the
//!   attempts still out are awaited; then, after a backoff, the first unacknowledged message is
//!   re-sent alone (everything before it is stored, so it needs no condition), and once it is
//!   stored the rest follow in order, chained again. A broker outage makes the relay wait,
//!   never skip, and the re-sends cost one message per round until the broker answers.
//!
//! The one exception to "retry while unknown" is a message the server answers by closing the
//! connection (`PublishError::closed_by_server`, told apart from an outage by the server's
//! `-ERR`): after `Publisher::max_server_closes` such attempts in a row for the same message,
//! the message is the cause and it is refused for good. Any other outcome in between starts
//! the count again, so an outage in the middle never adds up to a refusal.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::PipelineStats;
use crate::frontier::EventTicket;
use crate::message::OutboundMessage;
use crate::stage::{PubReceipt, PublishError, PublishErrorKind};

/// Retry settings of the window.
#[derive(Debug, Clone, Copy)]
pub(super) struct RetryPolicy {
    pub(super) initial: Duration,
    pub(super) max: Duration,
    pub(super) no_stream_grace: Duration,
}

/// One publish attempt's outcome, with the window position of its message.
pub(super) type Attempt = (u64, Result<PubReceipt, PublishError>);

/// Awaits one attempt (`sent`: handed to the connection, or not).
pub(super) async fn attempt<A>(seq: u64, sent: Result<A, PublishError>) -> Attempt
where
    A: std::future::Future<Output = Result<PubReceipt, PublishError>>,
{
    match sent {
        Ok(ack) => (seq, ack.await),
        Err(e) => (seq, Err(e)),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// An attempt is out.
    Sent,
    /// Stored (or settled otherwise: refused for good, or replaced by a dead letter).
    Settled,
    /// Its last attempt failed; to be re-sent in order.
    Failed,
}

#[derive(Debug)]
struct Entry {
    msg: Arc<OutboundMessage>,
    ticket: EventTicket,
    /// See [`super::positions::Positions::launched`].
    mark: u64,
    state: State,
    /// Attempts in a row that ended with the server closing the connection over it.
    closes: u32,
}

/// What one attempt's outcome means for the loop.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Stored: its ticket, receipt, message and mark.
    Stored(EventTicket, PubReceipt, Arc<OutboundMessage>, u64),
    /// Refused for good: its ticket, message, error and mark.
    Refused(EventTicket, Arc<OutboundMessage>, PublishError, u64),
    /// Failed and will be re-sent in order; nothing for the loop to do.
    Again,
}

/// The messages sent and not yet behind every earlier one's ack, in commit order.
#[derive(Debug)]
pub(super) struct Window {
    entries: VecDeque<Entry>,
    /// Window position of `entries[0]`.
    front: u64,
    policy: RetryPolicy,
    /// A failure was seen: nothing new is sent until the failed messages are re-sent.
    halted: bool,
    /// The first failed message was re-sent alone (its position): the rest wait for its ack.
    probe: Option<u64>,
    /// The probe was stored: the other failed messages go now, in order.
    burst_due: bool,
    /// When the next re-send round starts (set once nothing is out).
    resend_at: Option<Instant>,
    delay: Duration,
    /// Since when publishes have found no stream (cleared by any ack).
    no_stream_since: Option<Instant>,
    /// The error of the round's first failure, for its one log line.
    first_error: Option<PublishError>,
    /// `PipelineStats::stream_full` is set (written only when it changes: acks are per event).
    full: bool,
}

impl Window {
    pub(super) fn new(policy: RetryPolicy) -> Self {
        Self {
            entries: VecDeque::new(),
            front: 0,
            policy,
            halted: false,
            probe: None,
            burst_due: false,
            resend_at: None,
            delay: policy.initial,
            no_stream_since: None,
            first_error: None,
            full: false,
        }
    }

    /// Messages in the window (sent, and not yet behind every earlier one's ack).
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether new messages may be sent: no fault is being recovered from.
    pub(super) fn open(&self) -> bool {
        !self.halted
    }

    /// Whether failed messages wait for a re-send.
    pub(super) fn has_failed(&self) -> bool {
        self.halted
    }

    /// The condition for the next message sent: the event id of the nearest earlier message not
    /// yet settled, `None` when all are (see [`crate::stage::Publisher::send`]).
    pub(super) fn after(&self) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.state != State::Settled)
            .map(|e| e.msg.event_id.as_str())
    }

    /// Adds a message just sent; returns its position.
    pub(super) fn push(
        &mut self,
        msg: Arc<OutboundMessage>,
        ticket: EventTicket,
        mark: u64,
    ) -> u64 {
        let seq = self.front + self.entries.len() as u64;
        self.entries.push_back(Entry {
            msg,
            ticket,
            mark,
            state: State::Sent,
            closes: 0,
        });
        seq
    }

    fn entry(&mut self, seq: u64) -> Option<&mut Entry> {
        let index = seq.checked_sub(self.front)?;
        self.entries.get_mut(usize::try_from(index).ok()?)
    }

    /// Takes one attempt's outcome.
    /// `max_server_closes` is asked only on a failure (see [`crate::stage::Publisher::max_server_closes`]).
    pub(super) fn on_attempt(
        &mut self,
        (seq, result): Attempt,
        max_server_closes: impl FnOnce() -> u32,
        stats: &PipelineStats,
    ) -> Outcome {
        let probe = self.probe == Some(seq);
        let now = Instant::now();
        let policy = self.policy;
        let no_stream_since = &mut self.no_stream_since;
        let index = seq
            .checked_sub(self.front)
            .and_then(|i| usize::try_from(i).ok());
        let Some(entry) = index.and_then(|i| self.entries.get_mut(i)) else {
            return Outcome::Again;
        };
        let error = match result {
            Ok(receipt) => {
                entry.state = State::Settled;
                entry.closes = 0;
                stats.observe_ack(&entry.msg, &receipt);
                *no_stream_since = None;
                let stored = Outcome::Stored(entry.ticket, receipt, entry.msg.clone(), entry.mark);
                if probe {
                    self.probe = None;
                    self.burst_due = true;
                    self.delay = policy.initial;
                }
                if std::mem::take(&mut self.full) {
                    stats.stream_full.store(0, Ordering::Relaxed);
                }
                self.pop_settled();
                return stored;
            }
            Err(error) => error,
        };
        stats.count_publish_error(error.kind);
        entry.closes = if error.closed_by_server {
            entry.closes + 1
        } else {
            0
        };
        let refused = if error.closed_by_server && entry.closes >= max_server_closes().max(1) {
            Some(refused_after_closes(entry.closes, &error))
        } else {
            match error.kind {
                PublishErrorKind::Unknown
                | PublishErrorKind::StreamFull
                | PublishErrorKind::OutOfTurn => None,
                PublishErrorKind::NoStream => {
                    let since = *no_stream_since.get_or_insert(now);
                    (now.duration_since(since) >= policy.no_stream_grace).then(|| error.clone())
                }
                PublishErrorKind::Rejected | PublishErrorKind::Collision => Some(error.clone()),
            }
        };
        if let Some(error) = refused {
            // Settled for the window; the loop stops on it (or dead-letters a collision).
            entry.state = State::Settled;
            let refused = Outcome::Refused(entry.ticket, entry.msg.clone(), error, entry.mark);
            self.pop_settled();
            return refused;
        }
        if error.kind == PublishErrorKind::StreamFull && !std::mem::replace(&mut self.full, true) {
            stats.stream_full.store(1, Ordering::Relaxed);
        }
        entry.state = State::Failed;
        if probe {
            self.probe = None;
        }
        self.halted = true;
        self.first_error.get_or_insert(error);
        Outcome::Again
    }

    /// Drops the settled messages at the front (their acks can no longer change a condition).
    fn pop_settled(&mut self) {
        while self
            .entries
            .front()
            .is_some_and(|e| e.state == State::Settled)
        {
            self.entries.pop_front();
            self.front += 1;
        }
    }

    /// Called with the number of attempts out: once a halted window has none, the next re-send
    /// round is timed (backoff from `retry_initial`, doubling to `retry_max`).
    pub(super) fn settle(&mut self, attempts_out: usize) {
        if self.halted && attempts_out == 0 && self.probe.is_none() && self.resend_at.is_none() {
            let mut at = Instant::now() + self.delay;
            // While no stream answers, the round that decides is the one at the end of the
            // grace: the relay stops when the grace has passed, not a backoff later.
            if let Some(since) = self.no_stream_since {
                at = at.min((since + self.policy.no_stream_grace).max(Instant::now()));
            }
            self.resend_at = Some(at);
        }
    }

    /// When the next re-send round is due.
    pub(super) fn resend_at(&self) -> Option<Instant> {
        self.resend_at
    }

    /// The round is due: the first failed message, to be re-sent alone with no condition
    /// (everything before it is stored), with its position. Logs the round once.
    pub(super) fn start_round(
        &mut self,
        stats: &PipelineStats,
    ) -> Option<(u64, Arc<OutboundMessage>)> {
        self.resend_at = None;
        let index = self.entries.iter().position(|e| e.state == State::Failed)?;
        let seq = self.front + index as u64;
        let failed = self
            .entries
            .iter()
            .filter(|e| e.state == State::Failed)
            .count();
        let entry = &mut self.entries[index];
        entry.state = State::Sent;
        let error = self.first_error.take();
        let (kind, error) = error.map_or(("unknown", String::new()), |e| {
            (kind_name(e.kind), e.message)
        });
        tracing::warn!(
            event_id = %entry.msg.event_id,
            subject = %entry.msg.subject,
            error = %error,
            failed,
            retry_in = ?self.delay,
            "publish failed ({kind}); re-publishing with the same Nats-Msg-Id in commit order, from the first event not stored"
        );
        stats.publish_retries.fetch_add(1, Ordering::Relaxed);
        self.delay = (self.delay * 2).min(self.policy.max);
        self.probe = Some(seq);
        Some((seq, entry.msg.clone()))
    }

    /// After the probe was stored: the other failed messages, in commit order, each to be
    /// re-sent with the condition [`Self::after_resend`] gives. Opens the window again.
    pub(super) fn take_burst(&mut self, stats: &PipelineStats) -> Vec<u64> {
        if !std::mem::take(&mut self.burst_due) || !self.halted {
            return Vec::new();
        }
        self.halted = false;
        let front = self.front;
        let seqs: Vec<u64> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.state == State::Failed)
            .map(|(i, _)| front + i as u64)
            .collect();
        stats
            .publish_retries
            .fetch_add(seqs.len() as u64, Ordering::Relaxed);
        seqs
    }

    /// The message at `seq`, marked sent again, and the condition of its re-send: the nearest
    /// earlier message not yet settled.
    pub(super) fn resend_args(&mut self, seq: u64) -> Option<(Arc<OutboundMessage>, Option<&str>)> {
        let index = usize::try_from(seq.checked_sub(self.front)?).ok()?;
        let entry = self.entry(seq)?;
        entry.state = State::Sent;
        let msg = entry.msg.clone();
        let after = self
            .entries
            .range(..index)
            .rev()
            .find(|e| e.state != State::Settled);
        Some((msg, after.map(|e| e.msg.event_id.as_str())))
    }
}

fn kind_name(kind: PublishErrorKind) -> &'static str {
    match kind {
        PublishErrorKind::Unknown => "outcome unknown",
        PublishErrorKind::NoStream => "no stream answered",
        PublishErrorKind::StreamFull => "stream full",
        PublishErrorKind::OutOfTurn => "out of turn",
        PublishErrorKind::Rejected => "rejected",
        PublishErrorKind::Collision => "collision",
    }
}

/// The fatal error for a message the server closed the connection on `closes` times in a row.
fn refused_after_closes(closes: u32, last: &PublishError) -> PublishError {
    PublishError::new(
        PublishErrorKind::Rejected,
        format!(
            "NATS closed the connection {closes} times in a row right after this message was sent ({last}): the server refuses it, so re-sending cannot help. Check the server's limits (max_control_line, max_payload, account limits) against [nats] max_control_line"
        ),
    )
}

#[cfg(test)]
mod tests;
