//! The relay loop: source → route → publish (bounded window) → checkpoint.
//!
//! One task owns all state. It reads the source only while fewer than `max_in_flight` events
//! await their ack, starts each publish in commit order, and every `checkpoint_interval` stores
//! the ack frontier and then confirms it to the slot. Nothing is ever confirmed past an event the
//! broker has not acknowledged: the frontier (see [`crate::frontier`]) only moves over fully
//! acknowledged transactions, or over keepalive positions while nothing is in flight.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use pgoutput::{LogicalMessage, Lsn};
use tokio::time::{Instant, MissedTickBehavior};

use crate::frontier::{AckFrontier, EventTicket, FrontierError};

mod admit;
mod checkpoint;
mod deliver;
mod error;
mod held;
mod positions;
mod stats;

use crate::message::{OutboundMessage, TxContext};
use crate::recent::RecentIds;
use crate::route::{Router, dead_letter_collision};
use crate::stage::{ChangeSource, CheckpointStore, PublishErrorKind, Publisher, SourceEvent};
use crate::trail::SlotTrail;
use deliver::{Attempt, Outcome, RetryPolicy, Window, attempt};
pub use error::PipelineError;
use held::HeldTransaction;
use positions::Positions;
pub use stats::PipelineStats;

/// Tuning of the loop. Defaults suit a 2-core machine next to the database.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Events published and not yet acknowledged, at most.
    pub max_in_flight: usize,
    /// How often the frontier is stored and confirmed.
    pub checkpoint_interval: Duration,
    /// How often a frontier that moved only over event-free WAL (keepalives, other tables) is
    /// stored and confirmed. Kept apart from `checkpoint_interval` because the checkpoint write
    /// is WAL itself: on an idle database every write would earn the next keepalive.
    pub idle_checkpoint_interval: Duration,
    /// First delay before re-publishing a message whose outcome is unknown.
    pub retry_initial: Duration,
    /// Longest delay between re-publishes.
    pub retry_max: Duration,
    /// How long "no stream answered" is retried before it is fatal.
    pub no_stream_grace: Duration,
    /// On shutdown, how long to wait for outstanding acks.
    pub drain_timeout: Duration,
    /// Where rows that cannot be routed go instead of stopping the relay (opt-in).
    pub dead_letter_subject: Option<String>,
    /// How many recent event ids are remembered to detect id collisions (0: off).
    pub collision_window: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 1024,
            checkpoint_interval: Duration::from_secs(1),
            idle_checkpoint_interval: Duration::from_secs(10),
            retry_initial: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
            no_stream_grace: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(20),
            dead_letter_subject: None,
            collision_window: crate::recent::DEFAULT_CAPACITY,
        }
    }
}

/// How the loop ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutcome {
    /// Stored and confirmed position at exit.
    pub confirmed: Lsn,
    /// Events still unacknowledged when the drain timed out (re-sent after restart).
    pub abandoned: u64,
}

/// The relay loop over one source session.
#[derive(Debug)]
pub struct Pipeline<S, P, C> {
    source: S,
    /// Shared with every delivery by reference count (a publisher clone can be costly: an
    /// async-nats context clones its client and prefix).
    publisher: Arc<P>,
    store: C,
    router: Router,
    frontier: AckFrontier,
    /// Last position saved to the store (and then confirmed to the source).
    stored: Lsn,
    /// When `stored` was last written.
    stored_at: Instant,
    config: PipelineConfig,
    stats: Arc<PipelineStats>,
    /// The open transaction and the count of its outbox events so far.
    tx: Option<(TxContext, u64)>,
    /// Its events, published once its Commit is read.
    held: HeldTransaction,
    /// Event ids the stream already holds past the start position (a restart after a downtime
    /// longer than the duplicate window), with their stream sequence: not published again.
    already_published: HashMap<String, u64>,
    /// Recent event ids, to report id collisions.
    recent: RecentIds,
    /// Where the events not yet behind the stored checkpoint are in the stream.
    positions: Positions,
    /// `[relay] replay_retention`: the slot is confirmed this far behind the checkpoint.
    trail: Option<SlotTrail>,
    /// What the stream was asked of the acknowledgements, beside the loop
    /// ([`checkpoint::AckChecks`]).
    ack_checks: checkpoint::AckChecks,
}

/// Why the loop leaves its reading phase.
enum Stop {
    /// Shutdown requested: finish the open transaction, if any, then drain.
    Shutdown,
    /// The source ended: drain.
    Drain,
    /// A failure: drain, then report it.
    Failed(PipelineError),
    /// The drain deadline passed.
    DrainTimedOut,
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Header of a dead letter: why the row could not be routed.
pub use outbox_contract::HEADER_DLQ_REASON;

impl<S: ChangeSource, P: Publisher, C: CheckpointStore> Pipeline<S, P, C> {
    /// A loop that resumes at `start`, a position already stored and confirmed.
    pub fn new(
        source: S,
        publisher: P,
        store: C,
        router: Router,
        start: Lsn,
        config: PipelineConfig,
        stats: Arc<PipelineStats>,
    ) -> Self {
        stats.confirmed_lsn.store(start.0, Ordering::Relaxed);
        let recent = RecentIds::new(config.collision_window);
        let positions = Positions::new(publisher.stream_name());
        Self {
            source,
            publisher: Arc::new(publisher),
            store,
            router,
            frontier: AckFrontier::new(start),
            stored: start,
            stored_at: Instant::now(),
            config,
            stats,
            tx: None,
            held: HeldTransaction::default(),
            already_published: HashMap::new(),
            recent,
            positions,
            trail: None,
            ack_checks: checkpoint::AckChecks::default(),
        }
    }

    /// Confirms to the source the position `trail` gives for each stored checkpoint instead
    /// of the checkpoint itself (`[relay] replay_retention`): the source keeps that WAL.
    pub fn trail_slot(&mut self, trail: SlotTrail) {
        self.trail = Some(trail);
    }

    /// Event ids found in the stream past the start position, with the stream sequence of
    /// their copy; each is skipped once when the stream re-delivers its row, instead of being
    /// stored a second time.
    pub fn skip_published(&mut self, ids: HashMap<String, u64>) {
        self.already_published = ids;
    }

    /// Takes the loop apart: the source (to stop it cleanly), publisher and store.
    pub fn into_parts(self) -> (S, Arc<P>, C) {
        (self.source, self.publisher, self.store)
    }

    /// Runs until `shutdown` resolves (then drains and checkpoints), the source ends, or an
    /// error. On any error the acknowledged prefix is still checkpointed when possible.
    ///
    /// One loop in two phases: *reading* (source, acks, checkpoints) and, after a shutdown, the
    /// end of the source or a failure, *draining*: no more reading, outstanding acks awaited for
    /// at most `drain_timeout` so the stored position is as far as the broker really got.
    // Long: one `select!` loop over source, acks, checkpoints and shutdown; its arms share the
    // in-flight set, the timers and the drain state
    pub async fn run(
        &mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunOutcome, PipelineError> {
        let mut shutdown = pin!(shutdown);
        // Publish attempts whose outcome is pending; `window` keeps their messages in order.
        let mut in_flight: FuturesUnordered<_> = FuturesUnordered::new();
        let mut tick = tokio::time::interval(self.config.checkpoint_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let policy = RetryPolicy {
            initial: self.config.retry_initial,
            max: self.config.retry_max,
            no_stream_grace: self.config.no_stream_grace,
        };
        let mut window = Window::new(policy);
        let max_in_flight = self.config.max_in_flight.max(1);
        let mut failure: Option<PipelineError> = None;
        // Set when draining starts.
        let mut drain_deadline: Option<Instant> = None;
        // A shutdown that came inside a transaction reads on to its Commit (within the drain
        // deadline): only a whole transaction can be confirmed, so stopping mid-way would make
        // the next start read, and publish, its first part again.
        let mut finishing_tx = false;

        loop {
            let reading = drain_deadline.is_none();
            // After a failure nothing waits for a re-send: the failure is what is reported.
            if !reading
                && !finishing_tx
                && in_flight.is_empty()
                && (failure.is_some() || !window.has_failed())
            {
                break;
            }
            // Only the open transaction's events are outstanding and its Commit will not be
            // read: their acks cannot move the frontier (a batching publisher would not even
            // resolve them before the Commit), so waiting out `drain_timeout` gains nothing.
            // They are re-sent after the restart, deduplicated by `Nats-Msg-Id`.
            if !reading && !finishing_tx && self.frontier.only_open_transaction_pending() {
                break;
            }
            let can_read = (reading || finishing_tx)
                && window.open()
                && window.len() + self.held.len() < max_in_flight;
            window.settle(in_flight.len());
            let resend_at = window.resend_at();
            // What the select produced: a message to publish, an error, or a phase change.
            let step: Result<Option<(OutboundMessage, EventTicket)>, Stop> = tokio::select! {
                biased;
                () = &mut shutdown, if reading => Err(Stop::Shutdown),
                () = sleep_until_some(drain_deadline), if !reading => Err(Stop::DrainTimedOut),
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    self.on_attempt(&mut window, done).map_err(Stop::Failed)
                }
                () = sleep_until_some(resend_at), if resend_at.is_some() => {
                    if let Some((seq, msg)) = window.start_round(&self.stats) {
                        let sent = self.publisher.resend(&msg, None).await;
                        in_flight.push(attempt(seq, sent));
                    }
                    Ok(None)
                }
                _ = tick.tick() => match self.checkpoint(false).await {
                    Ok(()) => Ok(None),
                    // Storing failed: draining cannot store either.
                    Err(e) if !reading => {
                        failure.get_or_insert(e);
                        break;
                    }
                    Err(e) => Err(Stop::Failed(e)),
                },
                event = self.source.next(), if can_read => match event {
                    Ok(Some(event)) => match self.on_event(event) {
                        // An event of the open transaction waits for its Commit.
                        Ok(Some(routed)) if self.tx.is_some() => {
                            self.held.push(routed);
                            Ok(None)
                        }
                        other => other.map_err(Stop::Failed),
                    },
                    Ok(None) => Err(Stop::Drain),
                    Err(e) => Err(Stop::Failed(e.into())),
                },
            };
            match step {
                Ok(Some(routed)) => {
                    self.launch(&mut window, &mut in_flight, routed, attempt)
                        .await;
                }
                Ok(None) => {}
                Err(Stop::DrainTimedOut) => break,
                Err(stop) => {
                    match stop {
                        Stop::Shutdown if self.tx.is_some() => {
                            tracing::info!(
                                "shutdown inside a transaction: reading on to its commit"
                            );
                            finishing_tx = true;
                        }
                        Stop::Failed(e) => {
                            finishing_tx = false;
                            failure.get_or_insert(e);
                        }
                        _ => finishing_tx = false,
                    }
                    drain_deadline
                        .get_or_insert_with(|| Instant::now() + self.config.drain_timeout);
                }
            }
            self.release_held(&mut window, &mut in_flight, max_in_flight, attempt)
                .await;
            // The first event not stored was: the others it held back follow, in order.
            for seq in window.take_burst(&self.stats) {
                if let Some((msg, after)) = window.resend_args(seq) {
                    let sent = self.publisher.resend(&msg, after).await;
                    in_flight.push(attempt(seq, sent));
                }
            }
            if finishing_tx && self.tx.is_none() {
                finishing_tx = false;
            }
            self.stats
                .in_flight
                .store(self.frontier.in_flight(), Ordering::Relaxed);
        }

        let abandoned = in_flight.len() as u64;
        if abandoned > 0 && self.frontier.only_open_transaction_pending() {
            tracing::info!(
                abandoned,
                "stopped inside a transaction: its unacknowledged events will be re-sent after restart"
            );
        } else if abandoned > 0 {
            tracing::warn!(
                abandoned,
                "shutdown drain timed out; unacknowledged events will be re-sent after restart"
            );
        }
        let saved = self.checkpoint(true).await;
        match (failure, saved) {
            (Some(e), _) => Err(e),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(RunOutcome {
                confirmed: self.stored,
                abandoned,
            }),
        }
    }

    /// Feeds one source event through decode results and routing; returns a message to publish.
    // The large variant (Route) is the cold path that ends the session.
    #[allow(clippy::result_large_err)]
    fn on_event(
        &mut self,
        event: SourceEvent,
    ) -> Result<Option<(OutboundMessage, EventTicket)>, PipelineError> {
        match event {
            SourceEvent::Begin {
                xid,
                final_lsn,
                commit_time_micros,
            } => {
                self.frontier.begin()?;
                self.tx = Some((TxContext::new(xid, final_lsn, commit_time_micros), 0));
                self.publisher.begin_transaction(final_lsn);
            }
            SourceEvent::Commit { end_lsn, .. } => {
                self.frontier.commit(end_lsn)?;
                self.tx = None;
                // The publisher hears of the end once the held events went out.
                self.held.end();
            }
            SourceEvent::KeepAlive { wal_end } => {
                self.frontier.keepalive(wal_end);
            }
            SourceEvent::Message(LogicalMessage::Relation(relation)) => {
                let commit_lsn = self.tx.as_ref().map(|(tx, _)| tx.commit_lsn);
                match self.router.on_relation(relation, commit_lsn) {
                    Err(error) if Self::stops_on(&self.config, &error) => {
                        let tx = self.tx.as_ref().map(|(tx, _)| tx);
                        return Err(Self::schema_error(tx, error));
                    }
                    // A mapped column that no longer fits, with a dead-letter subject: the
                    // table's rows go there (the route keeps the error).
                    Err(error) => {
                        tracing::warn!(reason = %error, "outbox rows will go to the dead-letter subject");
                    }
                    Ok(()) => {}
                }
            }
            SourceEvent::Message(LogicalMessage::Insert(insert)) => {
                return self.on_insert(&insert);
            }
            SourceEvent::Message(LogicalMessage::Message(message)) => {
                return self.on_logical_message(&message);
            }
            SourceEvent::Message(LogicalMessage::Begin(_)) => {
                return Err(FrontierError::Unframed("Begin").into());
            }
            SourceEvent::Message(LogicalMessage::Commit(_)) => {
                return Err(FrontierError::Unframed("Commit").into());
            }
            SourceEvent::Message(_) => {
                // Updates, deletes and truncates of the outbox (e.g. insert-then-delete in one
                // transaction), Type and Origin carry no outbox event.
                self.stats.changes_skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(None)
    }

    /// Takes one publish attempt's outcome. A collision the broker revealed goes to the
    /// dead-letter subject when one is set: the returned message is published under the same
    /// ticket.
    // The large variant (Route) is the cold path that ends the session.
    #[allow(clippy::result_large_err)]
    fn on_attempt(
        &mut self,
        window: &mut Window,
        done: Attempt,
    ) -> Result<Option<(OutboundMessage, EventTicket)>, PipelineError> {
        let publisher = &self.publisher;
        match window.on_attempt(done, || publisher.max_server_closes(), &self.stats) {
            Outcome::Again => {
                // Nothing new goes out until the window settles: nothing may be held back.
                publisher.hold();
                Ok(None)
            }
            Outcome::Stored(ticket, receipt, msg, mark) => {
                self.positions.finished(mark);
                self.frontier.ack(ticket)?;
                self.positions
                    .stored(msg.commit_lsn, msg.commit_time_micros, receipt.stream_seq);
                self.ack_checks.acked(receipt.stream_seq);
                self.stats.events_published.fetch_add(1, Ordering::Relaxed);
                if receipt.duplicate {
                    self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None)
            }
            Outcome::Refused(ticket, msg, error, mark) => {
                self.positions.finished(mark);
                let dead_letter_subject = self.config.dead_letter_subject.as_ref();
                match dead_letter_subject {
                    Some(subject) if error.kind == PublishErrorKind::Collision => {
                        tracing::warn!(
                            event_id = %msg.event_id,
                            table = %msg.table,
                            error = %error,
                            "event id collision: publishing it to the dead-letter subject"
                        );
                        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                        let dead = dead_letter_collision(subject, &msg, &error);
                        Ok(Some((dead, ticket)))
                    }
                    _ => Err(PipelineError::Publish {
                        event_id: msg.event_id.clone(),
                        subject: msg.subject.clone(),
                        error,
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
