//! Signals from SQL: the relay carries out the rows inserted into `outbox_relay.signal` (a
//! `backfill`, a `replay`), one at a time, in commit order, and writes each one's progress,
//! outcome or error back into its row.
//! A bad signal (unknown kind, bad arguments, a table that is not an outbox table) is a row
//! marked failed with the reason; nothing a signal does stops the relay.
//!
//! Order: a listening session is woken by the table's trigger at commit (`NOTIFY` is delivered
//! in commit order). Rows that arrived while no session listened (the relay was down, or its
//! session reconnected) are read from the table when it starts listening, in the order of their
//! ids, before any notified one. A signal the relay was carrying out when it stopped is resumed
//! on its next start (a backfill at its stored cursor).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use relay_backfill::signal::{self as store, ClaimedSignal, SignalEnd, SignalSession};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::failure::FailureKind;
use crate::table_backfill::{self, BackfillRequest};

mod request;

pub use request::{KNOWN_KINDS, SignalRequest, parse};

/// How often a running signal's progress is written into its row.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Carries out signals until `shutdown`, reconnecting its session after a failure. Starts once
/// the relay streams: a backfill needs the slot, which the relay's first start may create.
pub(crate) fn spawn(
    config: RelayConfig,
    telemetry: std::sync::Arc<relay_telemetry::Telemetry>,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        while !telemetry
            .streaming
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = shutdown.cancelled() => return,
            }
        }
        let mut warned = false;
        let mut backoff = Duration::from_secs(1);
        while !shutdown.is_cancelled() {
            match SignalSession::connect(&config.postgres).await {
                Ok(session) => {
                    warned = false;
                    backoff = Duration::from_secs(1);
                    if let Err(error) = serve(&config, session, &shutdown).await {
                        tracing::warn!(error = %error, "signal session ended; reconnecting");
                    }
                }
                Err(error) if !warned => {
                    warned = true;
                    tracing::warn!(error = %format!("{error:#}"), "signals from SQL (outbox_relay.signal) are not carried out until this is fixed; set [relay] sql_signals = false to turn them off");
                }
                Err(error) => tracing::debug!(error = %error, "signal session: still failing"),
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = shutdown.cancelled() => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(60));
        }
    });
}

/// One session: the open rows first, then each notified one, until the session ends or
/// `shutdown`.
async fn serve(
    config: &RelayConfig,
    mut session: SignalSession,
    shutdown: &CancellationToken,
) -> Result<(), relay_postgres::PgError> {
    let slot = &config.postgres.slot;
    let mut queue: VecDeque<i64> = store::open_signals(&session.client, slot).await?.into();
    loop {
        let id = match queue.pop_front() {
            Some(id) => id,
            None => tokio::select! {
                notified = session.new_rows.recv() => match notified {
                    Some(n) => {
                        queue.extend(store::notified_id(&n));
                        continue;
                    }
                    None => return Ok(()),
                },
                () = shutdown.cancelled() => return Ok(()),
            },
        };
        let Some(claimed) = store::claim(&session.client, id, slot).await? else {
            continue;
        };
        carry_out(config, &mut session, claimed, &mut queue, shutdown).await?;
        if shutdown.is_cancelled() {
            return Ok(());
        }
    }
}

/// Carries out one claimed signal and writes how it ended (unless the relay is stopping: then
/// the row stays running and the next start resumes it).
async fn carry_out(
    config: &RelayConfig,
    session: &mut SignalSession,
    signal: ClaimedSignal,
    queue: &mut VecDeque<i64>,
    shutdown: &CancellationToken,
) -> Result<(), relay_postgres::PgError> {
    let client = &session.client;
    let asked_at = std::time::UNIX_EPOCH
        + Duration::from_micros(u64::try_from(signal.requested_at_unix_micros).unwrap_or(0));
    let request = match parse(&signal.kind, &signal.args, asked_at) {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(signal = signal.id, kind = %signal.kind, "signal refused: {error}");
            return store::finish(client, signal.id, &SignalEnd::Failed { error }, None).await;
        }
    };
    match request {
        SignalRequest::Backfill(request) => {
            backfill(config, session, &signal, request, queue, shutdown).await
        }
        SignalRequest::Replay(request) => replay(config, &session.client, &signal, &request).await,
        SignalRequest::Restore(args) => {
            restore(config, session, &signal, &args, queue, shutdown).await
        }
    }
}

/// Carries out a `restore` signal: its latest progress line goes into the row every
/// [`PROGRESS_EVERY`], its summary into the outcome. A relay stopping meanwhile leaves it
/// running: the next start runs it again (what it restored is in the stream and skipped).
async fn restore(
    config: &RelayConfig,
    session: &mut SignalSession,
    signal: &ClaimedSignal,
    args: &request::RestoreArgs,
    queue: &mut VecDeque<i64>,
    shutdown: &CancellationToken,
) -> Result<(), relay_postgres::PgError> {
    let client = &session.client;
    let (from_lsn, to_lsn) = match args.bounds() {
        Ok(bounds) => bounds,
        Err(error) => {
            return store::finish(client, signal.id, &SignalEnd::Failed { error }, None).await;
        }
    };
    tracing::info!(signal = signal.id, from = %from_lsn, "carrying out a restore signal");
    let latest: std::sync::Arc<std::sync::Mutex<String>> = Default::default();
    let said = latest.clone();
    let request = crate::restore::RestoreRequest {
        from_lsn,
        to_lsn,
        dry_run: args.dry_run,
        max_in_flight: args.max_in_flight,
        progress_interval: PROGRESS_EVERY,
        progress_mode: crate::progress::Mode::Lines,
        say: std::sync::Arc::new(move |line: &str| {
            tracing::info!(signal = "restore", "{line}");
            if let Ok(mut l) = said.lock() {
                line.clone_into(&mut l);
            }
        }),
        would_publish: None,
    };
    let run = crate::restore::restore(config, &request, shutdown);
    let result = until_done(
        session,
        (&config.postgres.slot, signal.id),
        queue,
        run,
        &mut Progress::Line(&latest),
    )
    .await;
    let client = &session.client;
    let end = match result {
        Ok(Some(summary)) => SignalEnd::Done { outcome: summary },
        Ok(None) => SignalEnd::Done {
            outcome: latest.lock().map(|l| l.clone()).unwrap_or_default(),
        },
        Err(failure) if failure.kind == FailureKind::Interrupted && shutdown.is_cancelled() => {
            tracing::info!(
                signal = signal.id,
                "relay stopping: the restore runs again at the next start"
            );
            return Ok(());
        }
        Err(failure) => SignalEnd::Failed {
            error: format!("{:#}", failure.error),
        },
    };
    log_end(signal, &end);
    let last = Progress::Line(&latest).read(client).await;
    store::finish(client, signal.id, &end, last.as_deref()).await
}

/// Carries out a `replay` signal: the range goes into the row's progress, what was done into
/// its outcome.
async fn replay(
    config: &RelayConfig,
    client: &tokio_postgres::Client,
    signal: &ClaimedSignal,
    request: &crate::replay::ReplayRequest,
) -> Result<(), relay_postgres::PgError> {
    tracing::info!(signal = signal.id, consumer = %request.consumer, "carrying out a replay signal");
    let mut range = None;
    let result = crate::replay::replay(config, request, |r| {
        range = Some(serde_json::json!({
            "from_sequence": r.from.position.sequence,
            "until_sequence": r.until.as_ref().map(|u| u.position.sequence),
            "messages": r.count,
            "range": r.lines(&request.subjects),
        }));
    })
    .await;
    let end = match result {
        Ok(done) => SignalEnd::Done {
            outcome: done.to_string(),
        },
        Err(failure) => SignalEnd::Failed {
            error: format!("{:#}", failure.error),
        },
    };
    log_end(signal, &end);
    let range = range.map(|r| r.to_string());
    store::finish(client, signal.id, &end, range.as_deref()).await
}

fn log_end(signal: &ClaimedSignal, end: &SignalEnd) {
    match end {
        SignalEnd::Done { outcome } => tracing::info!(signal = signal.id, "{outcome}"),
        SignalEnd::Failed { error } => tracing::warn!(signal = signal.id, "signal failed: {error}"),
    }
}

/// Carries out a `backfill` signal, its progress written into the row every
/// [`PROGRESS_EVERY`]; a signal notified meanwhile is queued and told it waits.
async fn backfill(
    config: &RelayConfig,
    session: &mut SignalSession,
    signal: &ClaimedSignal,
    mut request: BackfillRequest,
    queue: &mut VecDeque<i64>,
    shutdown: &CancellationToken,
) -> Result<(), relay_postgres::PgError> {
    let client = &session.client;
    if signal.resumed && request.restart && own_cursor(config, &request, signal, client).await {
        // Started over before the relay stopped: resume that run instead of a third one.
        request.restart = false;
    }
    tracing::info!(
        signal = signal.id,
        table = %request.table,
        resumed = signal.resumed,
        "carrying out a backfill signal"
    );
    let mut watch = ProgressWatch::new(config, &request);
    let run = table_backfill::backfill(config, &request, shutdown);
    let progress = &mut Progress::Cursor(&mut watch);
    let result = until_done(
        session,
        (&config.postgres.slot, signal.id),
        queue,
        run,
        progress,
    )
    .await;
    let client = &session.client;
    let progress = watch.read(client).await;
    let end = match result {
        Ok(outcome) => SignalEnd::Done {
            outcome: outcome.to_string(),
        },
        Err(failure) if failure.kind == FailureKind::Interrupted && shutdown.is_cancelled() => {
            tracing::info!(
                signal = signal.id,
                "relay stopping: the signal stays running and resumes at the next start"
            );
            if let Some(progress) = progress {
                store::record_progress(client, signal.id, &config.postgres.slot, &progress).await?;
            }
            return Ok(());
        }
        Err(failure) => SignalEnd::Failed {
            error: format!(
                "{:#} (insert the signal again once the cause is fixed: it resumes at the stored cursor)",
                failure.error
            ),
        },
    };
    log_end(signal, &end);
    store::finish(client, signal.id, &end, progress.as_deref()).await
}

/// Where a running signal's progress comes from.
enum Progress<'a> {
    /// A backfill's stored cursor.
    Cursor(&'a mut ProgressWatch),
    /// A restore's latest progress line.
    Line(&'a std::sync::Mutex<String>),
}

impl Progress<'_> {
    /// The progress as a JSON object's text, `None` while there is none.
    async fn read(&mut self, client: &tokio_postgres::Client) -> Option<String> {
        match self {
            Self::Cursor(watch) => watch.read(client).await,
            Self::Line(latest) => {
                let text = latest.lock().map(|l| l.clone()).unwrap_or_default();
                (!text.is_empty()).then(|| serde_json::json!({ "line": text }).to_string())
            }
        }
    }
}

/// Waits for `run`, the signal being carried out: what `progress` reads goes into its row every
/// [`PROGRESS_EVERY`], and signals notified meanwhile are queued behind it and told so.
async fn until_done<T>(
    session: &mut SignalSession,
    (slot, signal): (&str, i64),
    queue: &mut VecDeque<i64>,
    run: impl std::future::Future<Output = T>,
    progress: &mut Progress<'_>,
) -> T {
    let SignalSession { client, new_rows } = session;
    tokio::pin!(run);
    let mut ticks = tokio::time::interval(PROGRESS_EVERY);
    loop {
        tokio::select! {
            result = &mut run => return result,
            // A progress note that cannot be written is not worth stopping the work for: the
            // next one (or the outcome) says it.
            _ = ticks.tick() => {
                if let Some(now) = progress.read(client).await
                    && let Err(e) = store::record_progress(client, signal, slot, &now).await
                {
                    tracing::debug!(signal, error = %e, "cannot record a signal's progress");
                }
            }
            Some(notified) = new_rows.recv() => {
                if let Some(next) = store::notified_id(&notified) {
                    queue.push_back(next);
                    if let Err(e) = store::note_waiting(client, next, slot, signal).await {
                        tracing::debug!(signal = next, error = %e, "cannot record that a signal waits");
                    }
                }
            }
        }
    }
}

/// Whether the stored cursor of `request` was started by `signal` (not before it was claimed).
async fn own_cursor(
    config: &RelayConfig,
    request: &BackfillRequest,
    signal: &ClaimedSignal,
    client: &tokio_postgres::Client,
) -> bool {
    let Some(id) = request.cursor(config) else {
        return false;
    };
    match relay_backfill::load_cursor(client, &id).await {
        // Both are `YYYY-MM-DDTHH:MM:SSZ`: they compare as text.
        Ok(Some(cursor)) => cursor.started_at >= signal.started_at,
        _ => false,
    }
}

/// A backfill's progress as its stored cursor shows it (acknowledged rows only), with a rate and
/// an estimate of the time left from this run's first reading.
struct ProgressWatch {
    /// `None`: not an outbox table (the backfill fails on it).
    id: Option<relay_backfill::CursorId>,
    /// This run's first reading: when, rows done, and the cursor's start (a cursor started over
    /// meanwhile, `restart`, is a new baseline).
    first: Option<(Instant, i64, String)>,
}

impl ProgressWatch {
    fn new(config: &RelayConfig, request: &BackfillRequest) -> Self {
        Self {
            id: request.cursor(config),
            first: None,
        }
    }

    /// The progress as a JSON object's text, `None` while there is no cursor yet.
    async fn read(&mut self, client: &tokio_postgres::Client) -> Option<String> {
        let id = self.id.as_ref()?;
        let cursor = relay_backfill::load_cursor(client, id).await.ok()??;
        let now = Instant::now();
        if self
            .first
            .as_ref()
            .is_none_or(|(_, _, started)| *started != cursor.started_at)
        {
            self.first = Some((now, cursor.rows_done, cursor.started_at.clone()));
        }
        let (since, rows_then) = self
            .first
            .as_ref()
            .map_or((now, cursor.rows_done), |(at, rows, _)| (*at, *rows));
        let seconds = now.duration_since(since).as_secs_f64();
        let rate = (seconds >= 1.0).then(|| (cursor.rows_done - rows_then) as f64 / seconds);
        let left = cursor
            .rows_estimate
            .map(|estimate| (estimate - cursor.rows_done).max(0));
        let eta_seconds = match (rate, left) {
            (Some(rate), Some(left)) if rate > 0.0 => Some((left as f64 / rate).ceil() as u64),
            _ => None,
        };
        let percent = cursor.rows_estimate.filter(|e| *e > 0).map(|e| {
            ((cursor.rows_done as f64 * 100.0 / e as f64).min(100.0) * 10.0).round() / 10.0
        });
        Some(
            serde_json::json!({
                "table": id.table,
                "rows_done": cursor.rows_done,
                "rows_estimate": cursor.rows_estimate,
                "percent": percent,
                "rows_per_second": rate.map(|r| r.round()),
                "eta_seconds": eta_seconds,
                "last_key": cursor.last_key,
                "finished": cursor.finished_at.is_some(),
            })
            .to_string(),
        )
    }
}
