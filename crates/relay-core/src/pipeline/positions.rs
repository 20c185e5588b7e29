//! Where acknowledged events are in the stream, for the [`PositionAnchor`] stored with each
//! checkpoint.
//!
//! Acks come back in any order and a checkpoint moves only over the contiguous acknowledged
//! prefix, so an anchor cannot be built from "the acks since the last checkpoint": an event acked
//! before one checkpoint may only fall behind the next, and a re-sent event can land in the
//! stream after events committed later. Instead this keeps, per transaction not yet behind the
//! stored checkpoint, the lowest sequence any of its events was acknowledged at; a checkpoint's
//! anchor takes the lowest of *all* of them (those it moves past and those acked beyond it),
//! and of a bound for every event still in flight: the highest sequence known stored when it
//! was first sent (anything it stores comes later). So every event the checkpoint moves past,
//! and every later event already sent, has a copy at or after the anchor's sequence.

use std::collections::BTreeMap;
use std::sync::Arc;

use pgoutput::Lsn;

use crate::stage::PositionAnchor;

/// Watermark of a delivery launched before any stream sequence was known in this session.
const UNKNOWN: u64 = 0;

/// Stream positions of the acknowledged events not yet behind the stored checkpoint.
#[derive(Debug, Default)]
pub(super) struct Positions {
    /// The stream the sequences count in; `None`: no anchors (the publisher names none).
    stream: Option<Arc<str>>,
    /// Commit LSN of a transaction → (lowest sequence of its acknowledged events, commit time).
    acked: BTreeMap<Lsn, (u64, i64)>,
    /// Watermark at first send → deliveries in flight with it.
    in_flight: BTreeMap<u64, usize>,
    /// Highest stream sequence known stored.
    watermark: u64,
}

impl Positions {
    pub(super) fn new(stream: Option<Arc<str>>) -> Self {
        Self {
            stream,
            ..Self::default()
        }
    }

    /// A delivery starts; returns its mark, to hand back to [`Self::finished`].
    pub(super) fn launched(&mut self) -> u64 {
        *self.in_flight.entry(self.watermark).or_default() += 1;
        self.watermark
    }

    /// The delivery with `mark` ended (acknowledged or failed).
    pub(super) fn finished(&mut self, mark: u64) {
        if let Some(n) = self.in_flight.get_mut(&mark) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&mark);
            }
        }
    }

    /// An event of the transaction committed at `commit_lsn` is in the stream at `seq`
    /// (acknowledged, or found there at start-up).
    pub(super) fn stored(&mut self, commit_lsn: Lsn, commit_time_micros: i64, seq: u64) {
        self.watermark = self.watermark.max(seq);
        // 0/0 is no commit (a row `outbox-relay backfill` read from the table).
        if self.stream.is_none() || commit_lsn == Lsn(0) || seq == 0 {
            return;
        }
        let entry = self
            .acked
            .entry(commit_lsn)
            .or_insert((seq, commit_time_micros));
        entry.0 = entry.0.min(seq);
    }

    /// The anchor for a checkpoint at `lsn`: `None` when it moves past no acknowledged event.
    pub(super) fn anchor(&self, lsn: Lsn) -> Option<PositionAnchor> {
        let stream = self.stream.clone()?;
        let (&commit_lsn, &(_, commit_time_micros)) = self.acked.range(..lsn).next()?;
        let acked = self.acked.values().map(|(seq, _)| *seq).min();
        let floor_unknown = self.in_flight.contains_key(&UNKNOWN);
        let sent = self.in_flight.range(UNKNOWN + 1..).next().map(|(s, _)| *s);
        let stream_seq = acked.into_iter().chain(sent).min()?;
        Some(PositionAnchor {
            stream,
            commit_lsn,
            commit_time_micros,
            stream_seq,
            floor_unknown,
        })
    }

    /// The checkpoint at `lsn` is stored: forget the transactions behind it.
    pub(super) fn checkpointed(&mut self, lsn: Lsn) {
        self.acked = self.acked.split_off(&lsn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anchor_takes_the_lowest_sequence_of_everything_not_yet_behind_the_checkpoint() {
        let mut p = Positions::new(Some("S".into()));
        // Sent before any sequence is known.
        let first = p.launched();
        assert_eq!(first, UNKNOWN);
        p.stored(Lsn(100), 1, 7);
        p.finished(first);
        let late = p.launched(); // watermark 7
        p.stored(Lsn(300), 3, 5); // acked beyond the frontier, landed before 100's copy
        let a = p.anchor(Lsn(200)).expect("anchor");
        assert_eq!(
            (a.commit_lsn, a.commit_time_micros, a.stream_seq),
            (Lsn(100), 1, 5)
        );
        assert!(!a.floor_unknown);
        p.checkpointed(Lsn(200));
        assert!(p.anchor(Lsn(250)).is_none(), "nothing acked behind 250");
        p.stored(Lsn(260), 2, 9);
        p.finished(late);
        let a = p.anchor(Lsn(400)).expect("anchor");
        assert_eq!((a.commit_lsn, a.stream_seq), (Lsn(260), 5));
    }

    #[test]
    fn an_event_sent_before_any_ack_leaves_the_floor_to_the_store() {
        let mut p = Positions::new(Some("S".into()));
        let _stuck = p.launched();
        p.stored(Lsn(100), 1, 40);
        let a = p.anchor(Lsn(200)).expect("anchor");
        assert!(a.floor_unknown);
        assert_eq!(a.stream_seq, 40);
    }

    #[test]
    fn no_stream_no_anchor_and_backfill_rows_are_not_positions() {
        let mut p = Positions::new(None);
        p.stored(Lsn(100), 1, 3);
        assert!(p.anchor(Lsn(200)).is_none());
        let mut p = Positions::new(Some("S".into()));
        p.stored(Lsn(0), 1, 3);
        assert!(p.anchor(Lsn(200)).is_none());
    }
}
