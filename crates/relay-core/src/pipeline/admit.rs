//! Admitting one outbox event — a row of an outbox table or a logical decoding message of a
//! configured prefix: route it, check it against the broker's limits and recent ids, and decide
//! between publishing it, skipping it (already in the stream), dead-lettering it and stopping
//! before its transaction. Rows and messages share one path, so a bad envelope is handled
//! exactly like a bad row.

use std::sync::atomic::Ordering;

use pgoutput::{Insert, Message};

use super::{Pipeline, PipelineConfig, PipelineError};
use crate::frontier::{EventTicket, FrontierError};
use crate::message::{OutboundMessage, TxContext};
use crate::route::{MessagePolicy, RouteError, non_transactional_context, non_transactional_end};
use crate::stage::{ChangeSource, CheckpointStore, Publisher};

/// Where an event came from: what dead letters and error reports are built from.
#[derive(Clone, Copy)]
enum Origin<'a> {
    Row(&'a Insert),
    Message(&'a Message),
}

impl<S: ChangeSource, P: Publisher, C: CheckpointStore> Pipeline<S, P, C> {
    /// One Insert of the open transaction: the message to publish, if any.
    // The large variant (Route) is the cold path that ends the session.
    #[allow(clippy::result_large_err)]
    pub(super) fn on_insert(
        &mut self,
        insert: &Insert,
    ) -> Result<Option<(OutboundMessage, EventTicket)>, PipelineError> {
        let Some((tx, mut index)) = self.tx.take() else {
            return Err(FrontierError::NoOpenTransaction.into());
        };
        let routed = self.router.route_insert(insert, &tx, index);
        // A message the broker cannot take is a bad row, not a publish to retry forever.
        let limits = self.publisher.limits();
        let routed = routed
            .and_then(|msg| self.check_recent(msg))
            .and_then(|m| self.router.check_limits(insert, m, &limits));
        let admitted = self.admit(routed, &tx, &mut index, Origin::Row(insert));
        self.tx = Some((tx, index));
        match admitted? {
            Some(msg) => Ok(Some((msg, self.frontier.event()?))),
            None => Ok(None),
        }
    }

    /// One logical decoding message (`pg_logical_emit_message`). A transactional one is an
    /// event of the open transaction, numbered among its rows. A non-transactional one arrives
    /// outside any transaction: it is its own transaction to the frontier, ending one byte past
    /// its LSN, so no position past it is confirmed before its ack (see
    /// [`non_transactional_end`]).
    // The large variant (Route) is the cold path that ends the session.
    #[allow(clippy::result_large_err)]
    pub(super) fn on_logical_message(
        &mut self,
        message: &Message,
    ) -> Result<Option<(OutboundMessage, EventTicket)>, PipelineError> {
        if self.router.message_policy(&message.prefix) == MessagePolicy::Unconfigured {
            // Someone else's (another consumer of logical messages, an extension).
            self.stats.messages_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        if message.transactional {
            let Some((tx, mut index)) = self.tx.take() else {
                return Err(FrontierError::NoOpenTransaction.into());
            };
            let admitted = self.admit_message(message, &tx, &mut index);
            self.tx = Some((tx, index));
            return match admitted? {
                Some(msg) => Ok(Some((msg, self.frontier.event()?))),
                None => Ok(None),
            };
        }
        if self.tx.is_some() {
            // pgoutput v1 never sends one inside a transaction's Begin…Commit.
            return Err(FrontierError::NestedBegin.into());
        }
        let tx = non_transactional_context(message);
        let mut index = 0;
        let admitted = self.admit_message(message, &tx, &mut index)?;
        // Outside any Begin…Commit for the publisher too: published on its own (a batching
        // publisher batches only the messages of an open transaction).
        self.frontier.begin()?;
        let ticket = match admitted {
            Some(msg) => Some((msg, self.frontier.event()?)),
            None => None,
        };
        self.frontier.commit(non_transactional_end(message.lsn))?;
        Ok(ticket)
    }

    // The large variant (Route) is the cold path that ends the session.
    #[allow(clippy::result_large_err)]
    fn admit_message(
        &mut self,
        message: &Message,
        tx: &TxContext,
        index: &mut u64,
    ) -> Result<Option<OutboundMessage>, PipelineError> {
        let limits = self.publisher.limits();
        let routed = self
            .router
            .route_message(message, tx, *index, &limits)
            .and_then(|msg| self.check_recent(msg));
        self.admit(routed, tx, index, Origin::Message(message))
    }

    /// An event whose id was routed before in this session with another subject or payload is
    /// a collision, not a re-send.
    #[allow(clippy::result_large_err)]
    fn check_recent(
        &mut self,
        msg: Option<OutboundMessage>,
    ) -> Result<Option<OutboundMessage>, RouteError> {
        match msg {
            Some(msg) if !self.recent.check(&msg) => Err(RouteError::IdCollision {
                table: msg.table.to_string(),
                event_id: msg.event_id,
            }),
            other => Ok(other),
        }
    }

    /// The routing outcome of one event of `tx` (number `index`, moved on when it becomes a
    /// message): the message to publish, `None` when there is nothing to publish (not an
    /// outbox event, or already in the stream), or the error that stops the relay.
    #[allow(clippy::result_large_err)]
    // Long: one decision per routed event (error policy, dead letter, skip, collision, limits) on
    // the hot path; each arm returns
    fn admit(
        &mut self,
        routed: Result<Option<OutboundMessage>, RouteError>,
        tx: &TxContext,
        index: &mut u64,
        origin: Origin<'_>,
    ) -> Result<Option<OutboundMessage>, PipelineError> {
        let routed = match routed {
            Ok(routed) => routed,
            Err(error) if Self::stops_on(&self.config, &error) => {
                return Err(Self::schema_error(Some(tx), error));
            }
            Err(error) => {
                let limits = self.publisher.limits();
                let dead = self
                    .config
                    .dead_letter_subject
                    .as_ref()
                    .and_then(|subject| match origin {
                        Origin::Row(insert) => self
                            .router
                            .dead_letter_row(subject, insert, tx, *index, &error),
                        Origin::Message(message) => self
                            .router
                            .dead_letter_message(subject, message, tx, *index, &error),
                    })
                    // Too large itself (the raw row of an oversized payload): fail closed.
                    .filter(|dead| limits.check(dead).is_ok());
                let Some(msg) = dead else {
                    let event_id = match origin {
                        Origin::Row(insert) => self.router.event_id_of(insert),
                        Origin::Message(message) => self.router.message_event_id(message),
                    };
                    return Err(PipelineError::Route {
                        event_id: event_id.map(Into::into),
                        xid: tx.xid,
                        commit_lsn: tx.commit_lsn,
                        error,
                    });
                };
                *index += 1;
                if let Some(seq) = self.already_published.remove(&msg.event_id) {
                    self.positions
                        .stored(tx.commit_lsn, tx.commit_time_micros, seq);
                    self.stats.already_published.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                }
                self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                let what = match origin {
                    Origin::Row(_) => "row",
                    Origin::Message(_) => "logical message",
                };
                tracing::warn!(
                    table = %msg.table,
                    commit_lsn = %tx.commit_lsn,
                    xid = tx.xid,
                    subject = %msg.subject,
                    dead_letter_id = %msg.event_id,
                    reason = %error,
                    "{what} cannot be routed; publishing it to the dead-letter subject"
                );
                return Ok(Some(msg));
            }
        };
        match routed {
            Some(msg) if self.already_published.contains_key(&msg.event_id) => {
                *index += 1;
                if let Some(seq) = self.already_published.remove(&msg.event_id) {
                    self.positions
                        .stored(tx.commit_lsn, tx.commit_time_micros, seq);
                }
                self.stats.already_published.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Some(msg) => {
                *index += 1;
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                Ok(Some(msg))
            }
            None => {
                self.stats.changes_skipped.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    /// Whether a route error is a table-shape error that stops the relay (exit 78) instead of a
    /// row-level one. A renamed table always stops: renaming it back lets its rows through
    /// (`Router::bind_catalog`). A mapped column that no longer fits stops unless a dead-letter
    /// subject is set: rows committed under the old shape can only be parked, never re-read
    /// under a new one.
    pub(super) fn stops_on(config: &PipelineConfig, error: &RouteError) -> bool {
        matches!(error, RouteError::OutboxRenamed { .. })
            || (error.is_schema_mismatch() && config.dead_letter_subject.is_none())
    }

    /// A table-shape error in the open transaction (if any).
    pub(super) fn schema_error(tx: Option<&TxContext>, error: RouteError) -> PipelineError {
        PipelineError::Schema {
            xid: tx.map(|tx| tx.xid),
            commit_lsn: tx.map(|tx| tx.commit_lsn),
            error,
        }
    }
}
