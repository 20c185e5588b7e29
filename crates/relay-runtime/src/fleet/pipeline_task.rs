//! One pipeline's life in the fleet: built, run, started again after an unreachable server's
//! backoff, and handed over when the fleet places it on another process.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::members::Members;
use super::{FleetView, PipelineEntry, PipelineState, named};
use crate::failure::{Failure, FailureKind};
use crate::relay::{Claim, Relay, RelayOptions};

/// One pipeline's life in the fleet: build, run, and on an unreachable server build and run
/// again after a backoff.
pub(super) struct PipelineTask {
    pub(super) entry: PipelineEntry,
    pub(super) options: RelayOptions,
    pub(super) view: FleetView,
    pub(super) stop: CancellationToken,
    pub(super) retry_unavailable: bool,
    pub(super) is_fleet: bool,
    pub(super) members: Option<Arc<Members>>,
}

impl PipelineTask {
    pub(super) async fn run(self, mut built: Option<Relay>) -> Result<(), Failure> {
        let mut backoff = Duration::from_millis(500);
        loop {
            let relay = match built.take() {
                Some(relay) => relay,
                None => Relay::build(self.entry.config.clone(), self.options)
                    .await
                    .map_err(|f| named(f, &self.entry, self.is_fleet))?,
            };
            let relay = match &self.members {
                Some(members) => relay.with_claim(Claim {
                    pipeline: self.entry.name.clone(),
                    policy: members.clone(),
                }),
                None => relay,
            };
            let telemetry = relay.telemetry().clone();
            self.view.update(&self.entry.name, |v| {
                v.telemetry = Some(telemetry.clone());
                v.config = self.entry.config.clone();
            });
            self.view
                .set_state(&self.entry.name, PipelineState::Running);
            // A run ends on the fleet's stop, or when it hands the pipeline over.
            let run_stop = self.stop.child_token();
            let _watch = self.members.as_ref().map(|members| {
                spawn_hand_over_watch(
                    members.clone(),
                    &self.entry.name,
                    telemetry,
                    run_stop.clone(),
                )
            });
            let failure = match relay.run(run_stop.clone()).await {
                Ok(()) if run_stop.is_cancelled() && !self.stop.is_cancelled() => {
                    // Handed over: wait as a standby for it.
                    continue;
                }
                Ok(()) => return Ok(()),
                Err(failure) => failure,
            };
            if !(self.retry_unavailable && failure.kind == FailureKind::Unavailable)
                || self.stop.is_cancelled()
            {
                return Err(named(failure, &self.entry, self.is_fleet));
            }
            let reason = format!("{:#}", failure.error);
            tracing::warn!(error = %reason, retry_in = ?backoff, "pipeline cannot start: a server is unreachable; starting it again after a backoff");
            self.view
                .set_state(&self.entry.name, PipelineState::Retrying { reason });
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = self.stop.cancelled() => return Ok(()),
            }
            backoff = (backoff * 2).min(self.entry.config.relay.reconnect_max);
        }
    }
}

/// Drains the run of `pipeline` (cancels `run_stop`) once it streams here while the fleet
/// places it on another process.
fn spawn_hand_over_watch(
    members: Arc<Members>,
    pipeline: &str,
    telemetry: Arc<relay_telemetry::Telemetry>,
    run_stop: CancellationToken,
) -> tokio_util::sync::DropGuard {
    let pipeline = pipeline.to_owned();
    let watch = CancellationToken::new();
    let ended = watch.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(members.heartbeat_interval());
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = ended.cancelled() => return,
            }
            let streaming = telemetry
                .streaming
                .load(std::sync::atomic::Ordering::Relaxed);
            if streaming && crate::relay::SlotClaim::hand_over(members.as_ref(), &pipeline) {
                tracing::info!(
                    placed_on = %members.placed_on(&pipeline),
                    "fleet: this pipeline is placed on another process; draining it here so that one takes it"
                );
                run_stop.cancel();
                return;
            }
        }
    });
    watch.drop_guard()
}
