//! The checkpoint: the ack frontier stored, then confirmed to the source, once the broker's
//! own state agrees with the acknowledgements it moves past.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{Pipeline, PipelineError};
use crate::stage::{AckCheck, ChangeSource, CheckpointStore, Publisher};

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
        if !self.acks_held().await? {
            return Ok(());
        }
        crate::failpoint::hit("after_ack_before_store");
        let anchor = self.positions.anchor(lsn);
        self.store
            .save_with_anchor(lsn, anchor)
            .await
            .map_err(|error| PipelineError::Store { lsn, error })?;
        self.positions.checkpointed(lsn);
        self.unchecked_seq = 0;
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

    /// Whether the stream can hold every acknowledgement since the last stored checkpoint
    /// (one question to the broker per checkpoint, not per event). A stream that cannot (a
    /// forged PubAck, a stream gone or reset) ends the session before anything is stored past
    /// them; one that cannot be asked now delays this checkpoint.
    async fn acks_held(&mut self) -> Result<bool, PipelineError> {
        if self.unchecked_seq == 0 {
            return Ok(true);
        }
        match self.publisher.check_acks(self.unchecked_seq).await {
            AckCheck::Held => Ok(true),
            AckCheck::Unknown(why) => {
                tracing::debug!(highest_seq = self.unchecked_seq, why = %why, "cannot check the acknowledgements against the stream now; the checkpoint waits");
                Ok(false)
            }
            AckCheck::NotHeld(reason) => {
                self.stats.acks_not_held.fetch_add(1, Ordering::Relaxed);
                Err(PipelineError::AcksNotHeld {
                    highest_seq: self.unchecked_seq,
                    reason,
                    stored: self.stored,
                })
            }
        }
    }
}
