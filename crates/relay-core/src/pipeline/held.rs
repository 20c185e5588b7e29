//! The open transaction's events, held back until its Commit is read: a transaction with a row
//! that cannot be routed then publishes nothing of itself, in every publish mode (the batch
//! modes hold a transaction anyway). Bounded by the in-flight window: when a transaction's
//! events, with those still awaiting their acknowledgement, fill `max_in_flight`, its first
//! events go out before the rest is read (waiting longer could wait for ever: a batching
//! publisher answers for a part of a transaction only once it has the part's end).

use std::sync::Arc;

use futures::stream::FuturesUnordered;

use super::Pipeline;
use super::deliver::Window;
use crate::frontier::EventTicket;
use crate::message::OutboundMessage;
use crate::stage::{ChangeSource, CheckpointStore, PublishError, Publisher};

/// Events routed in the open transaction and not yet handed to the publisher.
#[derive(Debug, Default)]
pub(super) struct HeldTransaction {
    events: Vec<(OutboundMessage, EventTicket)>,
    /// Its Commit was read: everything held goes out, then the publisher hears of the end.
    ended: bool,
    /// A part went out before the Commit (more events than the window): said once.
    split: bool,
}

impl HeldTransaction {
    pub(super) fn push(&mut self, routed: (OutboundMessage, EventTicket)) {
        self.events.push(routed);
    }

    /// The Commit was read.
    pub(super) fn end(&mut self) {
        self.ended = true;
    }

    /// Events held, counted against the in-flight window.
    pub(super) fn len(&self) -> usize {
        self.events.len()
    }
}

impl<S: ChangeSource, P: Publisher, C: CheckpointStore> Pipeline<S, P, C> {
    /// Hands the held events to the publisher, in order, when the transaction's Commit was read
    /// or when they and the events awaiting their acknowledgement fill the window (nothing else
    /// could then be read), and then tells the publisher the transaction ended.
    pub(super) async fn release_held<F>(
        &mut self,
        window: &mut Window,
        in_flight: &mut FuturesUnordered<F>,
        max_in_flight: usize,
        attempt: impl Fn(u64, Result<P::Ack, PublishError>) -> F,
    ) {
        // Only while new events may go out, as when they are read: while a fault is recovered
        // from, nothing new is sent (the batching publisher sends what it holds back then).
        let full = window.open()
            && !self.held.events.is_empty()
            && self.held.events.len() + window.len() >= max_in_flight;
        if !(self.held.ended || full) {
            return;
        }
        if full && !self.held.ended && !self.held.split {
            self.held.split = true;
            tracing::debug!(
                max_in_flight,
                held = self.held.events.len(),
                awaiting_ack = window.len(),
                "the window is full inside a transaction: its first events are published before the rest of it is read"
            );
        }
        for routed in std::mem::take(&mut self.held.events) {
            self.launch(window, in_flight, routed, &attempt).await;
        }
        if std::mem::take(&mut self.held.ended) {
            self.held.split = false;
            self.publisher.end_transaction();
        }
    }

    /// Publishes one event now, in commit order after everything launched before it.
    pub(super) async fn launch<F>(
        &mut self,
        window: &mut Window,
        in_flight: &mut FuturesUnordered<F>,
        (msg, ticket): (OutboundMessage, EventTicket),
        attempt: impl Fn(u64, Result<P::Ack, PublishError>) -> F,
    ) {
        let mark = self.positions.launched();
        let msg = Arc::new(msg);
        let sent = self.publisher.send(&msg, window.after()).await;
        let seq = window.push(msg, ticket, mark);
        in_flight.push(attempt(seq, sent));
    }
}
