//! The relay for one slot as one value: [`Relay`] is built from its settings, owns everything
//! that slot needs (its telemetry, the publisher, the background upkeep, the replication
//! sessions) and runs until its shutdown token is cancelled or a fatal [`Failure`]. Nothing is
//! shared with another `Relay` in the same process. What it knows about itself is read through
//! [`Relay::telemetry`]; its caller serves that (the binary: `[http] listen`, with relay-console)
//! until [`Relay::ended`].
//!
//! The supervisor runs start-up checks, then one replication session after another. Every
//! session resumes from the stored checkpoint, so a reconnect re-sends at most what was
//! published but not yet checkpointed (deduplicated by `Nats-Msg-Id`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use relay_core::Lsn;
use relay_core::pipeline::PipelineStats;
use relay_telemetry::{BuildInfo, StreamSample, Telemetry};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::RelayConfig;
use crate::failure::Failure;

mod audit;
mod background;
mod on_create;
mod sequence_check;
mod session;
mod standby;
mod stop;

use background::{spawn_progress_log, spawn_publication_check, spawn_sampler};

/// How a [`Relay`] is started besides its settings.
#[derive(Debug, Clone, Copy)]
pub struct RelayOptions {
    /// `--accept-slot-position`: a slot ahead of the checkpoint moves the checkpoint there once.
    pub accept_slot_position: bool,
    /// The build `/status` and `outbox_relay_build_info` show.
    pub build: BuildInfo,
    /// Sample the slot, the stream and the outbox tables into the telemetry every `[http]
    /// sample_interval`: what `/status`, `/readyz` and `/metrics` show besides the sessions' own
    /// counts. The binary sets it when it serves them (`[http] listen`).
    pub sample: bool,
}

/// Where a fleet's pipeline should stream when several processes run the fleet: the slot
/// stays the lock (one reader), this only says who tries first (`crate::fleet::members`).
pub trait SlotClaim: Send + Sync + std::fmt::Debug {
    /// Whether `pipeline` is placed on this process: it takes its slot as soon as it is free.
    fn placed_here(&self, pipeline: &str) -> bool;
    /// How long a free slot waits for the process its pipeline is placed on before another
    /// takes it.
    fn grace(&self) -> Duration;
    /// Whether this process, streaming `pipeline`, should drain it and let the process it is
    /// placed on take it.
    fn hand_over(&self, pipeline: &str) -> bool;
}

/// A relay's pipeline name with the fleet's placement.
#[derive(Debug, Clone)]
pub struct Claim {
    pub pipeline: String,
    pub policy: Arc<dyn SlotClaim>,
}

/// One relay: one slot's replication, published to one stream.
#[derive(Debug)]
pub struct Relay {
    config: RelayConfig,
    options: RelayOptions,
    /// In a fleet run by several processes: who takes a free slot first.
    claim: Option<Claim>,
    stats: Arc<PipelineStats>,
    telemetry: Arc<Telemetry>,
    /// Cancelled when [`Relay::run`] returns (or the relay is dropped without running).
    ended: CancellationToken,
    ended_on_drop: DropGuard,
}

impl Relay {
    /// Builds the relay of `config`, connecting to nothing. The files it reads are checked
    /// first ([`crate::files::check_files`], as the offline `validate` does) and its contracts
    /// compiled, so a bad file is a configuration failure reported before anything connects.
    pub async fn build(config: RelayConfig, options: RelayOptions) -> Result<Self, Failure> {
        crate::files::check_files(&config)?;
        let stats = Arc::new(PipelineStats::default());
        let telemetry = Arc::new(Telemetry::new(
            stats.clone(),
            &config.postgres.slot,
            &config.nats.stream,
            options.build,
        ));
        // Compiled once here: every session's router checks against these and counts into them.
        telemetry.set_contracts(config.contracts().map_err(Failure::config)?);
        let ended = CancellationToken::new();
        Ok(Self {
            config,
            options,
            claim: None,
            stats,
            telemetry,
            ended_on_drop: ended.clone().drop_guard(),
            ended,
        })
    }

    /// In a fleet run by several processes: take a free slot at once only where the fleet
    /// places this pipeline, else after the placement's grace.
    pub fn with_claim(mut self, claim: Claim) -> Self {
        self.claim = Some(claim);
        self
    }

    /// The settings this relay was built from.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// What this relay knows about itself: what `/status`, `/readyz` and `/metrics` show.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    /// Cancelled once [`Relay::run`] has returned (the relay drained and stopped, or failed),
    /// or when the relay is dropped without running: what serves its telemetry ends then.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Runs until `shutdown` is cancelled (then drains, stores the checkpoint and returns
    /// `Ok`) or a fatal failure. Every task the relay started ends when this returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Failure> {
        // The tasks beside the sessions end with the relay, also when it fails.
        let shutdown = shutdown.child_token();
        let _tasks = shutdown.clone().drop_guard();
        supervise(self, shutdown).await
    }
}

/// How a session ended without a fatal error.
enum SessionEnd {
    /// Shutdown was requested; everything acknowledged is stored and confirmed.
    Shutdown,
    /// The connection failed or the stream ended: reconnect after a backoff.
    Retry(anyhow::Error),
    /// START_REPLICATION found the slot streamed by another process (it was free when the
    /// session looked, and another relay took it first): no failure, the relay waits as its
    /// standby, starting over after `[relay] standby_poll_interval`.
    SlotTaken(anyhow::Error),
}

/// The supervisor's loop: session, backoff and restart around one shutdown token.
// Long: the supervisor's loop: session, backoff and restart around one shared shutdown token and
// telemetry
async fn supervise(relay: Relay, shutdown: CancellationToken) -> Result<(), Failure> {
    let Relay {
        config,
        options,
        claim,
        stats,
        telemetry,
        ended: _,
        // What serves this relay's telemetry ends when this returns.
        ended_on_drop: _ended,
    } = relay;
    let (nats, publisher, report) = crate::broker::connect_publisher(
        &config,
        config.relay.max_in_flight,
        config.nats.publish_mode,
    )
    .await?;
    telemetry.set_nats(nats.client().clone());
    // Held until `run` returns: dropping it flushes the last spans.
    let spans = config.otlp.start().map_err(Failure::config)?;
    let publisher = match relay_telemetry::otlp::Tracing::hook(spans, &config.nats.stream) {
        Some(tracing) => publisher.with_hook(tracing),
        None => publisher,
    };
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
    if options.sample {
        spawn_sampler(
            config.clone(),
            telemetry.clone(),
            publisher.context().clone(),
            shutdown.clone(),
        );
    }
    spawn_progress_log(stats.clone(), shutdown.clone());
    background::spawn_outbox_upkeep(config.clone(), telemetry.clone(), shutdown.clone());
    audit::spawn_audit(config.clone(), telemetry.clone(), shutdown.clone());
    if config.relay.sql_signals {
        crate::signal::spawn(config.clone(), telemetry.clone(), shutdown.clone());
    }
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
        accept_slot_position: options.accept_slot_position,
        ever_connected: false,
        refused_logins: 0,
        backfilled_streamed_ids: Default::default(),
        standby: standby::Standby::with_claim(claim),
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
            return Err(Failure::config(anyhow::anyhow!(
                "{problem}; stopped after storing the acknowledged position {}",
                Lsn(stats.confirmed_lsn.load(Ordering::Relaxed))
            )));
        }
        let delay = match end? {
            SessionEnd::Shutdown => {
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
                tracing::info!(confirmed_lsn = %Lsn(stats.confirmed_lsn.load(Ordering::Relaxed)), "stopped cleanly");
                return Ok(());
            }
            _ if shutdown.is_cancelled() => return Ok(()),
            SessionEnd::Retry(error) => {
                telemetry.set_last_error(Some(format!("{error:#}")));
                tracing::warn!(error = %format!("{error:#}"), retry_in = ?backoff, "replication session ended; reconnecting");
                let delay = backoff;
                backoff = (backoff * 2).min(config.relay.reconnect_max);
                delay
            }
            SessionEnd::SlotTaken(error) => {
                // Lost the race for a freed slot: no failure, and no backoff to grow. The next
                // session waits for the winner.
                let delay = config.relay.standby_poll_interval;
                tracing::info!(error = %format!("{error:#}"), retry_in = ?delay, "another process took the slot first; waiting as its standby");
                delay
            }
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => {}
        }
        if shutdown.is_cancelled() {
            return Ok(());
        }
    }
}
