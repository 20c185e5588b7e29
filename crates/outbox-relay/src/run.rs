//! The supervisor: start-up checks, then one replication session after another until shutdown
//! or a fatal error. Every session resumes from the stored checkpoint, so a reconnect re-sends
//! at most what was published but not yet checkpointed (deduplicated by `Nats-Msg-Id`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use relay_core::Lsn;
use relay_core::pipeline::PipelineStats;
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::exit::Exit;
use crate::telemetry::{StreamSample, Telemetry};

mod background;
mod on_create;
mod session;
mod stop;

use background::{spawn_progress_log, spawn_publication_check, spawn_sampler};

/// How a session ended without a fatal error.
enum SessionEnd {
    /// Shutdown was requested; everything acknowledged is stored and confirmed.
    Shutdown,
    /// The connection failed or the stream ended: reconnect after a backoff.
    Retry(anyhow::Error),
}

/// Runs the relay until shutdown or a fatal error.
// Long: the supervisor's loop: session, backoff and restart around one shared shutdown token and
// telemetry
pub async fn run(config: RelayConfig, accept_slot_position: bool) -> Result<(), Exit> {
    let shutdown = CancellationToken::new();
    crate::signals::spawn_handler(
        shutdown.clone(),
        "shutdown requested: finishing outstanding publishes, then storing the checkpoint",
        "second signal: exiting now; unacknowledged events will be re-sent",
    );

    let stats = Arc::new(PipelineStats::default());
    let telemetry = Arc::new(Telemetry::new(
        stats.clone(),
        &config.postgres.slot,
        &config.nats.stream,
        crate::telemetry::BUILD_INFO,
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

    let (nats, publisher, report) = crate::broker::connect_publisher(
        &config,
        config.relay.max_in_flight,
        config.nats.publish_mode,
    )
    .await?;
    telemetry.set_nats(nats.client().clone());
    // Held until `run` returns: dropping it flushes the last spans.
    let spans = config.otlp.start().map_err(Exit::config)?;
    let publisher =
        relay_telemetry::otlp::TracedPublisher::new(publisher, spans, &config.nats.stream);
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
            publisher.inner().context().clone(),
            shutdown.clone(),
        );
    }
    spawn_progress_log(stats.clone(), shutdown.clone());
    background::spawn_outbox_upkeep(config.clone(), telemetry.clone(), shutdown.clone());
    // Sessions stop on `stop`: a shutdown, or the publication check finding the publication no
    // longer delivers the outbox tables (then the relay drains, stores, and exits with 78).
    let stop = shutdown.child_token();
    let drift: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    spawn_publication_check(config.clone(), stop.clone(), drift.clone());
    let mut supervisor = session::Supervisor {
        config: &config,
        publisher: &publisher,
        stop: &stop,
        telemetry: &telemetry,
        accept_slot_position,
        ever_connected: false,
        refused_logins: 0,
        backfilled_streamed_ids: Default::default(),
    };
    let mut backoff = Duration::from_millis(250);
    let mut sessions = 0u64;
    loop {
        if sessions > 0 {
            telemetry.pg_reconnects.fetch_add(1, Ordering::Relaxed);
        }
        sessions += 1;
        let end = supervisor.session().await;
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
