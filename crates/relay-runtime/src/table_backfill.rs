//! One backfill run over a table's pages, after its cursor was read or started: shared by
//! `outbox-relay backfill` and the relay's backfill at slot creation (`backfill =
//! "on-create"`, [`crate::relay`]). The stages are the libraries': relay-postgres'
//! [`PageSource`] and [`CursorStore`], relay-nats' [`JetStreamPublisher::for_backfill`], in relay-core's
//! [`Pipeline`] with the relay's delivery rule; this module builds them, runs them and says
//! how the run ended.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use relay_backfill::{CursorId, CursorStore, PageProgress, PageReader, PageSource, TableShape};
use relay_core::Lsn;
use relay_core::id_digest::IdDigest;
use relay_core::pipeline::{Pipeline, PipelineError, PipelineStats, RunOutcome};
use relay_core::route::OutboxTableConfig;
use relay_nats::{JetStreamPublisher, NatsConnection, PublishMode, StreamReport};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind};
use crate::progress::{Mode, Ticker};

mod checks;
mod live;
mod report;
mod request;

pub use checks::{backfill_exit, checked_shape, mapping};
use live::LiveWatch;
use report::{Report, say};
pub use request::{BackfillOutcome, BackfillRequest, backfill};

/// How a run reads and publishes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Rows per page.
    pub page_size: usize,
    /// Messages published and not yet acknowledged, at most.
    pub max_in_flight: usize,
    /// Rows per second at most (0: no limit).
    pub rate: u64,
    /// Read the stream's event ids for the table when it holds at most this many messages.
    pub skip_check_limit: u64,
    /// How often to report progress.
    pub progress_interval: Duration,
    /// Report progress in the log (the relay) instead of on stderr (the command).
    pub log_progress: bool,
    /// A bar or lines (the relay's log: always lines).
    pub progress_mode: Mode,
}

/// What a run reads: the table, its cursor and where the pages are.
#[derive(Debug)]
pub struct TableRun<'a> {
    pub config: &'a RelayConfig,
    pub mapping: OutboxTableConfig,
    pub shape: TableShape,
    /// The read session (for an on-create backfill, inside the slot's snapshot).
    pub reader: Arc<tokio_postgres::Client>,
    pub cursor_client: tokio_postgres::Client,
    pub id: CursorId,
    /// The table (and filter) as progress lines name it.
    pub described: String,
    /// A condition on the rows (`--where`), `None` for all.
    pub page_filter: Option<String>,
    /// The stored cursor (`None`: from the first row).
    pub after: Option<String>,
    /// The last key to read.
    pub end: String,
    pub done_before: i64,
    pub estimate: Option<i64>,
    /// The WAL position after the read snapshot, when the pages are read in a snapshot of their
    /// own beside the running relay: its live messages are watched until its checkpoint reaches
    /// it. `None`: watched for the whole run.
    pub live_until: Option<Lsn>,
}

/// Publishes the pages of `run` through the relay's pipeline until the last key, a stop
/// (`shutdown`) or an error; marks the cursor finished when every row was acknowledged.
/// Returns how many rows went to the dead-letter subject instead.
pub async fn run_pages(
    run: TableRun<'_>,
    opts: &RunOptions,
    shutdown: &CancellationToken,
) -> Result<u64, Failure> {
    let config = run.config;
    // Per message whatever `publish_mode` says: a page is not a transaction to keep whole
    // (atomic batches would only cost the server a staging store per page), and fast batches'
    // acks do not tell which rows JetStream dropped as duplicates, which the summary reports;
    // they were not faster either (docs/benchmarks.md).
    let (nats, publisher, stream) =
        crate::broker::connect_publisher(config, opts.max_in_flight, PublishMode::PerMessage)
            .await?;
    let (watch, skip) = if opts.skip_check_limit == 0 {
        (LiveWatch::none(), HashSet::new())
    } else {
        known_ids(&run, opts, &nats, &publisher, &stream).await
    };

    let stats = Arc::new(PipelineStats::default());
    let progress = Arc::new(PageProgress::new(run.after.clone(), run.done_before));
    let source = PageSource::start(
        PageReader {
            client: run.reader,
            shape: run.shape.clone(),
            filter: run.page_filter,
            after: run.after,
            end: run.end,
            page_size: opts.page_size,
            rate: opts.rate,
            rows_done: run.done_before,
            skip,
            live: watch.ids.clone(),
        },
        progress.clone(),
    );
    let store = CursorStore::new(run.cursor_client, run.id, progress.clone());
    let mut pipeline_config = config.relay.pipeline_config();
    pipeline_config.max_in_flight = opts.max_in_flight;
    // Pages of rows the stream already held carry no message; store them as often as others.
    pipeline_config.idle_checkpoint_interval = pipeline_config.checkpoint_interval;
    let router = config.router_for(&run.mapping).map_err(Failure::config)?;
    let mut pipeline = Pipeline::new(
        source,
        publisher.for_backfill(),
        store,
        router,
        Lsn(0),
        pipeline_config,
        stats.clone(),
    );
    let report = Arc::new(Report {
        table: run.described.clone(),
        started: Instant::now(),
        done_before: run.done_before,
        estimate: run.estimate,
        stats: stats.clone(),
        progress: progress.clone(),
    });
    let shown = Ticker::start(
        opts.progress_mode,
        opts.progress_interval,
        report,
        say(opts.log_progress),
    );
    let result = pipeline.run(shutdown.cancelled()).await;
    let dead_lettered = stats
        .dead_lettered
        .load(std::sync::atomic::Ordering::Relaxed);
    watch.end();
    let (_, _, store) = pipeline.into_parts();
    let ended = Ended {
        described: &run.described,
        progress: &progress,
        store: &store,
        shown: &shown,
    };
    ended.exit(result, shutdown).await?;
    Ok(dead_lettered)
}

/// The rows to leave out: first the watch of the relay's live messages, then the stream's ids,
/// so that there is no gap between.
async fn known_ids(
    run: &TableRun<'_>,
    opts: &RunOptions,
    nats: &NatsConnection,
    publisher: &JetStreamPublisher,
    stream: &StreamReport,
) -> (LiveWatch, HashSet<IdDigest>) {
    let config = run.config;
    let watch = LiveWatch::start(
        &config.postgres,
        nats.client(),
        stream,
        &run.shape.table,
        run.live_until,
    )
    .await;
    let skip = live::stream_ids(
        publisher.jetstream(),
        &config.nats.stream,
        &run.shape.table,
        opts.skip_check_limit,
        stream.duplicate_window,
    )
    .await;
    (watch, skip)
}

/// A run that ended, for its summary and exit.
struct Ended<'a> {
    described: &'a str,
    progress: &'a PageProgress,
    store: &'a CursorStore,
    shown: &'a Ticker,
}

impl Ended<'_> {
    /// Marks the cursor finished when every row was acknowledged; otherwise the exit that says
    /// where the cursor stays and how to resume.
    async fn exit(
        &self,
        result: Result<RunOutcome, PipelineError>,
        shutdown: &CancellationToken,
    ) -> Result<(), Failure> {
        let described = self.described;
        let (cursor, _) = self.progress.stored();
        let cursor = cursor.unwrap_or_else(|| "the first row".into());
        match result {
            Ok(outcome)
                if outcome.abandoned == 0 && self.progress.complete_at(outcome.confirmed) =>
            {
                self.store.finish().await.map_err(backfill_exit)?;
                self.shown.finish("finished");
                Ok(())
            }
            Ok(outcome) if shutdown.is_cancelled() => {
                self.shown.finish("stopped");
                Err(Failure::new(
                    FailureKind::Interrupted,
                    anyhow!(
                        "backfill of {described} stopped on request at {cursor} ({} unacknowledged messages abandoned); run the same command again to resume there",
                        outcome.abandoned
                    ),
                ))
            }
            Ok(outcome) => {
                self.shown.finish("incomplete");
                Err(Failure::new(
                    FailureKind::Unavailable,
                    anyhow!(
                        "backfill of {described} ended with {} messages unacknowledged; the cursor stays at {cursor}: run the same command again to resume there",
                        outcome.abandoned
                    ),
                ))
            }
            Err(error) => {
                self.shown.finish("failed");
                let kind = crate::failure::pipeline_failure_kind(&error);
                let advice = if kind == FailureKind::DataSafety {
                    "before this row. Fix the row or the mapping (or set [relay] dead_letter_subject) and run the same command again: it resumes there"
                } else {
                    "run the same command again once the cause is fixed: it resumes there"
                };
                Err(Failure::new(
                    kind,
                    anyhow::Error::new(error).context(format!(
                        "backfill of {described} stopped; the cursor stays at {cursor}, {advice}"
                    )),
                ))
            }
        }
    }
}
