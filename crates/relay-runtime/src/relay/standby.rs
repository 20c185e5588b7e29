//! Waiting as a standby. The slot admits one reader, and that is the pair's lock: while another
//! process streams it, a session asks PostgreSQL on its plain connection who holds it, every
//! `[relay] standby_poll_interval`, and goes on with its start (the checks, the stream's tail,
//! START_REPLICATION) only once the slot is free. A waiting relay so costs one small query per
//! interval, not a session start per retry, and logs once that it waits and once that it took
//! over.

use std::time::{Duration, Instant};

use relay_postgres::catalog::slot_holder;
use relay_telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

use super::stop::{Step, Stop, postgres};
use super::{Claim, SessionEnd};

/// What the supervisor remembers of its wait across sessions: a session that loses the race
/// for a freed slot starts over and waits again, as the same wait.
#[derive(Debug, Default)]
pub(super) struct Standby {
    /// When this relay began to wait, until a session of its own streams.
    since: Option<Instant>,
    /// The holder the log last named: another one is named again.
    logged_holder: Option<i32>,
    /// In a fleet run by several processes: a free slot is taken at once only where the
    /// pipeline is placed.
    claim: Option<Claim>,
}

impl Standby {
    pub(super) fn with_claim(claim: Option<Claim>) -> Self {
        Self {
            claim,
            ..Self::default()
        }
    }

    /// Returns once no other process streams `slot` (also when it does not exist: the start-up
    /// checks deal with that) and, in a fleet run by several processes, once the slot has been
    /// free for the placement's grace unless the pipeline is placed here; polls every `poll`
    /// meanwhile. A cancelled `stop` ends the session as a clean shutdown.
    pub(super) async fn wait_while_held(
        &mut self,
        client: &tokio_postgres::Client,
        slot: &str,
        poll: Duration,
        telemetry: &Telemetry,
        stop: &CancellationToken,
    ) -> Step<()> {
        let mut holder = slot_holder(client, slot).await.map_err(postgres)?;
        let mut free_since: Option<Instant> = None;
        let mut logged_placement = false;
        loop {
            match holder {
                Some(pid) => {
                    free_since = None;
                    self.since.get_or_insert_with(Instant::now);
                    telemetry.set_standby(Some(pid));
                    if self.logged_holder != Some(pid) {
                        self.logged_holder = Some(pid);
                        tracing::info!(
                            slot,
                            holder_pid = pid,
                            "replication slot {slot} is in use by another process (pid {pid}); waiting as a standby, checking every {}",
                            humantime_serde::re::humantime::format_duration(poll)
                        );
                    }
                }
                None => {
                    telemetry.set_standby(None);
                    let free = *free_since.get_or_insert_with(Instant::now);
                    let Some(claim) = &self.claim else { break };
                    let grace = claim.policy.grace();
                    if claim.policy.placed_here(&claim.pipeline) || free.elapsed() >= grace {
                        break;
                    }
                    if !std::mem::replace(&mut logged_placement, true) {
                        tracing::info!(
                            slot,
                            "replication slot {slot} is free and this pipeline is placed on another process of the fleet: leaving it to that one for up to {}",
                            humantime_serde::re::humantime::format_duration(grace)
                        );
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(poll) => {}
                () = stop.cancelled() => {
                    telemetry.set_standby(None);
                    return Err(Stop::End(SessionEnd::Shutdown));
                }
            }
            holder = match slot_holder(client, slot).await {
                Ok(holder) => holder,
                Err(e) => {
                    telemetry.set_standby(None);
                    return Err(postgres(e));
                }
            };
        }
        telemetry.set_standby(None);
        if let Some(since) = self.since {
            tracing::debug!(slot, waited = ?since.elapsed(), "replication slot {slot} is free: starting a session on it");
        }
        Ok(())
    }

    /// A session of this relay streams the slot: if it had waited, say that it took over.
    pub(super) fn took_over(&mut self, slot: &str) {
        self.logged_holder = None;
        if let Some(since) = self.since.take() {
            tracing::info!(
                slot,
                waited_seconds = since.elapsed().as_secs_f64(),
                "took over replication slot {slot} after waiting {:.1}s as a standby",
                since.elapsed().as_secs_f64()
            );
        }
    }
}
