//! The WAL rate: from two readings, or a moving rate over a running relay's samples.

use super::*;

/// Where a [`WalRate`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateSource {
    /// Two readings a few seconds apart (`validate --connect`, `status`): a short sample, which
    /// may miss bursts or catch one.
    ShortSample,
    /// The running relay's periodic samples over a moving window.
    Moving,
}

/// How fast the server writes WAL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WalRate {
    /// Bytes per second.
    pub bytes_per_second: f64,
    /// Over how long it was measured.
    pub over: Duration,
    /// How.
    pub source: RateSource,
}

impl WalRate {
    /// From two positions `over` apart (`None` when the WAL went backwards: another server).
    #[must_use]
    pub fn between(from: Lsn, to: Lsn, over: Duration, source: RateSource) -> Option<Self> {
        if over.is_zero() || to < from {
            return None;
        }
        Some(Self {
            bytes_per_second: (to.0 - from.0) as f64 / over.as_secs_f64(),
            over,
            source,
        })
    }

    /// E.g. `1.2 MB/s (a 2s sample)`.
    #[must_use]
    pub fn describe(&self) -> String {
        let over = seconds(self.over.as_secs_f64());
        let how = match self.source {
            RateSource::ShortSample => format!("a {over} sample"),
            RateSource::Moving => format!("moving, over the last {over}"),
        };
        format!("{}/s ({how})", bytes(self.bytes_per_second))
    }
}

/// The WAL rate over the last `window` of periodic position samples (fewer right after the
/// start); the metrics sampler feeds it.
#[derive(Debug, Clone)]
pub struct WalRateTracker {
    window: Duration,
    samples: VecDeque<(Instant, Lsn)>,
}

impl WalRateTracker {
    /// A tracker averaging over `window`.
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Adds the position read at `at`. A position behind the last one (the relay now talks to
    /// another server) starts over.
    pub fn push(&mut self, at: Instant, position: Lsn) {
        if self
            .samples
            .back()
            .is_some_and(|&(_, last)| position < last)
        {
            self.samples.clear();
        }
        self.samples.push_back((at, position));
        // Keep one sample at or before the window's start as the base.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|&(t, _)| at.duration_since(t) >= self.window)
        {
            self.samples.pop_front();
        }
    }

    /// The rate between the oldest and the newest sample kept; `None` before two samples.
    #[must_use]
    pub fn rate(&self) -> Option<WalRate> {
        let (&(t0, p0), &(t1, p1)) = (self.samples.front()?, self.samples.back()?);
        WalRate::between(p0, p1, t1.duration_since(t0), RateSource::Moving)
    }
}
