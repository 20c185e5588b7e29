//! One backfill run over a table's pages, after its cursor was read or started: shared by
//! `outbox-relay backfill` and the relay's backfill at slot creation (`backfill =
//! "on-create"`, [`crate::run`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use relay_core::Lsn;
use relay_core::pipeline::{Pipeline, PipelineStats};
use relay_core::route::{OutboxTableConfig, Router};
use relay_nats::PublishMode;
use relay_postgres::backfill::{self as sql, CursorId, TableShape};
use tokio_util::sync::CancellationToken;

use super::backfill_exit;
use super::pages::{CursorStore, PageReader, PageSource, Progress};
use super::publish::{
    BackfillPublisher, StreamIds, end_watch_when_relay_passes, stream_ids, watch_live,
};
use crate::commands::progress::{self, Mode, Ticker};
use crate::config::RelayConfig;
use crate::exit::{Exit, ExitKind};

/// How a run reads and publishes.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    /// Rows per page.
    pub(crate) page_size: usize,
    /// Messages published and not yet acknowledged, at most.
    pub(crate) max_in_flight: usize,
    /// Rows per second at most (0: no limit).
    pub(crate) rate: u64,
    /// Read the stream's event ids for the table when it holds at most this many messages.
    pub(crate) skip_check_limit: u64,
    /// How often to report progress.
    pub(crate) progress_interval: Duration,
    /// Report progress in the log (the relay) instead of on stderr (the command).
    pub(crate) log_progress: bool,
    /// A bar or lines (the relay's log: always lines).
    pub(crate) progress_mode: Mode,
}

/// What a run reads: the table, its cursor and where the pages are.
pub(crate) struct TableRun<'a> {
    pub(crate) config: &'a RelayConfig,
    pub(crate) mapping: OutboxTableConfig,
    pub(crate) shape: TableShape,
    /// The read session (for an on-create backfill, inside the slot's snapshot).
    pub(crate) reader: Arc<tokio_postgres::Client>,
    pub(crate) cursor_client: tokio_postgres::Client,
    pub(crate) id: CursorId,
    /// The table (and filter) as progress lines name it.
    pub(crate) described: String,
    /// A condition on the rows (`--where`), `None` for all.
    pub(crate) page_filter: Option<String>,
    /// The stored cursor (`None`: from the first row).
    pub(crate) after: Option<String>,
    /// The last key to read.
    pub(crate) end: String,
    pub(crate) done_before: i64,
    pub(crate) estimate: Option<i64>,
    /// The WAL position after the read snapshot, when the pages are read in a snapshot of their
    /// own beside the running relay: its live messages are watched until its checkpoint reaches
    /// it. `None`: watched for the whole run.
    pub(crate) live_until: Option<Lsn>,
}

/// Where the progress lines go: the log (the relay) or stderr (the command).
fn say(log: bool) -> progress::Say {
    if log {
        Arc::new(|line: &str| tracing::info!("{line}"))
    } else {
        progress::stderr()
    }
}

/// What one run did, for the progress lines and the summary.
struct Report {
    table: String,
    started: Instant,
    /// Rows done before this run.
    done_before: i64,
    /// The planner's estimate of all rows (over every run).
    estimate: Option<i64>,
    stats: Arc<PipelineStats>,
    progress: Arc<Progress>,
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
            self.progress.skipped.load(Ordering::Relaxed)
        )
    }

    fn line(&self, what: &str) -> String {
        let (key, done) = self.progress.stored();
        let published = self.stats.events_published.load(Ordering::Relaxed);
        let duplicates = self.stats.duplicates.load(Ordering::Relaxed);
        let dead = self.stats.dead_lettered.load(Ordering::Relaxed);
        let skipped = self.progress.skipped.load(Ordering::Relaxed);
        let read = self.progress.read.load(Ordering::Relaxed);
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

/// Publishes the pages of `run` through the relay's pipeline until the last key, a stop
/// (`shutdown`) or an error; marks the cursor finished when every row was acknowledged.
pub(crate) async fn run_pages(
    run: TableRun<'_>,
    opts: &RunOptions,
    shutdown: &CancellationToken,
) -> Result<(), Exit> {
    let TableRun {
        config,
        mapping,
        shape,
        reader,
        cursor_client,
        id,
        described,
        page_filter,
        after,
        end,
        done_before,
        estimate,
        live_until,
    } = run;
    // JetStream: the relay's stream checks, then what the stream holds already.
    // Per message whatever `publish_mode` says: a page is not a transaction to keep whole
    // (atomic batches would only cost the server a staging store per page), and fast batches'
    // acks do not tell which rows JetStream dropped as duplicates, which the summary reports;
    // they were not faster either (docs/benchmarks.md).
    let (nats, publisher, report) =
        crate::broker::connect_publisher(config, opts.max_in_flight, PublishMode::PerMessage)
            .await?;
    // First the watch of the relay's live messages, then the stream's ids: no gap between.
    let watch_stop = CancellationToken::new();
    let (live, watchers) = if opts.skip_check_limit == 0 {
        Default::default()
    } else {
        let watch = watch_live(nats.client(), &report.subjects, &shape.table, &watch_stop).await;
        if let Some(snapshot_lsn) = live_until {
            tokio::spawn(end_watch_when_relay_passes(
                config.postgres.clone(),
                snapshot_lsn,
                nats.client().clone(),
                watch_stop.clone(),
            ));
        }
        watch
    };
    let skip = if opts.skip_check_limit == 0 {
        Default::default()
    } else {
        match stream_ids(
            publisher.jetstream(),
            &config.nats.stream,
            &shape.table,
            opts.skip_check_limit,
        )
        .await
        {
            Ok(StreamIds::Read(ids)) => {
                tracing::info!(
                    stream = %config.nats.stream,
                    events = ids.len(),
                    "read the event ids the stream holds for the table: those rows are skipped"
                );
                ids
            }
            Ok(StreamIds::TooLarge(messages)) => {
                tracing::warn!(
                    stream = %config.nats.stream,
                    messages,
                    limit = opts.skip_check_limit,
                    duplicate_window = ?report.duplicate_window,
                    "the stream is too large to read its event ids: a row it already holds is dropped by JetStream only if stored within the duplicate window, else stored again (consumers dedupe by event id); raise --skip-check-limit to read them"
                );
                Default::default()
            }
            // E.g. no permission to create a consumer: the check is lost, not the backfill.
            Err(e) => {
                tracing::warn!(
                    stream = %config.nats.stream,
                    error = %e,
                    duplicate_window = ?report.duplicate_window,
                    "cannot read the stream's event ids: a row it already holds is dropped by JetStream only if stored within the duplicate window, else stored again (consumers dedupe by event id)"
                );
                Default::default()
            }
        }
    };

    let stats = Arc::new(PipelineStats::default());
    let progress = Arc::new(Progress::new(after.clone(), done_before));
    let source = PageSource::start(
        PageReader {
            client: reader,
            shape: shape.clone(),
            filter: page_filter,
            after,
            end,
            page_size: opts.page_size,
            rate: opts.rate,
            rows_done: done_before,
            skip,
            live,
        },
        progress.clone(),
    );
    let store = CursorStore {
        client: cursor_client,
        id: id.clone(),
        progress: progress.clone(),
    };
    let mut pipeline_config = config.relay.pipeline_config();
    pipeline_config.max_in_flight = opts.max_in_flight;
    // Pages of rows the stream already held carry no message; store them as often as others.
    pipeline_config.idle_checkpoint_interval = pipeline_config.checkpoint_interval;
    let router = Router::new(std::slice::from_ref(&mapping)).map_err(Exit::config)?;
    let mut pipeline = Pipeline::new(
        source,
        BackfillPublisher(publisher),
        store,
        router,
        Lsn(0),
        pipeline_config,
        stats.clone(),
    );
    let report = Arc::new(Report {
        table: described.clone(),
        started: Instant::now(),
        done_before,
        estimate,
        stats,
        progress: progress.clone(),
    });
    let shown = Ticker::start(
        opts.progress_mode,
        opts.progress_interval,
        report,
        say(opts.log_progress),
    );
    let result = pipeline.run(shutdown.cancelled()).await;
    watch_stop.cancel();
    for watcher in watchers {
        watcher.abort();
    }
    let (_, _, store) = pipeline.into_parts();
    let (cursor, _) = progress.stored();
    let cursor = cursor.unwrap_or_else(|| "the first row".into());
    match result {
        Ok(outcome)
            if progress.exhausted.load(Ordering::Relaxed)
                && outcome.abandoned == 0
                && outcome.confirmed.0 == progress.last_page.load(Ordering::Relaxed) =>
        {
            sql::finish_cursor(&store.client, &id)
                .await
                .map_err(backfill_exit)?;
            shown.finish("finished");
            Ok(())
        }
        Ok(outcome) if shutdown.is_cancelled() => {
            shown.finish("stopped");
            Err(Exit::new(
                ExitKind::Interrupted,
                anyhow!(
                    "backfill of {described} stopped on request at {cursor} ({} unacknowledged messages abandoned); run the same command again to resume there",
                    outcome.abandoned
                ),
            ))
        }
        Ok(outcome) => {
            shown.finish("incomplete");
            Err(Exit::new(
                ExitKind::Unavailable,
                anyhow!(
                    "backfill of {described} ended with {} messages unacknowledged; the cursor stays at {cursor}: run the same command again to resume there",
                    outcome.abandoned
                ),
            ))
        }
        Err(error) => {
            shown.finish("failed");
            let kind = crate::commands::pipeline_exit_kind(&error);
            let advice = if kind == ExitKind::DataSafety {
                "before this row. Fix the row or the mapping (or set [relay] dead_letter_subject) and run the same command again: it resumes there"
            } else {
                "run the same command again once the cause is fixed: it resumes there"
            };
            Err(Exit::new(
                kind,
                anyhow::Error::new(error).context(format!(
                    "backfill of {described} stopped; the cursor stays at {cursor}, {advice}"
                )),
            ))
        }
    }
}
