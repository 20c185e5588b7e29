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

use super::SessionEnd;
use super::stop::{Step, Stop, postgres};

/// What the supervisor remembers of its wait across sessions: a session that loses the race
/// for a freed slot starts over and waits again, as the same wait.
#[derive(Debug, Default)]
pub(super) struct Standby {
    /// When this relay began to wait, until a session of its own streams.
    since: Option<Instant>,
    /// The holder the log last named: another one is named again.
    logged_holder: Option<i32>,
}

impl Standby {
    /// Returns once no other process streams `slot` (also when it does not exist: the start-up
    /// checks deal with that); polls every `poll` while one does. A cancelled `stop` ends the
    /// session as a clean shutdown.
    pub(super) async fn wait_while_held(
        &mut self,
        client: &tokio_postgres::Client,
        slot: &str,
        poll: Duration,
        telemetry: &Telemetry,
        stop: &CancellationToken,
    ) -> Step<()> {
        let Some(mut holder) = slot_holder(client, slot).await.map_err(postgres)? else {
            return Ok(());
        };
        let since = *self.since.get_or_insert_with(Instant::now);
        loop {
            telemetry.set_standby(Some(holder));
            if self.logged_holder != Some(holder) {
                self.logged_holder = Some(holder);
                tracing::info!(
                    slot,
                    holder_pid = holder,
                    "replication slot {slot} is in use by another process (pid {holder}); waiting as a standby, checking every {}",
                    humantime_serde::re::humantime::format_duration(poll)
                );
            }
            tokio::select! {
                () = tokio::time::sleep(poll) => {}
                () = stop.cancelled() => {
                    telemetry.set_standby(None);
                    return Err(Stop::End(SessionEnd::Shutdown));
                }
            }
            match slot_holder(client, slot).await {
                Ok(Some(pid)) => holder = pid,
                Ok(None) => break,
                Err(e) => {
                    telemetry.set_standby(None);
                    return Err(postgres(e));
                }
            }
        }
        telemetry.set_standby(None);
        tracing::debug!(slot, waited = ?since.elapsed(), "replication slot {slot} is free: starting a session on it");
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
