//! Restore: publishes again, from the WAL PostgreSQL still keeps for the relay's slot (`[relay]
//! replay_retention`), the events committed from an LSN that the stream no longer holds
//! (purged, deleted and re-created, lost with a broker volume). Shared by `outbox-relay
//! restore` and the `restore` signal from SQL.
//!
//! It decodes from a copy of the slot (`<slot>_restore`, `pg_copy_logical_replication_slot`),
//! started at `X`: the server skips every transaction committed before it. The events go
//! through the relay's own pipeline (route, limits, dead letters, publish with retries), so
//! each message is the one the live relay built (`Nats-Msg-Id`, headers, payload). Ids the
//! stream still holds for the window are skipped. It stops before the first transaction
//! committed at or after the stored checkpoint (or `--to-lsn`): what comes later is the live
//! relay's. The main slot and the stored checkpoint are never touched; the copy is dropped at
//! the end, and a copy a killed restore left is dropped at the next start. See docs/replay.md.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use relay_core::Lsn;
use relay_core::pipeline::{Pipeline, PipelineError, PipelineStats, RunOutcome};
use relay_core::route::Router;
use relay_core::stage::{DryRunPublisher, NoStore, Publisher, WouldPublish};
use relay_nats::RestoreCheck;
use relay_postgres::catalog;
use relay_postgres::catalog::restore_slot::{SlotCopy, SlotCopyError};
use relay_postgres::{PgSource, WindowSource};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind, class_kind, nats_failure, pg_failure};
use crate::progress::{self, Mode, Say, Ticker};

mod verify;
use crate::routing::RouterError;
pub use verify::{VerifyReport, verify};

/// How long dropping the copy waits for the walsender that streamed it to let go.
const DROP_WAIT: Duration = Duration::from_secs(10);

/// One restore.
#[derive(Clone)]
pub struct RestoreRequest {
    /// Restore the events committed at or after this commit LSN.
    pub from_lsn: Lsn,
    /// Stop before the events committed at or after this one (default and at most: the
    /// relay's stored checkpoint).
    pub to_lsn: Option<Lsn>,
    /// Decode and route the window, say what would be published; publish nothing.
    pub dry_run: bool,
    /// Messages published and not yet acknowledged by JetStream, at most.
    pub max_in_flight: usize,
    /// How often progress is said, and how (a bar or lines).
    pub progress_interval: Duration,
    pub progress_mode: Mode,
    /// Where notes and progress lines go (stderr for the command, the log for a signal).
    pub say: Say,
    /// With `dry_run`: where the events the stream lacks are written down (`verify`).
    pub would_publish: Option<Arc<WouldPublish>>,
}

impl std::fmt::Debug for RestoreRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreRequest")
            .field("from_lsn", &self.from_lsn)
            .field("to_lsn", &self.to_lsn)
            .field("dry_run", &self.dry_run)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

fn query_exit(what: String) -> impl FnOnce(tokio_postgres::Error) -> Failure {
    move |e| {
        let kind = if relay_postgres::is_transient_query_error(&e) {
            FailureKind::Unavailable
        } else {
            FailureKind::Internal
        };
        Failure::new(kind, anyhow::Error::new(e).context(what))
    }
}

/// The window and where restore can start at all.
struct Window {
    from: Lsn,
    end: Lsn,
    copy: SlotCopy,
}

/// Progress, shared with the ticker.
struct Report {
    window: (Lsn, Lsn),
    started: Instant,
    reached: Arc<AtomicU64>,
    stats: Arc<PipelineStats>,
    dry_run: bool,
}

impl Report {
    fn reached(&self) -> Lsn {
        Lsn(self.reached.load(Ordering::Relaxed).max(self.window.0.0))
    }
}

impl progress::Report for Report {
    fn position(&self) -> (u64, Option<u64>) {
        let (from, end) = self.window;
        (
            self.reached().0.saturating_sub(from.0),
            Some(end.0.saturating_sub(from.0).max(1)),
        )
    }

    fn unit(&self) -> &'static str {
        "WAL bytes"
    }

    fn note(&self) -> String {
        format!(
            "at {}, published {}, skipped {}",
            self.reached(),
            self.stats.events_published.load(Ordering::Relaxed),
            self.stats.already_published.load(Ordering::Relaxed)
        )
    }

    fn line(&self, what: &str) -> String {
        let (from, end) = self.window;
        let reached = self.reached();
        let span = end.0.saturating_sub(from.0).max(1);
        let pct = (reached.0.saturating_sub(from.0) as f64 * 100.0 / span as f64).min(100.0);
        let published = self.stats.events_published.load(Ordering::Relaxed);
        let duplicates = self.stats.duplicates.load(Ordering::Relaxed);
        let skipped = self.stats.already_published.load(Ordering::Relaxed);
        let dead = self.stats.dead_lettered.load(Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let verb = if self.dry_run {
            "would publish"
        } else {
            "published"
        };
        format!(
            "restore {from}..{end} {what}: at commit LSN {reached} ({pct:.0}% of the window's WAL), {verb} {published} ({duplicates} dropped by JetStream as duplicates, {dead} dead-lettered), skipped {skipped} still in the stream; {secs:.1}s ({:.0} events/s)",
            (published + skipped) as f64 / secs
        )
    }
}

/// Runs one restore until it finished, was stopped (`shutdown`) or failed; its summary, or
/// `None` when there was nothing to restore.
pub async fn restore(
    config: &RelayConfig,
    args: &RestoreRequest,
    shutdown: &CancellationToken,
) -> Result<Option<String>, Failure> {
    if args.max_in_flight == 0 {
        return Err(Failure::config(anyhow!(
            "the messages in flight must be at least 1"
        )));
    }
    let pg = &config.postgres;
    let (client, server) = relay_postgres::connect_primary(pg)
        .await
        .map_err(pg_failure)?;
    let window = prepare(&client, config, args).await?;
    let Some(window) = window else {
        return Ok(None);
    };
    let result = run_window(config, args, &server, &client, &window, shutdown).await;
    // The copy pins WAL: drop it whatever happened (a kill leaves it to the next run).
    let name = window.copy.name().to_owned();
    match window.copy.drop(&client, DROP_WAIT).await {
        Ok(()) => tracing::info!(copy = %name, "dropped the restore's copy of the slot"),
        Err(e) => {
            tracing::warn!(copy = %name, error = %e, "cannot drop the restore's copy of the slot; it keeps WAL until dropped: SELECT pg_drop_replication_slot('{name}') (the next restore drops it too)")
        }
    }
    result.map(Some)
}

/// Checks the slot and the window, drops a copy a killed restore left, and makes the copy.
/// `None`: nothing to restore.
async fn prepare(
    client: &tokio_postgres::Client,
    config: &RelayConfig,
    args: &RestoreRequest,
) -> Result<Option<Window>, Failure> {
    let slot = config.postgres.slot.as_str();
    let Some((from, end, checkpoint)) = window_bounds(client, slot, args).await? else {
        return Ok(None);
    };
    let copy = SlotCopy::make(client, slot, DROP_WAIT)
        .await
        .map_err(slot_copy_exit)?;
    let copy = require_kept(client, config, copy, from).await?;
    let name = copy.name();
    (args.say)(&format!(
        "restore of the events committed in [{from}, {end}) of slot {slot} (stored checkpoint {checkpoint}), decoded from its copy {name}{}",
        if args.dry_run {
            "; dry run: nothing is published"
        } else {
            ""
        }
    ));
    Ok(Some(Window { from, end, copy }))
}

/// The window `[from, end)` and the stored checkpoint, from the main slot and the arguments;
/// `None`: the window is empty.
async fn window_bounds(
    client: &tokio_postgres::Client,
    slot: &str,
    args: &RestoreRequest,
) -> Result<Option<(Lsn, Lsn, Lsn)>, Failure> {
    let main = catalog::slot(client, slot)
        .await
        .map_err(query_exit(format!(
            "cannot look up replication slot {slot}"
        )))?
        .ok_or_else(|| {
            Failure::config(anyhow!(
                "replication slot `{slot}` does not exist: restore decodes the WAL its slot keeps"
            ))
        })?;
    if main.is_lost() {
        return Err(Failure::new(
            FailureKind::DataSafety,
            anyhow!(
                "replication slot `{slot}` was invalidated: the WAL it kept is gone, nothing can be restored from it"
            ),
        ));
    }
    let (checkpoint, _) = catalog::stored_checkpoint(client, slot)
        .await
        .map_err(query_exit(format!("cannot read the checkpoint of slot {slot}")))?
        .ok_or_else(|| {
            Failure::config(anyhow!(
                "slot `{slot}` has no stored checkpoint (outbox_relay.checkpoint): the relay never ran with it, so it published nothing to restore"
            ))
        })?;
    let end = match args.to_lsn {
        Some(to) if to > checkpoint => {
            (args.say)(&format!(
                "--to-lsn {to} is past the relay's stored checkpoint {checkpoint}: restoring up to the checkpoint (later events are the live relay's)"
            ));
            checkpoint
        }
        Some(to) => to,
        None => checkpoint,
    };
    let from = args.from_lsn;
    if from >= end {
        (args.say)(&format!(
            "nothing to restore: --from-lsn {from} is not before {end} (the end of the window)"
        ));
        return Ok(None);
    }
    Ok(Some((from, end, checkpoint)))
}

/// The exit for a copy that cannot be made.
fn slot_copy_exit(e: SlotCopyError) -> Failure {
    let kind = match e.query_error() {
        Some(q) if relay_postgres::is_transient_query_error(q) => FailureKind::Unavailable,
        Some(_) => FailureKind::Internal,
        None => FailureKind::Unavailable,
    };
    Failure::new(kind, anyhow::Error::new(e))
}

/// The copy keeps the WAL from `from` on (from its confirmed position); else it is dropped,
/// and the error says how far back a restore can go.
async fn require_kept(
    client: &tokio_postgres::Client,
    config: &RelayConfig,
    copy: SlotCopy,
    from: Lsn,
) -> Result<SlotCopy, Failure> {
    let kept_from = copy.kept_from();
    if kept_from.is_some_and(|kept| from >= kept) {
        return Ok(copy);
    }
    let slot = config.postgres.slot.as_str();
    let _ = copy.drop(client, DROP_WAIT).await;
    let kept = kept_from.map_or_else(|| "?".to_owned(), |l| l.to_string());
    let when = match kept_from {
        Some(l) => relay_postgres::checkpoint::anchor_at_or_before(client, slot, l)
            .await
            .ok()
            .flatten()
            .map(|a| {
                format!(
                    " (events committed since about {})",
                    humantime::format_rfc3339_seconds(a.commit_time)
                )
            })
            .unwrap_or_default(),
        None => String::new(),
    };
    let setting = config
        .relay
        .replay_retention
        .map_or_else(|| "not set".to_owned(), |r| format!("`{r}`"));
    Err(Failure::new(
        FailureKind::DataSafety,
        anyhow!(
            "cannot restore from {from}: slot `{slot}` keeps the WAL from commit LSN {kept} on{when}, not before. Restore can go back to --from-lsn {kept}; events committed before it are gone from WAL. [relay] replay_retention ({setting}) sets how much WAL the slot keeps behind the checkpoint (docs/replay.md)"
        ),
    ))
}

/// Decodes the window from the copy and publishes what the stream lacks.
// Long: the window's stages built and run in order, with the dry run beside the real publisher
async fn run_window(
    config: &RelayConfig,
    args: &RestoreRequest,
    server: &relay_postgres::PostgresSettings,
    client: &tokio_postgres::Client,
    window: &Window,
    shutdown: &CancellationToken,
) -> Result<String, Failure> {
    // As the relay publishes (atomic batches keep each restored transaction whole), but never
    // in fast batches: their acks do not say which messages were duplicates, and a duplicate
    // of a copy the stream no longer holds (a purge inside the duplicate window) must be
    // reported as not restored, never counted as restored.
    let mode = config.nats.publish_mode.reporting_duplicates();
    if mode != config.nats.publish_mode {
        (args.say)(
            "restore publishes each message on its own, not in fast batches: their acks do not say which messages were duplicates",
        );
    }
    let (_nats, publisher, stream_report) =
        crate::broker::connect_publisher(config, args.max_in_flight, mode).await?;
    let in_stream = relay_nats::published_between(
        publisher.jetstream(),
        &config.nats.stream,
        window.from,
        window.end,
    )
    .await
    .map_err(nats_failure)?;
    (args.say)(&format!(
        "stream {} still holds {} events of the window: they are skipped",
        config.nats.stream,
        in_stream.len()
    ));

    let router = crate::routing::bound_router(config, client)
        .await
        .map_err(|e| match e {
            RouterError::Mapping(e) => Failure::config(e),
            RouterError::Postgres(e) => pg_failure(e),
        })?;
    let mut copy_settings = server.clone();
    copy_settings.slot = window.copy.name().to_owned();
    let reached = Arc::new(AtomicU64::new(window.from.0));
    let inner = PgSource::start(&copy_settings, window.from, Lsn(0))
        .await
        .map_err(|e| Failure::new(class_kind(e.class), e))?;
    let source = WindowSource::new(inner, window.end, reached.clone());
    let stats = Arc::new(PipelineStats::default());
    let report = Arc::new(Report {
        window: (window.from, window.end),
        started: Instant::now(),
        reached,
        stats: stats.clone(),
        dry_run: args.dry_run,
    });
    let shown = Ticker::start(
        args.progress_mode,
        args.progress_interval,
        report.clone(),
        args.say.clone(),
    );
    let (result, not_stored) = if args.dry_run {
        let dry = DryRunPublisher {
            limits: publisher.limits(),
            record: args.would_publish.clone(),
        };
        let result = pipeline_run(
            config, args, source, dry, router, window, in_stream, &stats, shutdown,
        )
        .await;
        (result, Vec::new())
    } else {
        let (restoring, check) = RestoreCheck::attach(publisher, config.nats.stream.clone());
        let result = pipeline_run(
            config, args, source, restoring, router, window, in_stream, &stats, shutdown,
        )
        .await;
        (result, check.take_not_stored())
    };
    finish(
        &shown,
        &report,
        (window.from, window.end),
        result,
        shutdown,
        &not_stored,
        (&config.nats.stream, stream_report.duplicate_window),
    )
}

/// The relay's pipeline over the window: source, publisher and a store that keeps nothing.
#[allow(clippy::too_many_arguments)]
async fn pipeline_run<P: Publisher>(
    config: &RelayConfig,
    args: &RestoreRequest,
    source: WindowSource,
    publisher: P,
    router: Router,
    window: &Window,
    in_stream: HashMap<String, u64>,
    stats: &Arc<PipelineStats>,
    shutdown: &CancellationToken,
) -> Result<RunOutcome, PipelineError> {
    let mut pipeline_config = config.relay.pipeline_config();
    pipeline_config.max_in_flight = args.max_in_flight;
    let mut pipeline = Pipeline::new(
        source,
        publisher,
        NoStore,
        router,
        window.from,
        pipeline_config,
        stats.clone(),
    );
    pipeline.skip_published(in_stream);
    let result = pipeline.run(shutdown.cancelled()).await;
    let (source, _, _) = pipeline.into_parts();
    source.into_inner().stop(Duration::from_secs(1)).await;
    result
}

/// The summary line and the exit.
fn finish(
    shown: &Ticker,
    report: &Report,
    (from, end): (Lsn, Lsn),
    result: Result<RunOutcome, PipelineError>,
    shutdown: &CancellationToken,
    not_stored: &[String],
    (stream, duplicate_window): (&str, Duration),
) -> Result<String, Failure> {
    let again =
        "run the restore again: events it already restored are in the stream and are skipped";
    match result {
        Ok(outcome) if shutdown.is_cancelled() => {
            shown.finish("stopped");
            Err(Failure::new(
                FailureKind::Interrupted,
                anyhow!(
                    "restore of [{from}, {end}) stopped on request ({} unacknowledged messages abandoned); {again}",
                    outcome.abandoned
                ),
            ))
        }
        Ok(outcome) if outcome.abandoned > 0 => {
            shown.finish("incomplete");
            Err(Failure::new(
                FailureKind::Unavailable,
                anyhow!(
                    "restore of [{from}, {end}) ended with {} messages unacknowledged; {again}",
                    outcome.abandoned
                ),
            ))
        }
        Ok(_) if !not_stored.is_empty() => {
            shown.finish("incomplete");
            Err(Failure::new(
                FailureKind::DataSafety,
                anyhow!(
                    "JetStream dropped {} events as duplicates of messages stream {stream} no longer holds (e.g. event {}): after a purge it still remembers their ids for its duplicate_window ({}). They are not restored: run the restore again in {} (it publishes only what the stream lacks)",
                    not_stored.len(),
                    not_stored[0],
                    humantime::format_duration(duplicate_window),
                    humantime::format_duration(duplicate_window)
                ),
            ))
        }
        Ok(_) => {
            shown.finish("finished");
            Ok(progress::Report::line(report, "finished"))
        }
        Err(error) => {
            shown.finish("failed");
            let kind = crate::failure::pipeline_failure_kind(&error);
            Err(Failure::new(
                kind,
                anyhow::Error::new(error).context(format!(
                    "restore of [{from}, {end}) stopped; the main slot and the stored checkpoint are untouched. Fix the cause and {again}"
                )),
            ))
        }
    }
}
