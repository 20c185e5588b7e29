//! The supervisor: start-up checks, then one replication session after another until shutdown
//! or a fatal error. Every session resumes from the stored checkpoint, so a reconnect re-sends
//! at most what was published but not yet checkpointed (deduplicated by `Nats-Msg-Id`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use relay_core::Lsn;
use relay_core::pipeline::{Pipeline, PipelineError, PipelineStats};
use relay_core::route::Router;
use relay_core::stage::{CheckpointStore, ErrorClass, SourceError, StoreError};
use relay_nats::{JetStreamPublisher, NatsError};
use relay_postgres::checkpoint::PgCheckpointStore;
use relay_postgres::source::PgSource;
use relay_postgres::{PgError, bootstrap};
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::exit::{Exit, ExitKind};
use crate::telemetry::{StreamSample, Telemetry};

mod background;
mod failpoint;

use background::{spawn_progress_log, spawn_publication_check, spawn_sampler};

/// Consecutive refused logins after the first session before the relay exits with 78.
const MAX_REFUSED_LOGINS: u32 = 3;

/// How a session ended without a fatal error.
enum SessionEnd {
    /// Shutdown was requested; everything acknowledged is stored and confirmed.
    Shutdown,
    /// The connection failed or the stream ended: reconnect after a backoff.
    Retry(anyhow::Error),
}

/// Listens for SIGTERM/SIGINT: the first starts a clean shutdown, the second exits at once.
fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(error) => {
                    tracing::error!(error = %error, "cannot listen for SIGTERM");
                    return;
                }
            };
        for round in 0.. {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            if round == 0 {
                tracing::info!(
                    "shutdown requested: finishing outstanding publishes, then storing the checkpoint"
                );
                shutdown.cancel();
            } else {
                tracing::warn!("second signal: exiting now; unacknowledged events will be re-sent");
                std::process::exit(130);
            }
        }
    });
}

pub(crate) fn nats_exit(error: NatsError) -> Exit {
    let kind = match error {
        NatsError::Connect { .. } | NatsError::Stream { .. } => ExitKind::Unavailable,
        _ => ExitKind::Config,
    };
    Exit::new(kind, error)
}

pub(crate) fn pg_exit(error: PgError) -> Exit {
    let kind = if error.is_data_safety_stop() {
        ExitKind::DataSafety
    } else if error.is_transient() {
        ExitKind::Unavailable
    } else {
        ExitKind::Config
    };
    Exit::new(kind, error)
}

fn class_exit(class: ErrorClass, error: anyhow::Error) -> Result<SessionEnd, Exit> {
    match class {
        ErrorClass::Transient => Ok(SessionEnd::Retry(error)),
        ErrorClass::Fatal => Err(Exit::new(ExitKind::Config, error)),
        ErrorClass::SlotLost => Err(Exit::new(ExitKind::DataSafety, error)),
    }
}

fn source_end(error: SourceError) -> Result<SessionEnd, Exit> {
    class_exit(error.class, anyhow::Error::new(error))
}

fn store_end(error: StoreError) -> Result<SessionEnd, Exit> {
    class_exit(error.class, anyhow::Error::new(error))
}

/// Runs the relay until shutdown or a fatal error.
pub async fn run(config: RelayConfig, accept_slot_position: bool) -> Result<(), Exit> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());

    let stats = Arc::new(PipelineStats::default());
    let telemetry = Arc::new(Telemetry::new(
        stats.clone(),
        &config.postgres.slot,
        &config.nats.stream,
    ));
    // Bind first: a taken port is a configuration error, reported before anything connects.
    let http = match &config.http.listen {
        Some(listen) => {
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("[http] listen: cannot listen on {listen}"))
                .map_err(Exit::config)?;
            tracing::info!(listen = %listen, "serving /livez, /readyz, /metrics, /status");
            crate::http::spawn(listener, telemetry.clone());
            true
        }
        None => false,
    };

    let nats = relay_nats::connect(&config.nats).await.map_err(nats_exit)?;
    telemetry.set_nats(nats.client().clone());
    let publisher = JetStreamPublisher::new(
        &nats,
        &config.nats.stream,
        config.nats.ack_timeout,
        config.relay.max_in_flight,
    );
    let report = relay_nats::prepare_stream(
        publisher.jetstream(),
        &config.nats,
        &config.sample_subjects(),
    )
    .await
    .map_err(nats_exit)?;
    for warning in &report.warnings {
        tracing::warn!(stream = %config.nats.stream, "{warning}");
    }
    tracing::info!(
        stream = %config.nats.stream,
        subjects = ?report.subjects,
        duplicate_window = ?report.duplicate_window,
        created = report.created,
        "JetStream stream ready"
    );

    telemetry.set_stream(StreamSample {
        present: true,
        ..StreamSample::default()
    });
    if http {
        spawn_sampler(
            config.clone(),
            telemetry.clone(),
            publisher.context().clone(),
            shutdown.clone(),
        );
    }
    spawn_progress_log(stats.clone(), shutdown.clone());
    // Sessions stop on `stop`: a shutdown, or the publication check finding the publication no
    // longer delivers the outbox tables (then the relay drains, stores, and exits with 78).
    let stop = shutdown.child_token();
    let drift: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    spawn_publication_check(config.clone(), stop.clone(), drift.clone());
    let mut accept = accept_slot_position;
    let mut ever_connected = false;
    let mut refused_logins = 0u32;
    let mut backoff = Duration::from_millis(250);
    let mut sessions = 0u64;
    loop {
        if sessions > 0 {
            telemetry.pg_reconnects.fetch_add(1, Ordering::Relaxed);
        }
        sessions += 1;
        let end = session(
            &config,
            &publisher,
            &stop,
            &telemetry,
            &mut accept,
            &mut ever_connected,
            &mut refused_logins,
        )
        .await;
        telemetry.streaming.store(false, Ordering::Relaxed);
        let drifted = drift.lock().ok().and_then(|d| d.clone());
        if let Some(problem) = drifted {
            // A session that failed on its own (e.g. a row that cannot be routed) keeps its
            // more specific exit; the publication problem is logged by the check already.
            end?;
            return Err(Exit::config(anyhow::anyhow!(
                "{problem}; stopped after storing the acknowledged position {}",
                Lsn(stats.confirmed_lsn.load(Ordering::Relaxed))
            )));
        }
        let error = match end? {
            SessionEnd::Shutdown => {
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
                tracing::info!(confirmed_lsn = %Lsn(stats.confirmed_lsn.load(Ordering::Relaxed)), "stopped cleanly");
                return Ok(());
            }
            SessionEnd::Retry(error) => error,
        };
        if shutdown.is_cancelled() {
            return Ok(());
        }
        telemetry.set_last_error(Some(format!("{error:#}")));
        tracing::warn!(error = %format!("{error:#}"), retry_in = ?backoff, "replication session ended; reconnecting");
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => {}
        }
        if shutdown.is_cancelled() {
            return Ok(());
        }
        backoff = (backoff * 2).min(config.relay.reconnect_max);
    }
}

/// One replication session: connect, check, resume from the checkpoint, stream.
async fn session(
    config: &RelayConfig,
    publisher: &JetStreamPublisher,
    shutdown: &CancellationToken,
    telemetry: &Arc<Telemetry>,
    accept_slot_position: &mut bool,
    ever_connected: &mut bool,
    refused_logins: &mut u32,
) -> Result<SessionEnd, Exit> {
    let stats = &telemetry.stats;
    let slot = config.postgres.slot.as_str();
    let client = match relay_postgres::connect(&config.postgres).await {
        Ok(client) => client,
        // Unreachable at start-up: say so and exit; later, wait for it to come back.
        Err(e) if *ever_connected && e.is_transient() => return Ok(SessionEnd::Retry(e.into())),
        // A refused login (password, LOGIN, pg_hba, TLS) needs an operator: a few quick retries
        // cover a secret file updated a moment after the role, then exit instead of looping.
        Err(e) if *ever_connected => {
            *refused_logins += 1;
            let who = config.postgres.parts().map(|p| p.user).unwrap_or_default();
            let message = format!(
                "PostgreSQL at {} refused the login of role `{who}` ({} of {MAX_REFUSED_LOGINS} attempts) after the relay had run: check the role (LOGIN, password, pg_hba.conf, certificate) and postgres.password / password_file / sslcert",
                config.postgres.display_target(),
                refused_logins
            );
            let error = anyhow::Error::new(e).context(message);
            if *refused_logins >= MAX_REFUSED_LOGINS {
                return Err(Exit::config(error));
            }
            return Ok(SessionEnd::Retry(error));
        }
        Err(e) => return Err(pg_exit(e)),
    };
    *ever_connected = true;
    *refused_logins = 0;
    let mut store = match PgCheckpointStore::new(client, slot).await {
        Ok(store) => store,
        Err(e) => return store_end(e),
    };
    let checkpoint = match store.load().await {
        Ok(c) => c,
        Err(e) => return store_end(e),
    };
    failpoint::pause("after_checkpoint_read").await;
    let tables = config.tables();
    let state = match bootstrap::prepare(store.client(), &config.postgres, &tables, checkpoint)
        .await
    {
        Ok(state) => state,
        Err(PgError::SlotAhead {
            slot_lsn,
            checkpoint,
            ..
        }) if *accept_slot_position => {
            tracing::warn!(slot, slot_lsn = %slot_lsn, checkpoint = %checkpoint, "accepting the slot's position: events committed in between were not published by this relay");
            if let Err(e) = store.overwrite(slot_lsn).await {
                return store_end(e);
            }
            *accept_slot_position = false;
            return Ok(SessionEnd::Retry(anyhow::anyhow!(
                "checkpoint moved to the slot's position {slot_lsn}"
            )));
        }
        Err(e) if e.is_transient() => return Ok(SessionEnd::Retry(e.into())),
        Err(e) => return Err(pg_exit(e)),
    };
    let start = match state.checkpoint {
        Some(c) => c,
        None => {
            // First run for this slot: record where it starts, so a lost slot is detected later.
            if let Err(e) = store.save(state.confirmed_flush_lsn).await {
                return store_end(e);
            }
            state.confirmed_flush_lsn
        }
    };
    tracing::info!(
        slot,
        publication = %config.postgres.publication,
        checkpoint = %start,
        slot_confirmed_flush_lsn = %state.confirmed_flush_lsn,
        slot_restart_lsn = ?state.slot.restart_lsn.map(|l| l.to_string()),
        wal_status = ?state.slot.wal_status,
        slot_created = state.created,
        "resuming from the stored checkpoint"
    );
    if let Some(pid) = state.slot.active_pid {
        tracing::info!(
            slot,
            active_pid = pid,
            "slot is streaming to another process; waiting as a standby"
        );
    }
    // After a downtime longer than the stream's duplicate window, JetStream would store re-sent
    // events twice: find what it already holds past the checkpoint and skip those.
    let already_published = match relay_nats::published_since(
        publisher.jetstream(),
        &config.nats.stream,
        start,
        config.relay.max_in_flight as u64 * 2,
    )
    .await
    {
        Ok(ids) => ids,
        Err(e) => return Ok(SessionEnd::Retry(e.into())),
    };
    if !already_published.is_empty() {
        tracing::info!(
            count = already_published.len(),
            checkpoint = %start,
            "events past the checkpoint are already in the stream; they will not be published again"
        );
    }
    let mut router = Router::new(&config.outbox)
        .context("outbox mapping")
        .map_err(Exit::config)?;
    match relay_postgres::catalog::outbox_table_oids(store.client(), &tables).await {
        Ok(oids) => router.bind_catalog(&oids.tables, oids.read_at),
        Err(e) if e.is_transient() => return Ok(SessionEnd::Retry(e.into())),
        Err(e) => return Err(pg_exit(e)),
    }
    failpoint::pause("before_start_replication").await;
    let source = match PgSource::start(&config.postgres, start).await {
        Ok(source) => source,
        Err(e) => return source_end(e),
    };
    telemetry.streaming.store(true, Ordering::Relaxed);
    telemetry.set_last_error(None);
    // systemd (Type=notify): ready once replication streams; repeated READY=1 is harmless.
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    tracing::info!(slot, lsn = %start, "streaming");
    let mut pipeline = Pipeline::new(
        source,
        publisher.clone(),
        store,
        router,
        start,
        config.relay.pipeline_config(),
        stats.clone(),
    );
    pipeline.skip_published(already_published);
    let result = pipeline.run(shutdown.cancelled()).await;
    let (source, _, _) = pipeline.into_parts();
    let stop_wait = config.postgres.status_interval.min(Duration::from_secs(5));
    match result {
        Ok(outcome) => {
            source.stop(stop_wait).await;
            if shutdown.is_cancelled() {
                tracing::info!(confirmed_lsn = %outcome.confirmed, abandoned = outcome.abandoned, "drained");
                Ok(SessionEnd::Shutdown)
            } else {
                Ok(SessionEnd::Retry(anyhow::anyhow!(
                    "replication stream ended"
                )))
            }
        }
        Err(PipelineError::Source(e)) => source_end(e),
        Err(PipelineError::Store { error, lsn }) => {
            let class = error.class;
            class_exit(
                class,
                anyhow::Error::new(error).context(format!("storing checkpoint {lsn}")),
            )
        }
        Err(e @ (PipelineError::Route { .. } | PipelineError::Publish { .. })) => {
            source.stop(stop_wait).await;
            let confirmed = Lsn(stats.confirmed_lsn.load(Ordering::Relaxed));
            Err(Exit::new(
                ExitKind::DataSafety,
                anyhow::Error::new(e).context(format!(
                    "stopped before this transaction; confirmed position stays at {confirmed}. A committed row cannot change: fix the mapping (or set [relay] dead_letter_subject) and restart; the relay resumes there"
                )),
            ))
        }
        Err(e @ PipelineError::Schema { .. }) => {
            source.stop(stop_wait).await;
            let confirmed = Lsn(stats.confirmed_lsn.load(Ordering::Relaxed));
            Err(Exit::config(anyhow::Error::new(e).context(format!(
                "stopped before this transaction; confirmed position stays at {confirmed}, and the relay resumes there once the configuration matches the table"
            ))))
        }
        Err(e @ PipelineError::Protocol(_)) => Err(Exit::internal(e)),
    }
}
