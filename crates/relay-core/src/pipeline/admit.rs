//! Admitting one outbox row: route it, check it against the broker's limits and recent ids,
//! and decide between publishing it, skipping it (already in the stream), dead-lettering it
//! and stopping before its transaction.

use std::sync::atomic::Ordering;

use pgoutput::Insert;

use super::{Pipeline, PipelineConfig, PipelineError};
use crate::frontier::{EventTicket, FrontierError};
use crate::message::{OutboundMessage, TxContext};
use crate::route::RouteError;
use crate::stage::{ChangeSource, CheckpointStore, Publisher};

impl<S: ChangeSource, P: Publisher, C: CheckpointStore> Pipeline<S, P, C> {
    /// One Insert of the open transaction: the message to publish, if any.
    // The large variant (Route) is the cold path that ends the session.
    #[allow(clippy::result_large_err)]
    pub(super) fn on_insert(
        &mut self,
        insert: &Insert,
    ) -> Result<Option<(OutboundMessage, EventTicket)>, PipelineError> {
        let Some((tx, index)) = self.tx.as_mut() else {
            return Err(FrontierError::NoOpenTransaction.into());
        };
        let routed = self
            .router
            .route_insert(insert, tx, *index)
            .and_then(|msg| match msg {
                Some(msg) if !self.recent.check(&msg) => Err(RouteError::IdCollision {
                    table: msg.table.to_string(),
                    event_id: msg.event_id,
                }),
                other => Ok(other),
            });
        // A message the broker cannot take is a bad row, not a publish to retry forever.
        let limits = self.publisher.limits();
        let routed = routed.and_then(|m| self.router.check_limits(insert, m, &limits));
        let routed = match routed {
            Ok(routed) => routed,
            Err(error) if Self::stops_on(&self.config, &error) => {
                return Err(Self::schema_error(Some(tx), error));
            }
            Err(error) => {
                let dead = self
                    .config
                    .dead_letter_subject
                    .as_ref()
                    .and_then(|subject| {
                        self.router
                            .dead_letter_row(subject, insert, tx, *index, &error)
                    })
                    // Too large itself (the raw row of an oversized payload): fail closed.
                    .filter(|dead| limits.check(dead).is_ok());
                let Some(msg) = dead else {
                    return Err(PipelineError::Route {
                        event_id: self.router.event_id_of(insert).map(Into::into),
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
                tracing::warn!(
                    table = %msg.table,
                    commit_lsn = %tx.commit_lsn,
                    xid = tx.xid,
                    subject = %msg.subject,
                    dead_letter_id = %msg.event_id,
                    reason = %error,
                    "row cannot be routed; publishing it to the dead-letter subject"
                );
                let ticket = self.frontier.event()?;
                return Ok(Some((msg, ticket)));
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
            }
            Some(msg) => {
                *index += 1;
                self.stats.events_received.fetch_add(1, Ordering::Relaxed);
                let ticket = self.frontier.event()?;
                return Ok(Some((msg, ticket)));
            }
            None => {
                self.stats.changes_skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(None)
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
