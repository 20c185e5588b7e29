//! The checkpoint: the ack frontier stored, then confirmed to the source, once the broker's
//! own state agrees with the acknowledgements it moves past.
//!
//! The stream is asked beside the loop, never in it: a stalled NATS must not stall reading and
//! publishing. A checkpoint asks once (one `STREAM.INFO`) for the highest sequence acknowledged
//! so far, waits a moment for the answer, and otherwise stores at a later tick; what it may
//! store is the frontier as it was when it asked, whose events all have sequences up to the one
//! asked about.

use std::sync::atomic::Ordering;
use std::time::Duration;

use pgoutput::Lsn;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Pipeline, PipelineError};
use crate::stage::{AckCheck, ChangeSource, CheckpointStore, Publisher};

/// How long a checkpoint waits for the stream's answer before it tries again at the next tick.
const ANSWER_WAIT: Duration = Duration::from_millis(20);
/// How long the last checkpoint of a run (a shutdown) waits for it.
const FINAL_WAIT: Duration = Duration::from_secs(5);

/// The acknowledgements and what the stream said of them.
#[derive(Debug, Default)]
pub(super) struct AckChecks {
    /// The highest stream sequence acknowledged in this run (0: none).
    acked_seq: u64,
    /// The highest sequence the stream was found to hold.
    held_through: u64,
    /// The question in flight: the frontier and the sequence when it was asked.
    asked: Option<Asked>,
}

#[derive(Debug)]
struct Asked {
    lsn: Lsn,
    seq: u64,
    answer: JoinHandle<AckCheck>,
}

impl AckChecks {
    pub(super) fn acked(&mut self, stream_seq: u64) {
        self.acked_seq = self.acked_seq.max(stream_seq);
    }
}

impl Drop for AckChecks {
    fn drop(&mut self) {
        if let Some(asked) = &self.asked {
            asked.answer.abort();
        }
    }
}

impl<S: ChangeSource, P: Publisher, C: CheckpointStore> Pipeline<S, P, C> {
    /// Stores the frontier if it moved, then confirms it to the source: store first, so the
    /// slot never hears of a position the store could lose. A move over event-free WAL only is
    /// stored every `idle_checkpoint_interval` (unless `force`, at shutdown).
    pub(super) async fn checkpoint(&mut self, force: bool) -> Result<(), PipelineError> {
        let lsn = self.frontier.confirmed();
        if lsn <= self.stored {
            return Ok(());
        }
        let eventful = self.frontier.last_eventful() > self.stored;
        let idle_due = self.stored_at.elapsed() >= self.config.idle_checkpoint_interval;
        if !(eventful || idle_due || force) {
            return Ok(());
        }
        let Some(lsn) = self.held_position(lsn, force).await? else {
            return Ok(());
        };
        crate::failpoint::hit("after_ack_before_store");
        let anchor = self.positions.anchor(lsn);
        self.store
            .save_with_anchor(lsn, anchor)
            .await
            .map_err(|error| PipelineError::Store { lsn, error })?;
        self.positions.checkpointed(lsn);
        self.stored = lsn;
        self.stored_at = Instant::now();
        crate::failpoint::hit("after_store_before_confirm");
        // With a replay retention the slot trails the checkpoint (never passes it).
        let slot_lsn = match &mut self.trail {
            Some(trail) => trail.slot_position(lsn, Instant::now()),
            None => lsn,
        };
        self.source.confirm(slot_lsn);
        self.stats.confirmed_lsn.store(lsn.0, Ordering::Relaxed);
        self.stats
            .slot_confirmed_lsn
            .store(slot_lsn.0, Ordering::Relaxed);
        tracing::debug!(lsn = %lsn, slot_lsn = %slot_lsn, "checkpoint stored and confirmed");
        Ok(())
    }

    /// The position the checkpoint may store: `lsn` when the stream was found to hold every
    /// acknowledgement behind it, an earlier frontier whose acknowledgements it holds, or `None`
    /// until it answers. A stream that cannot hold them (a forged PubAck, a stream gone or
    /// reset) ends the session before anything is stored past them.
    async fn held_position(&mut self, lsn: Lsn, force: bool) -> Result<Option<Lsn>, PipelineError> {
        let checks = &mut self.ack_checks;
        if checks.acked_seq <= checks.held_through {
            return Ok(Some(lsn));
        }
        let mut asked = match checks.asked.take() {
            Some(asked) => asked,
            None => Asked {
                lsn,
                seq: checks.acked_seq,
                answer: tokio::spawn(self.publisher.check_acks(checks.acked_seq)),
            },
        };
        let wait = if force { FINAL_WAIT } else { ANSWER_WAIT };
        let mut answer = match tokio::time::timeout(wait, &mut asked.answer).await {
            Err(_) => {
                self.ack_checks.asked = Some(asked);
                return Ok(None);
            }
            Ok(Err(join)) => AckCheck::Unknown(format!("the check did not finish: {join}")),
            Ok(Ok(answer)) => answer,
        };
        // The last checkpoint of a run asks once more when the question in flight went
        // unanswered (asked while NATS stalled): a clean stop stores what was acknowledged.
        if force && matches!(answer, AckCheck::Unknown(_)) {
            asked = Asked {
                lsn,
                seq: self.ack_checks.acked_seq,
                answer: tokio::spawn(self.publisher.check_acks(self.ack_checks.acked_seq)),
            };
            answer = match tokio::time::timeout(FINAL_WAIT, &mut asked.answer).await {
                Ok(Ok(answer)) => answer,
                _ => AckCheck::Unknown("no answer at the last checkpoint".into()),
            };
        }
        match answer {
            AckCheck::Held => {
                self.ack_checks.held_through = asked.seq;
                Ok((asked.lsn > self.stored).then_some(asked.lsn))
            }
            AckCheck::Unknown(why) => {
                tracing::debug!(highest_seq = asked.seq, why = %why, "cannot check the acknowledgements against the stream now; the checkpoint waits");
                Ok(None)
            }
            AckCheck::NotHeld(reason) => {
                self.stats.acks_not_held.fetch_add(1, Ordering::Relaxed);
                Err(PipelineError::AcksNotHeld {
                    highest_seq: asked.seq,
                    reason,
                    stored: self.stored,
                })
            }
        }
    }
}
