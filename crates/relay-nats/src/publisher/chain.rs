//! Commit order for batches (`batching`: `atomic`, `fast`) and for every message on a stream where
//! every condition names a sequence (`sequenced`). JetStream refuses `Nats-Expected-Last-Msg-Id`
//! inside an atomic batch (and a refused one fails a replicated stream of 2.14+) but checks
//! `Nats-Expected-Last-Sequence` on a batch's first message (an atomic batch's at the commit):
//! a batch whose first event names an unsettled predecessor is sent on the condition that the
//! stream's last sequence is the one it would have once everything sent before it is stored.
//! An atomic batch stores all of its messages or none, and a fast batch all of them up to the
//! first it could not store, so that sequence is predicted from the counts of what went out;
//! an answer that does not match the prediction (a duplicate, another writer, a fast batch
//! stored in part) forgets it, and the next batch waits until nothing is in flight and starts
//! from the highest sequence any answer named. A condition that no longer holds is refused (10071) with
//! nothing stored, and the pipeline re-sends in order.
//!
//! Messages on their own (and the pipeline's re-sends) keep their `Nats-Expected-Last-Msg-Id`
//! condition and are counted here, so a batch never starts from a sequence that a message still
//! in flight will change. A failed batch or message is missing until the pipeline's re-sends
//! bring it back: until then the last sequence seen is not where a predecessor is, and a batch
//! that would start from it is refused unsent (the pipeline re-sends it too, in order).

use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use relay_core::stage::{PubReceipt, PublishError};
use tokio::sync::Notify;

#[derive(Debug, Default)]
struct State {
    /// The stream's last sequence once everything sent so far is stored; `None` when unknown.
    predicted: Option<u64>,
    /// The highest stream sequence an answer named.
    last_seen: Option<u64>,
    /// Batches and messages sent and not yet answered.
    in_flight: usize,
    /// Messages that failed (or whose outcome is unknown) and that only the pipeline's re-sends
    /// bring back: while any is missing, the last sequence seen says nothing of where a
    /// batch's predecessor is.
    missing: u64,
    /// A batch is open: its count is known only at its commit.
    open: bool,
    /// A message went on its own while the batch was open (and is stored before it).
    interleaved: bool,
}

/// The chain of conditions one atomic-batch publisher keeps (see the module's text).
#[derive(Debug, Default)]
pub(crate) struct Chain {
    state: Mutex<State>,
    idle: Notify,
}

/// A batch's or message's place in the chain: where the stream should end once it is stored.
/// Answered through [`Link::answered`]; dropped unanswered, it counts as failed.
#[derive(Debug)]
pub(crate) struct Link {
    chain: Arc<Chain>,
    /// The stream's last sequence it was sent on (`None`: sent without a condition).
    pub(crate) base: Option<u64>,
    expected_end: Option<u64>,
    /// Its messages (a batch's count is known at its commit).
    messages: u64,
    /// A pipeline's re-send: once stored, one message fewer is missing.
    resend: bool,
    answered: bool,
}

/// A batch whose predecessor is unsettled while nothing tells at which sequence the stream
/// will hold it: refused out of turn without being sent.
#[derive(Debug)]
pub(crate) struct NoBase;

impl Chain {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a batch. `conditional`: its first event names an unsettled predecessor, so it
    /// needs a condition: the predicted sequence, or when none is predicted, the last sequence
    /// seen once nothing is in flight and nothing is missing; [`NoBase`] when something is
    /// missing (the pipeline re-sends it first). Unconditional (everything before it is
    /// stored), it also ends what was missing. The count follows at [`Self::close`].
    pub(crate) async fn open_batch(self: &Arc<Self>, conditional: bool) -> Result<Link, NoBase> {
        loop {
            let idle = self.idle.notified();
            {
                let mut state = self.lock();
                if !conditional {
                    state.missing = 0;
                }
                let settled = state.in_flight == 0;
                let known = state
                    .predicted
                    .or(state.last_seen.filter(|_| settled && state.missing == 0));
                if known.is_some() || !conditional || settled {
                    if conditional && known.is_none() {
                        return Err(NoBase);
                    }
                    state.in_flight += 1;
                    state.open = true;
                    state.interleaved = false;
                    state.predicted = None;
                    return Ok(Link {
                        chain: self.clone(),
                        base: known.filter(|_| conditional),
                        expected_end: known,
                        messages: 1,
                        resend: false,
                        answered: false,
                    });
                }
                tracing::debug!(
                    in_flight = state.in_flight,
                    "atomic batch waits for what is in flight to learn the stream's last sequence"
                );
            }
            idle.await;
        }
    }

    /// The open batch `link` holds `count` messages.
    pub(crate) fn close(&self, link: &mut Link, count: u64) {
        let mut state = self.lock();
        state.open = false;
        link.messages = count;
        link.expected_end = link
            .expected_end
            .filter(|_| !state.interleaved)
            .map(|base| base + count);
        state.predicted = link.expected_end;
    }

    /// A message on its own, conditioned by sequence where it is `conditional` (see
    /// [`Self::open_batch`]; `resend`: the pipeline's re-send of one that failed): on a stream
    /// where every condition names a sequence (`publisher::sequenced`).
    pub(crate) async fn message(
        self: &Arc<Self>,
        conditional: bool,
        resend: bool,
    ) -> Result<Link, NoBase> {
        let mut link = self.open_batch(conditional).await?;
        self.close(&mut link, 1);
        link.resend = resend;
        Ok(link)
    }

    /// A message on its own, conditioned by event id (`resend`: the pipeline's re-send of one
    /// that failed): taken before it is sent, so no batch starts from a sequence it may still
    /// change.
    pub(crate) fn alone(self: &Arc<Self>, resend: bool) -> Link {
        let mut state = self.lock();
        state.in_flight += 1;
        state.interleaved |= state.open;
        // Inside an open batch the message is stored before the batch: the batch's condition
        // fails and is re-sent; nothing here can be predicted until it settles.
        let expected_end = state.predicted.filter(|_| !state.open).map(|last| last + 1);
        state.predicted = expected_end;
        Link {
            chain: self.clone(),
            base: None,
            expected_end,
            messages: 1,
            resend,
            answered: false,
        }
    }
}

impl Link {
    /// The open batch of this link holds `count` messages (see [`Chain::close`]).
    pub(crate) fn close(&mut self, count: u64) {
        let chain = self.chain.clone();
        chain.close(self, count);
    }

    /// The message of this link (from [`Chain::alone`]) was sent: `ack` answers it.
    pub(crate) fn follow(
        mut self,
        ack: BoxFuture<'static, Result<PubReceipt, PublishError>>,
    ) -> BoxFuture<'static, Result<PubReceipt, PublishError>> {
        Box::pin(async move {
            let outcome = ack.await;
            self.answered(outcome.as_ref().ok().map(|r| (r.stream_seq, r.duplicate)));
            outcome
        })
    }

    /// Its answer: the stream sequence of its last message and whether it was a duplicate, or
    /// `None` when it failed or its outcome is unknown.
    pub(crate) fn answered(&mut self, stored: Option<(u64, bool)>) {
        let failed = if stored.is_some() { 0 } else { self.messages };
        self.settle(stored, failed);
    }

    /// Its answer when part of it may be stored (a fast batch stores its messages in order
    /// up to an error or a gap): the stream sequence of the last message stored and whether it
    /// was a duplicate, if any was, and how many of its messages failed (or have an unknown
    /// outcome), which the pipeline's re-sends bring back.
    pub(crate) fn settle(&mut self, last: Option<(u64, bool)>, failed: u64) {
        if self.answered {
            return;
        }
        self.answered = true;
        let mut state = self.chain.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some((seq, duplicate)) = last {
            state.last_seen = Some(state.last_seen.map_or(seq, |last| last.max(seq)));
            if duplicate || self.expected_end != Some(seq) {
                state.predicted = None;
            }
            if self.resend {
                state.missing = state.missing.saturating_sub(1);
            }
        }
        if failed > 0 || last.is_none() {
            state.predicted = None;
            state.missing += failed;
        }
        if state.in_flight == 0 {
            self.chain.idle.notify_waiters();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.answered(None);
    }
}

#[cfg(test)]
mod tests;
