//! One replication session, step by step: connect, open the checkpoint store, check the
//! server and the slot, find what the stream already holds, learn the outbox tables, stream.
//! Each step either hands the next one what it needs or ends the session ([`Stop`]): with a
//! retry after a backoff, or with an exit.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use relay_core::Lsn;
use relay_core::failpoint;
use relay_core::pipeline::{Pipeline, PipelineError};
use relay_core::route::{RouteError, Router};
use relay_core::stage::CheckpointStore;
use relay_core::trail::{ReplayRetention, SlotTrail};
use relay_postgres::PgError;
use relay_postgres::PgSource;
use relay_postgres::bootstrap::{self, ExportedSlot, SlotState};
use relay_postgres::checkpoint::PgCheckpointStore;
use tokio_util::sync::CancellationToken;

use super::SessionEnd;
use super::standby::Standby;
use super::stop::{Step, Stop, boundary, postgres, retry};
use crate::config::RelayConfig;
use crate::failure::pg_failure;
use crate::failure::{Failure, FailureKind};
use crate::routing::RouterError;
use relay_telemetry::Telemetry;

/// Consecutive refused logins after the first session before the relay exits with 78.
const MAX_REFUSED_LOGINS: u32 = 3;

/// Runs sessions for [`super::run`]: what one session learns that the next must know.
pub(super) struct Supervisor<'a> {
    pub(super) config: &'a RelayConfig,
    pub(super) publisher: &'a relay_nats::JetStreamPublisher,
    /// Ends the session: a shutdown, or the publication check finding drift.
    pub(super) stop: &'a CancellationToken,
    pub(super) telemetry: &'a Arc<Telemetry>,
    /// `--accept-slot-position`: used by the first session that finds the slot ahead.
    pub(super) accept_slot_position: bool,
    /// A session once reached PostgreSQL: from then on, unreachable means "wait".
    pub(super) ever_connected: bool,
    /// Logins refused in a row after the relay had run.
    pub(super) refused_logins: u32,
    /// Event ids a resumed backfill at slot creation published that the slot streams too
    /// (`on_create::run`): the live pipeline does not publish them again.
    pub(super) backfilled_streamed_ids: std::collections::HashMap<String, u64>,
    /// Waiting while another process streams the slot.
    pub(super) standby: Standby,
}

impl Supervisor<'_> {
    /// One replication session: connect, check, resume from the checkpoint, stream.
    pub(super) async fn session(&mut self) -> Result<SessionEnd, Failure> {
        match self.steps().await {
            Ok(end) | Err(Stop::End(end)) => Ok(end),
            Err(Stop::Fail(exit)) => Err(exit),
        }
    }

    async fn steps(&mut self) -> Step<SessionEnd> {
        // `server`: the settings bound to the host reached (the read-write one of a multi-host
        // URL), so the replication session streams where the checkpoint is stored.
        let (client, server) = self.connect().await?;
        // Before anything costly: a standby waits here, on this connection, for the slot.
        self.standby
            .wait_while_held(
                &client,
                &self.config.postgres.slot,
                self.config.relay.standby_poll_interval,
                self.telemetry,
                self.stop,
            )
            .await?;
        let mut store = PgCheckpointStore::new(client, &self.config.postgres.slot)
            .await
            .map_err(|e| boundary(e, None))?
            .with_position_retention(self.config.relay.position_retention);
        let export = super::on_create::before_prepare(self.config, store.client()).await?;
        let (state, exported) = self.prepare(&mut store, export).await?;
        self.check_cleanup_columns(store.client()).await?;
        let backfills = if export {
            super::on_create::prepare(self.config, &server, store.client(), exported).await?
        } else {
            None
        };
        let start = self.resume_position(&mut store, &state).await?;
        // Rows from before the slot first (backfill = "on-create"): streaming waits for them.
        let streamed = match backfills {
            Some(backfills) => {
                super::on_create::run(self.config, &server, store.client(), backfills, self.stop)
                    .await?
            }
            None => Default::default(),
        };
        let already_published = self.already_published(start, streamed).await?;
        super::sequence_check::check_stream_sequence(
            self.config,
            store.client(),
            self.publisher.context(),
            self.telemetry,
        )
        .await;
        self.resend_zone_alone(&store).await?;
        let router = self.router(&store).await?;
        let trail = self.slot_trail(&store, &state, start).await;
        let ack = trail.as_ref().map_or(start, |(_, floor)| *floor);
        failpoint::pause("before_start_replication").await;
        let source = PgSource::start(&server, start, ack)
            .await
            .map_err(|e| boundary(e, None))?;
        self.telemetry
            .stats
            .slot_confirmed_lsn
            .store(ack.min(start).0, Ordering::Relaxed);
        self.telemetry.streaming.store(true, Ordering::Relaxed);
        self.telemetry.set_last_error(None);
        // systemd (Type=notify): ready once replication streams; repeated READY=1 is harmless.
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
        tracing::info!(slot = %self.config.postgres.slot, lsn = %start, "streaming");
        self.standby.took_over(&self.config.postgres.slot);
        let mut pipeline = Pipeline::new(
            source,
            self.publisher.clone(),
            store,
            router,
            start,
            self.config.relay.pipeline_config(),
            self.telemetry.stats.clone(),
        );
        pipeline.skip_published(already_published);
        if let Some((trail, _)) = trail {
            pipeline.trail_slot(trail);
        }
        let result = pipeline.run(self.stop.cancelled()).await;
        let (source, _, _) = pipeline.into_parts();
        self.ended(source, result).await
    }

    /// The events past the checkpoint `start` the stream already holds (its tail), and those a
    /// backfill at slot creation published that the slot streams too (`streamed`): the
    /// pipeline does not publish them again.
    async fn already_published(
        &mut self,
        start: Lsn,
        streamed: std::collections::HashMap<String, u64>,
    ) -> Step<std::collections::HashMap<String, u64>> {
        let mut already_published = relay_nats::published_since(
            self.publisher.jetstream(),
            &self.config.nats.stream,
            start,
            self.config.relay.max_in_flight as u64 * 2,
        )
        .await
        .map_err(retry)?;
        if !already_published.is_empty() {
            tracing::info!(
                count = already_published.len(),
                checkpoint = %start,
                "events past the checkpoint are already in the stream; they will not be published again"
            );
        }
        // Kept for later sessions too: a reconnect before the stream passed those rows would
        // otherwise publish them again.
        self.backfilled_streamed_ids.extend(streamed);
        for (id, seq) in &self.backfilled_streamed_ids {
            already_published.entry(id.clone()).or_insert(*seq);
        }
        Ok(already_published)
    }

    /// In fast-batch mode: an earlier run may have published anything committed before now;
    /// what of it the stream does not hold goes out on its own, so a `duplicate` answer says so
    /// (a fast batch's flow acks do not) and is read back.
    async fn resend_zone_alone(&self, store: &PgCheckpointStore) -> Result<(), Stop> {
        if !self.publisher.framing().fast_batches() {
            return Ok(());
        }
        let now = relay_postgres::catalog::current_wal_lsn(store.client())
            .await
            .map_err(postgres)?;
        self.publisher.alone_through(now);
        tracing::info!(through = %now, "fast batches resume after what an earlier run may have published; until then each message goes on its own");
        Ok(())
    }

    /// Connects a plain session. Unreachable at start-up: exit; later, wait for it to come
    /// back. A refused login after the relay had run gets a few quick retries (a secret file
    /// updated a moment after the role), then exits instead of looping.
    async fn connect(
        &mut self,
    ) -> Step<(tokio_postgres::Client, relay_postgres::PostgresSettings)> {
        let pg = &self.config.postgres;
        let connected = match relay_postgres::connect_primary(pg).await {
            Ok(connected) => connected,
            Err(e) if self.ever_connected && e.is_transient() => return Err(retry(e)),
            Err(e) if self.ever_connected => {
                self.refused_logins += 1;
                let who = pg.parts().map(|p| p.user).unwrap_or_default();
                let message = format!(
                    "PostgreSQL at {} refused the login of role `{who}` ({} of {MAX_REFUSED_LOGINS} attempts) after the relay had run: check the role (LOGIN, password, pg_hba.conf, certificate) and postgres.password / password_file / sslcert",
                    pg.display_target(),
                    self.refused_logins
                );
                let error = anyhow::Error::new(e).context(message);
                if self.refused_logins >= MAX_REFUSED_LOGINS {
                    return Err(Failure::config(error).into());
                }
                return Err(retry(error));
            }
            Err(e) => return Err(pg_failure(e).into()),
        };
        self.ever_connected = true;
        self.refused_logins = 0;
        if connected.1.is_pinned() {
            tracing::info!(server = %connected.1.display_target(), "connected to the read-write server of postgres.url");
        }
        Ok(connected)
    }

    /// The start-up checks against the stored checkpoint; with `--accept-slot-position`, a
    /// slot ahead of the checkpoint moves the checkpoint there once (then the session retries).
    async fn prepare(
        &mut self,
        store: &mut PgCheckpointStore,
        export: bool,
    ) -> Step<(SlotState, Option<ExportedSlot>)> {
        let slot = self.config.postgres.slot.as_str();
        let checkpoint = store.load().await.map_err(|e| boundary(e, None))?;
        failpoint::pause("after_checkpoint_read").await;
        let tables = self.config.published_tables();
        match bootstrap::prepare_slot(
            store.client(),
            &self.config.postgres,
            &tables,
            checkpoint,
            export,
        )
        .await
        {
            Ok(prepared) => Ok(prepared),
            Err(PgError::SlotAhead {
                slot_lsn,
                checkpoint,
                ..
            }) if self.accept_slot_position => {
                tracing::warn!(slot, slot_lsn = %slot_lsn, checkpoint = %checkpoint, "accepting the slot's position: events committed in between were not published by this relay");
                store
                    .overwrite(slot_lsn)
                    .await
                    .map_err(|e| boundary(e, None))?;
                self.accept_slot_position = false;
                Err(retry(anyhow::anyhow!(
                    "checkpoint moved to the slot's position {slot_lsn}"
                )))
            }
            Err(e) => Err(postgres(e)),
        }
    }

    /// Refuses to run cleanup on a time column its settings do not fit (a `bigint` without
    /// `age_unit`, a `timestamp without time zone` without `age_time_zone`, a type that is no
    /// time): rows would be cleaned by a guess, perhaps early.
    async fn check_cleanup_columns(&self, client: &tokio_postgres::Client) -> Step<()> {
        for (table, cleanup) in self.config.outbox.cleanup() {
            let (schema, name) = table.qualified_name();
            let problem = cleanup
                .time_column_problem(client, &schema, &name)
                .await
                .map_err(|e| {
                    postgres(PgError::Query {
                        context: format!("cannot read the time column of {}", table.display_name()),
                        source: e,
                    })
                })?;
            if let Some(problem) = problem {
                return Err(Failure::config(anyhow::anyhow!("{problem}")).into());
            }
        }
        Ok(())
    }

    /// Where this session resumes: the stored checkpoint, or on a slot's first run its
    /// position, stored now so that a lost slot is detected later.
    async fn resume_position(&self, store: &mut PgCheckpointStore, state: &SlotState) -> Step<Lsn> {
        let slot = self.config.postgres.slot.as_str();
        let (start, _) = store
            .resume_position(state.checkpoint, state.confirmed_flush_lsn)
            .await
            .map_err(|e| boundary(e, None))?;
        tracing::info!(
            slot,
            publication = %self.config.postgres.publication,
            checkpoint = %start,
            slot_confirmed_flush_lsn = %state.confirmed_flush_lsn,
            slot_restart_lsn = ?state.slot.restart_lsn.map(|l| l.to_string()),
            wal_status = ?state.slot.wal_status,
            slot_created = state.created,
            "resuming from the stored checkpoint"
        );
        Ok(start)
    }

    /// With `[relay] replay_retention`: the trail of the slot behind the checkpoint `start`, and
    /// where it starts (the position reported to the slot until the first checkpoint). The
    /// session still streams from `start`: the server skips the retained window.
    async fn slot_trail(
        &self,
        store: &PgCheckpointStore,
        state: &SlotState,
        start: Lsn,
    ) -> Option<(SlotTrail, Lsn)> {
        let retention = self.config.relay.replay_retention?;
        let slot = self.config.postgres.slot.as_str();
        // Already confirmed: the slot never goes back. A window in time: the newest anchor of
        // the position map committed that long ago is old enough to confirm now.
        let mut floor = state.confirmed_flush_lsn;
        match retention {
            ReplayRetention::Time(window) => {
                match relay_postgres::checkpoint::anchor_older_than(store.client(), slot, window)
                    .await
                {
                    Ok(Some(anchor)) => floor = floor.max(anchor),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(slot, error = %e, "cannot read the position map for the replay retention");
                    }
                }
            }
            ReplayRetention::Bytes(bytes) => floor = floor.max(Lsn(start.0.saturating_sub(bytes))),
        }
        let floor = floor.min(start);
        tracing::info!(
            slot,
            replay_retention = %retention,
            checkpoint = %start,
            slot_confirmed = %floor,
            retained_bytes = start.0 - floor.0,
            "replay retention: the slot is confirmed behind the checkpoint, so PostgreSQL keeps that WAL for `outbox-relay restore`; streaming resumes at the checkpoint"
        );
        let trail = SlotTrail::new(retention, floor, start, tokio::time::Instant::now());
        Some((trail, floor))
    }

    /// The router, with the outbox tables bound to the OIDs the catalog gives them now.
    async fn router(&self, store: &PgCheckpointStore) -> Step<Router> {
        crate::routing::bound_router(self.config, store.client())
            .await
            .map_err(|e| match e {
                RouterError::Mapping(_) => Failure::config(e).into(),
                RouterError::Postgres(e) => postgres(e),
            })
    }

    /// How the session ended: a clean stop or an ended stream, a retry, or an exit that says
    /// where the confirmed position stays.
    async fn ended(
        &self,
        source: PgSource,
        result: Result<relay_core::pipeline::RunOutcome, PipelineError>,
    ) -> Step<SessionEnd> {
        let stop_wait = self
            .config
            .postgres
            .status_interval
            .min(Duration::from_secs(5));
        let confirmed = || Lsn(self.telemetry.stats.confirmed_lsn.load(Ordering::Relaxed));
        match result {
            Ok(outcome) => {
                source.stop(stop_wait).await;
                if self.stop.is_cancelled() {
                    tracing::info!(confirmed_lsn = %outcome.confirmed, abandoned = outcome.abandoned, "drained");
                    Ok(SessionEnd::Shutdown)
                } else {
                    Err(retry(anyhow::anyhow!("replication stream ended")))
                }
            }
            Err(PipelineError::Source(e)) => Err(boundary(e, None)),
            Err(PipelineError::Store { error, lsn }) => {
                Err(boundary(error, Some(format!("storing checkpoint {lsn}"))))
            }
            Err(PipelineError::Route {
                error: RouteError::NonTransactional { prefix, lsn },
                ..
            }) => {
                // The cause and the fixes first: the mapping is not what is wrong.
                source.stop(stop_wait).await;
                Err(Failure::new(
                    FailureKind::DataSafety,
                    anyhow::anyhow!(
                        "stopped at a non-transactional logical message (pg_logical_emit_message(false, …)) with prefix `{prefix}` at LSN {lsn}: PostgreSQL delivers such a message even when its transaction rolled back, so the relay does not publish it unless told to. Every restart stops at this same message until one of these is done: set allow_non_transactional = true on [[messages]] prefix \"{prefix}\" (publish it, rolled back or not), or set [relay] dead_letter_subject (park it there); and emit such messages transactionally from now on (pg_logical_emit_message(true, …) or outbox_relay.emit_event). Confirmed position stays at {}",
                        confirmed()
                    ),
                )
                .into())
            }
            Err(e @ (PipelineError::Route { .. } | PipelineError::Publish { .. })) => {
                source.stop(stop_wait).await;
                Err(Failure::new(FailureKind::DataSafety, {
                    let advice = super::stop::stop_advice(
                        &e,
                        self.config.relay.dead_letter_subject.is_some(),
                    );
                    anyhow::Error::new(e).context(format!(
                        "stopped before this transaction; confirmed position stays at {}. {advice}",
                        confirmed()
                    ))
                })
                .into())
            }
            Err(e @ PipelineError::Schema { .. }) => {
                source.stop(stop_wait).await;
                Err(Failure::config(anyhow::Error::new(e).context(format!(
                    "stopped before this transaction; confirmed position stays at {}, and the relay resumes there once the configuration matches the table",
                    confirmed()
                )))
                .into())
            }
            Err(e @ PipelineError::AcksNotHeld { .. }) => {
                // Not JetStream's word (a forged answer), or a stream that no longer holds it:
                // a new session resumes at the stored checkpoint and publishes them again.
                source.stop(stop_wait).await;
                tracing::error!(error = %e, "acknowledgements the stream cannot hold: resuming from the stored checkpoint; if this repeats, someone else answers the relay's reply subjects (set [nats] inbox_prefix, docs/security.md) or the stream was reset");
                Err(retry(e))
            }
            Err(e @ PipelineError::Protocol(_)) => Err(Failure::internal(e).into()),
        }
    }
}
