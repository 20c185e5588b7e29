//! `[relay] replay_retention`: the position confirmed to the slot trails the stored checkpoint
//! by a window, so PostgreSQL keeps that WAL for `outbox-relay restore`.
//!
//! The stored checkpoint still advances as without it, and a restart asks the server to start
//! at the checkpoint (START_REPLICATION at an LSN past the slot's confirmed position: the server
//! skips every transaction committed before it), so the window is never sent again. Only the
//! position reported in standby status updates trails.
//!
//! A window in time is measured by the relay's own clock: the slot is confirmed up to the
//! checkpoint as it was stored `window` ago (every transaction committed after that moment
//! commits after that checkpoint, whatever the clocks of the hosts say). A fresh process knows
//! no such checkpoint yet: it starts from a floor the caller found (the position map's newest
//! anchor committed `window` ago, or the slot's own position) and holds the slot there until
//! its own samples are old enough.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::Lsn;

/// Samples of the checkpoint kept over one window, at most (about).
const MAX_SAMPLES: u32 = 4096;

/// How much WAL behind the stored checkpoint the slot keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayRetention {
    /// The WAL of the checkpoints stored in the last this long.
    Time(Duration),
    /// This many bytes of WAL before the checkpoint.
    Bytes(u64),
}

impl std::fmt::Display for ReplayRetention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Time(d) => write!(f, "{}", humantime::format_duration(*d)),
            Self::Bytes(b) => {
                const UNITS: [(&str, u64); 4] = [
                    ("TiB", 1 << 40),
                    ("GiB", 1 << 30),
                    ("MiB", 1 << 20),
                    ("KiB", 1 << 10),
                ];
                match UNITS.iter().find(|(_, unit)| b % unit == 0) {
                    Some((name, unit)) => write!(f, "{}{name}", b / unit),
                    None => write!(f, "{b}B"),
                }
            }
        }
    }
}

/// Where the slot is confirmed, given the stored checkpoint.
#[derive(Debug)]
pub struct SlotTrail {
    retention: ReplayRetention,
    /// Stored checkpoints and when they were stored, oldest first; the front is the newest one
    /// stored at least `window` ago once there is one.
    samples: VecDeque<(Instant, Lsn)>,
    /// Never confirm below this (what is already confirmed, or known `window` old).
    floor: Lsn,
}

impl SlotTrail {
    /// A trail starting at `floor` (at most `checkpoint`), with `checkpoint` stored `now`.
    pub fn new(retention: ReplayRetention, floor: Lsn, checkpoint: Lsn, now: Instant) -> Self {
        let mut samples = VecDeque::new();
        samples.push_back((now, checkpoint));
        Self {
            retention,
            samples,
            floor: floor.min(checkpoint),
        }
    }

    /// The window.
    pub fn retention(&self) -> ReplayRetention {
        self.retention
    }

    /// The position to confirm to the slot now that `checkpoint` is stored (at `now`): never
    /// past the checkpoint, never below an earlier answer.
    pub fn slot_position(&mut self, checkpoint: Lsn, now: Instant) -> Lsn {
        let candidate = match self.retention {
            ReplayRetention::Bytes(bytes) => Lsn(checkpoint.0.saturating_sub(bytes)),
            ReplayRetention::Time(window) => {
                // One sample per 1/MAX_SAMPLES of the window at most (a week at a checkpoint a
                // second would be 600,000): skipping one only keeps a little more WAL.
                let spacing = window / MAX_SAMPLES;
                let due = self.samples.back().is_none_or(|(at, l)| {
                    *l < checkpoint && now.saturating_duration_since(*at) >= spacing
                });
                if due {
                    self.samples.push_back((now, checkpoint));
                }
                let old_enough = |at: &Instant| now.saturating_duration_since(*at) >= window;
                // Drop the front while the next sample is old enough too.
                while self.samples.len() > 1
                    && self.samples.get(1).is_some_and(|(at, _)| old_enough(at))
                {
                    self.samples.pop_front();
                }
                match self.samples.front() {
                    Some((at, lsn)) if old_enough(at) => *lsn,
                    _ => self.floor,
                }
            }
        };
        self.floor = self.floor.max(candidate).min(checkpoint);
        self.floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_trail_the_checkpoint_and_never_pass_it() {
        let now = Instant::now();
        let mut trail = SlotTrail::new(ReplayRetention::Bytes(100), Lsn(0), Lsn(50), now);
        assert_eq!(trail.slot_position(Lsn(50), now), Lsn(0));
        assert_eq!(trail.slot_position(Lsn(1000), now), Lsn(900));
        // Never backwards, even if asked with an older checkpoint.
        assert_eq!(trail.slot_position(Lsn(950), now), Lsn(900));
    }

    #[test]
    fn time_trail_confirms_the_checkpoint_stored_a_window_ago() {
        let start = Instant::now();
        let window = Duration::from_secs(60);
        let mut trail = SlotTrail::new(ReplayRetention::Time(window), Lsn(10), Lsn(100), start);
        // Within the first window: the floor.
        assert_eq!(
            trail.slot_position(Lsn(200), start + Duration::from_secs(30)),
            Lsn(10)
        );
        assert_eq!(
            trail.slot_position(Lsn(300), start + Duration::from_secs(59)),
            Lsn(10)
        );
        // The start's checkpoint is a window old.
        assert_eq!(
            trail.slot_position(Lsn(400), start + Duration::from_secs(60)),
            Lsn(100)
        );
        // 200 was stored at 30 s: a window old at 90 s, 300 (59 s) not yet.
        assert_eq!(
            trail.slot_position(Lsn(500), start + Duration::from_secs(95)),
            Lsn(200)
        );
        assert_eq!(
            trail.slot_position(Lsn(500), start + Duration::from_secs(119)),
            Lsn(300)
        );
        // Idle: nothing new stored, time passes: the trail reaches the last checkpoint.
        assert_eq!(
            trail.slot_position(Lsn(500), start + Duration::from_secs(1000)),
            Lsn(500)
        );
    }

    #[test]
    fn samples_stay_bounded_over_a_long_window() {
        let start = Instant::now();
        let window = Duration::from_secs(3600);
        let mut trail = SlotTrail::new(ReplayRetention::Time(window), Lsn(0), Lsn(1), start);
        // A checkpoint every 100 ms for two windows.
        let mut last = Lsn(0);
        for i in 1..=72_000u64 {
            let now = start + Duration::from_millis(100 * i);
            let at = trail.slot_position(Lsn(i * 10), now);
            assert!(at >= last && at <= Lsn(i * 10));
            // Never confirms a checkpoint stored less than a window ago.
            assert!(
                at.0 <= (i * 10).saturating_sub(36_000 * 10).max(1),
                "at {at} after {i}"
            );
            last = at;
        }
        assert!(
            trail.samples.len() <= MAX_SAMPLES as usize + 2,
            "{}",
            trail.samples.len()
        );
        // And it keeps up: at most one sample spacing (and one window) behind.
        assert!(last.0 >= (72_000 - 36_000 - 10) * 10, "{last}");
    }

    #[test]
    fn a_floor_past_the_checkpoint_is_clamped() {
        let now = Instant::now();
        let window = Duration::from_secs(60);
        let mut trail = SlotTrail::new(ReplayRetention::Time(window), Lsn(500), Lsn(100), now);
        assert_eq!(trail.slot_position(Lsn(100), now), Lsn(100));
    }
}
