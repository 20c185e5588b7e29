//! `outbox-relay backfill --table T [--where COND]`: publishes the rows an outbox table already
//! held before the relay's slot existed, beside the running relay, resumably.
//!
//! Each row goes through the relay's own pipeline (route, limits, dead letters, publish with
//! retries, ack frontier) as an Insert of a pgoutput transaction of its page
//! ([`pages::PageSource`]), so it is published exactly as the relay would publish it, plus
//! `Outbox-Backfill: true`. The cursor (`outbox_relay.backfill`) moves over a page only after
//! JetStream acknowledged every row up to it, so a killed backfill resumes at its cursor and
//! re-sends at most the unacknowledged tail (deduplicated by event id). See docs/replay.md.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use relay_core::Lsn;
use relay_core::pipeline::{Pipeline, PipelineError, PipelineStats};
use relay_core::route::{OutboxTableConfig, Router};
use relay_core::stage::ErrorClass;
use relay_nats::JetStreamPublisher;
use relay_postgres::backfill::{self as sql, BackfillError, CursorId, KeySource};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::exit::{Exit, ExitKind};
use crate::run::{nats_exit, pg_exit};

mod pages;
mod publish;

use pages::{CursorStore, PageReader, PageSource, Progress};
use publish::{BackfillPublisher, StreamIds, stream_ids, watch_live};

/// How long counting the rows to backfill may take before the planner's estimate is used.
const COUNT_FOR: Duration = Duration::from_secs(5);

/// `outbox-relay backfill`'s options.
#[derive(Debug, clap::Args)]
pub struct BackfillArgs {
    /// The outbox table, `schema.table` or `table` (in `public`), as in `[[outbox]] table`.
    #[arg(long)]
    pub table: String,
    /// Only rows matching this SQL condition on the table, e.g.
    /// "created_at > now() - interval '7 days'". Each filter has its own cursor.
    #[arg(long = "where", value_name = "CONDITION")]
    pub filter: Option<String>,
    /// Rows per page (one SELECT each, on a connection of the backfill's own).
    #[arg(long, default_value_t = 500)]
    pub page_size: usize,
    /// Messages published and not yet acknowledged by JetStream, at most.
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: usize,
    /// Rows per second at most; 0: as fast as JetStream acknowledges.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Start from the first row again, even when a stored cursor says the backfill is under
    /// way or finished.
    #[arg(long)]
    pub restart: bool,
    /// Before publishing, read the event ids the stream holds for the table (headers only) and
    /// skip those rows, when the stream holds at most this many messages; also skip rows the
    /// relay publishes while the backfill runs. 0: neither.
    #[arg(long, default_value_t = 500_000)]
    pub skip_check_limit: u64,
    /// How often to print progress on stderr.
    #[arg(long, default_value = "5s", value_parser = crate::humantime_duration)]
    pub progress_interval: Duration,
}

fn backfill_exit(error: BackfillError) -> Exit {
    let kind = match &error {
        e if e.is_transient() => ExitKind::Unavailable,
        BackfillError::Query { .. } => ExitKind::Internal,
        _ => ExitKind::Config,
    };
    Exit::new(kind, error)
}

fn class_kind(class: ErrorClass) -> ExitKind {
    match class {
        ErrorClass::Transient => ExitKind::Unavailable,
        ErrorClass::Fatal => ExitKind::Config,
        ErrorClass::SlotLost => ExitKind::DataSafety,
    }
}

/// The `[[outbox]]` mapping of `table` (`schema.table` or `table`).
fn mapping<'a>(config: &'a RelayConfig, table: &str) -> Result<&'a OutboxTableConfig, Exit> {
    let wanted = table.split_once('.').unwrap_or(("public", table));
    config
        .outbox
        .iter()
        .find(|o| o.qualified_name() == wanted)
        .ok_or_else(|| {
            let configured: Vec<String> = config
                .outbox
                .iter()
                .map(|o| {
                    let (s, t) = o.qualified_name();
                    format!("{s}.{t}")
                })
                .collect();
            Exit::config(anyhow!(
                "table `{}.{}` is not configured as an outbox table (configured: {}): add an [[outbox]] entry for it, or name one of those",
                wanted.0,
                wanted.1,
                configured.join(", ")
            ))
        })
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

impl Report {
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

/// Runs one backfill of `args.table` until it finished, was stopped, or failed.
pub async fn backfill(config: &RelayConfig, args: BackfillArgs) -> Result<(), Exit> {
    if args.page_size == 0 || args.max_in_flight == 0 {
        return Err(Exit::config(anyhow!(
            "--page-size and --max-in-flight must be at least 1"
        )));
    }
    let mapping = mapping(config, &args.table)?.clone();
    let (schema, table) = mapping.qualified_name();
    let filter = args
        .filter
        .as_deref()
        .map(str::trim)
        .filter(|f| !f.is_empty());
    let shutdown = CancellationToken::new();
    crate::signals::spawn_handler(
        shutdown.clone(),
        "stop requested: waiting for outstanding acks, then storing the cursor",
        "second signal: exiting now; the next run re-sends what was not acknowledged",
    );

    // PostgreSQL: a read-only session for the pages, one for the cursor.
    let pg = &config.postgres;
    let reader = sql::connect_reader(pg).await.map_err(pg_exit)?;
    let cursor_client = relay_postgres::connect(pg).await.map_err(pg_exit)?;
    sql::prepare_cursor_session(&cursor_client)
        .await
        .map_err(backfill_exit)?;
    let slot = relay_postgres::catalog::slot(&reader, &pg.slot)
        .await
        .map_err(|e| Exit::new(ExitKind::Unavailable, e))?;
    if slot.is_none() {
        return Err(Exit::config(anyhow!(
            "replication slot `{}` does not exist: start the relay (or run `outbox-relay setup`) first. The backfill publishes the rows committed before it starts; rows committed later are the relay's, and without its slot they would be published by neither",
            pg.slot
        )));
    }
    let shape = sql::table_shape(&reader, schema, table, &mapping.event_id, &pg.publication)
        .await
        .map_err(backfill_exit)?;
    if !shape.in_publication {
        tracing::warn!(table = %shape.table, publication = %pg.publication, "the table is not in the publication: the live relay does not publish its new rows");
    }
    // The mapping must fit the table before anything is read: the same check the relay makes
    // on the table's Relation message.
    let mut check = Router::new(std::slice::from_ref(&mapping)).map_err(Exit::config)?;
    check
        .on_relation(shape.relation.clone(), None)
        .map_err(|e| {
            Exit::config(
                anyhow::Error::new(e).context("the [[outbox]] mapping does not fit the table"),
            )
        })?;
    if let Some(filter) = filter {
        shape
            .check_filter(&reader, filter)
            .await
            .map_err(backfill_exit)?;
    }
    let nulls = shape
        .null_keys(&reader, filter)
        .await
        .map_err(backfill_exit)?;
    if nulls > 0 {
        return Err(Exit::new(
            ExitKind::DataSafety,
            anyhow!(
                "{nulls} rows of {} have a NULL event id (`{}`): no message can be built for them (the relay refuses such rows too). Fix or delete them, or leave them out with --where \"{} IS NOT NULL\"",
                shape.table,
                shape.key.name,
                shape.key.name
            ),
        ));
    }

    // The cursor: resume, or start from the first row.
    let id = CursorId {
        slot: pg.slot.clone(),
        table: shape.table.clone(),
        filter: filter.unwrap_or_default().to_owned(),
    };
    let described = match filter {
        Some(f) => format!("{} (where {f})", shape.table),
        None => shape.table.clone(),
    };
    let stored = sql::load_cursor(&cursor_client, &id)
        .await
        .map_err(backfill_exit)?
        .filter(|_| !args.restart);
    let (after, end, done_before, estimate) = match stored {
        Some(c) if c.finished_at.is_some() => {
            eprintln!(
                "backfill {described} finished at {}: {} rows; --restart runs it again",
                c.finished_at.as_deref().unwrap_or("?"),
                c.rows_done
            );
            return Ok(());
        }
        Some(c) if c.key_column != shape.key.name => {
            return Err(Exit::config(anyhow!(
                "the stored backfill cursor of {described} pages by column `{}`, the table's key is now `{}`: rerun with --restart",
                c.key_column,
                shape.key.name
            )));
        }
        Some(c) => {
            tracing::info!(
                table = %shape.table,
                filter = filter.unwrap_or(""),
                rows_done = c.rows_done,
                started_at = %c.started_at,
                "resuming at {}: {} rows done by an earlier run",
                c.last_key.as_deref().unwrap_or("the first row"),
                c.rows_done
            );
            (c.last_key, c.end_key, c.rows_done, c.rows_estimate)
        }
        None => {
            let end = shape
                .last_key(&reader, filter)
                .await
                .map_err(backfill_exit)?;
            let estimate = match &end {
                Some(end) => shape
                    .count_rows(&reader, filter, None, end, COUNT_FOR)
                    .await
                    .map_err(backfill_exit)?
                    .map(|(n, _)| i64::try_from(n).unwrap_or(i64::MAX)),
                None => Some(0),
            };
            sql::start_cursor(
                &cursor_client,
                &id,
                &shape.key.name,
                end.as_deref(),
                estimate,
            )
            .await
            .map_err(backfill_exit)?;
            tracing::info!(
                table = %shape.table,
                filter = filter.unwrap_or(""),
                key = %shape.key.name,
                key_is = match shape.key.source {
                    KeySource::PrimaryKey => "primary key",
                    KeySource::UniqueEventId => "event id (unique index)",
                },
                last_key = end.as_deref().unwrap_or("none"),
                rows_estimate = ?estimate,
                "starting from the first row"
            );
            (None, end, 0, estimate)
        }
    };
    let Some(end) = end else {
        sql::finish_cursor(&cursor_client, &id)
            .await
            .map_err(backfill_exit)?;
        eprintln!("backfill {described} finished: no rows to backfill");
        return Ok(());
    };

    // JetStream: the relay's stream checks, then what the stream holds already.
    let nats = relay_nats::connect(&config.nats).await.map_err(nats_exit)?;
    let publisher = JetStreamPublisher::new(
        &nats,
        &config.nats.stream,
        config.nats.ack_timeout,
        args.max_in_flight,
    );
    let report = relay_nats::prepare_stream(
        publisher.jetstream(),
        &config.nats,
        &config.sample_subjects(),
        &config.broker_needs(),
    )
    .await
    .map_err(nats_exit)?;
    // First the watch of the relay's live messages, then the stream's ids: no gap between.
    let (live, watchers) = if args.skip_check_limit == 0 {
        Default::default()
    } else {
        watch_live(nats.client(), &report.subjects, &shape.table).await
    };
    let skip = if args.skip_check_limit == 0 {
        Default::default()
    } else {
        match stream_ids(
            publisher.jetstream(),
            &config.nats.stream,
            &shape.table,
            args.skip_check_limit,
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
                    limit = args.skip_check_limit,
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
            filter: filter.map(str::to_owned),
            after,
            end,
            page_size: args.page_size,
            rate: args.rate,
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
    pipeline_config.max_in_flight = args.max_in_flight;
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
    let ticker = {
        let report = report.clone();
        let every = args.progress_interval.max(Duration::from_millis(100));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                eprintln!("{}", report.line("in progress"));
            }
        })
    };
    let result = pipeline.run(shutdown.cancelled()).await;
    ticker.abort();
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
            eprintln!("{}", report.line("finished"));
            Ok(())
        }
        Ok(outcome) if shutdown.is_cancelled() => {
            eprintln!("{}", report.line("stopped"));
            Err(Exit::new(
                ExitKind::Interrupted,
                anyhow!(
                    "backfill of {described} stopped on request at {cursor} ({} unacknowledged messages abandoned); run the same command again to resume there",
                    outcome.abandoned
                ),
            ))
        }
        Ok(outcome) => {
            eprintln!("{}", report.line("incomplete"));
            Err(Exit::new(
                ExitKind::Unavailable,
                anyhow!(
                    "backfill of {described} ended with {} messages unacknowledged; the cursor stays at {cursor}: run the same command again to resume there",
                    outcome.abandoned
                ),
            ))
        }
        Err(error) => {
            eprintln!("{}", report.line("failed"));
            let kind = match &error {
                PipelineError::Route { .. } | PipelineError::Publish { .. } => ExitKind::DataSafety,
                PipelineError::Schema { .. } => ExitKind::Config,
                PipelineError::Source(e) => class_kind(e.class),
                PipelineError::Store { error, .. } => class_kind(error.class),
                PipelineError::Protocol(_) => ExitKind::Internal,
            };
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
