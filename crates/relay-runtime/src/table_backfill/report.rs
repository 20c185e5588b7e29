//! A backfill run's progress lines and summary.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use relay_backfill::PageProgress;
use relay_core::pipeline::PipelineStats;

use crate::progress;

/// Where the progress lines go: the log (the relay) or stderr (the command).
pub(super) fn say(log: bool) -> progress::Say {
    if log {
        Arc::new(|line: &str| tracing::info!("{line}"))
    } else {
        progress::stderr()
    }
}

/// What one run did, for the progress lines and the summary.
pub(super) struct Report {
    pub(super) table: String,
    pub(super) started: Instant,
    /// Rows done before this run.
    pub(super) done_before: i64,
    /// The planner's estimate of all rows (over every run).
    pub(super) estimate: Option<i64>,
    pub(super) stats: Arc<PipelineStats>,
    pub(super) progress: Arc<PageProgress>,
}

impl progress::Report for Report {
    fn position(&self) -> (u64, Option<u64>) {
        let (_, done) = self.progress.stored();
        let total = self.estimate.filter(|&t| t > 0);
        (
            u64::try_from(done).unwrap_or(0),
            total.map(|t| u64::try_from(t).unwrap_or(0)),
        )
    }

    fn unit(&self) -> &'static str {
        "rows"
    }

    fn note(&self) -> String {
        format!(
            "published {}, skipped {}",
            self.stats.events_published.load(Ordering::Relaxed),
            self.progress.skipped()
        )
    }

    fn line(&self, what: &str) -> String {
        let (key, done) = self.progress.stored();
        let published = self.stats.events_published.load(Ordering::Relaxed);
        let duplicates = self.stats.duplicates.load(Ordering::Relaxed);
        let dead = self.stats.dead_lettered.load(Ordering::Relaxed);
        let skipped = self.progress.skipped();
        let read = self.progress.read();
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = (published + skipped) as f64 / secs;
        let of = match self.estimate {
            Some(total) if total > 0 => format!(
                " of ~{total} ({:.0}%)",
                (done as f64 * 100.0 / total as f64).min(100.0)
            ),
            _ => String::new(),
        };
        format!(
            "backfill {} {what}: {done}{of} rows done ({} before this run); this run read {read} rows in {secs:.1}s ({rate:.0} rows/s), published {published} ({duplicates} of them already stored: JetStream dropped them as duplicates; {dead} dead-lettered), skipped {skipped} already in the stream or published by the relay; cursor at {}",
            self.table,
            self.done_before,
            key.as_deref().unwrap_or("the start"),
        )
    }
}
