//! The continuous audit (`[relay] audit_interval`, with `replay_retention`): every interval the
//! relay checks the events of the whole window the slot keeps WAL for (from the slot's
//! confirmed position to the stored checkpoint: what `replay_retention` keeps) against the
//! stream, as `outbox-relay verify` does (a copy of
//! the slot, decoded and routed, each `Nats-Msg-Id` looked up in the stream). A gap is logged
//! naming the events and the restore that brings them back, and shown in the metrics; with
//! `audit_heal` the relay publishes them again itself (as `outbox-relay restore`). The audit
//! runs beside the sessions, on connections of its own, and never moves the slot or the
//! stored checkpoint.
//!
//! The whole window, every time: a message is lost from the stream whenever it is (a delete, a
//! purge, a crash), not only while it is new. The cost of one audit grows with the window:
//! choose `audit_interval` for `replay_retention` (docs/replay.md).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use relay_core::Lsn;
use relay_telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

use crate::config::RelayConfig;
use crate::progress::Mode;
use crate::restore::{self, RestoreRequest, VerifyReport};

/// Starts the audit when `[relay] audit_interval` is set.
pub(super) fn spawn_audit(config: RelayConfig, telemetry: Arc<Telemetry>, stop: CancellationToken) {
    let Some(interval) = config.relay.audit_interval else {
        return;
    };
    telemetry.audit.enabled.store(true, Ordering::Relaxed);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = stop.cancelled() => return,
            }
            match audit_once(&config, &telemetry, &stop).await {
                Ok(()) => {}
                Err(error) => {
                    telemetry.audit.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %format!("{error:#}"), "audit: the window could not be checked; trying again at the next audit");
                }
            }
        }
    });
}

/// One audit of the kept window: from the oldest WAL the slot keeps to the stored checkpoint.
async fn audit_once(
    config: &RelayConfig,
    telemetry: &Telemetry,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let to = Lsn(telemetry.stats.confirmed_lsn.load(Ordering::Relaxed));
    let from = oldest_kept(config).await?;
    if to.0 == 0 || from >= to {
        return Ok(());
    }
    let quiet: crate::progress::Say = Arc::new(|line: &str| tracing::debug!("audit: {line}"));
    let report = restore::verify(config, from, Some(to), Mode::Lines, quiet.clone(), stop)
        .await
        .map_err(|f| f.error)?;
    telemetry.audit.runs.fetch_add(1, Ordering::Relaxed);
    telemetry
        .audit
        .missing
        .store(report.missing_count, Ordering::Relaxed);
    let Some(first) = report.missing.first() else {
        tracing::debug!(from = %from, to = %to, "audit: every event of the window is in the stream");
        return Ok(());
    };
    tracing::error!(
        from = %from,
        to = %to,
        missing = report.missing_count,
        first_event = %first.event_id,
        first_commit_lsn = %first.commit_lsn,
        "audit: {} confirmed events are missing from stream `{}` (the first: event {} of commit LSN {}); {}",
        report.missing_count,
        report.stream,
        first.event_id,
        first.commit_lsn,
        if config.relay.audit_heal {
            "publishing them again from the WAL ([relay] audit_heal)"
        } else {
            "publish them again with `outbox-relay restore --from-lsn` that LSN, or set [relay] audit_heal = true"
        }
    );
    if config.relay.audit_heal {
        heal(config, telemetry, &report, to, quiet, stop).await?;
    }
    Ok(())
}

/// Publishes the window's missing events again, from the first one's commit on.
async fn heal(
    config: &RelayConfig,
    telemetry: &Telemetry,
    report: &VerifyReport,
    to: Lsn,
    say: crate::progress::Say,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let Some(first) = report.missing.first() else {
        return Ok(());
    };
    let from: Lsn = first
        .commit_lsn
        .parse()
        .map_err(|_| anyhow::anyhow!("the commit LSN `{}` does not parse", first.commit_lsn))?;
    let request = RestoreRequest {
        from_lsn: from,
        to_lsn: Some(to),
        dry_run: false,
        max_in_flight: config.relay.max_in_flight.min(1024),
        progress_interval: Duration::from_secs(30),
        progress_mode: Mode::Lines,
        say,
        would_publish: None,
    };
    let summary = restore::restore(config, &request, stop)
        .await
        .map_err(|f| f.error)?;
    telemetry
        .audit
        .healed
        .fetch_add(report.missing_count, Ordering::Relaxed);
    tracing::info!(
        summary = summary.unwrap_or_default(),
        "audit: published the missing events again; the next audit checks the window again"
    );
    Ok(())
}

/// The oldest commit the slot's WAL still has: its confirmed position.
async fn oldest_kept(config: &RelayConfig) -> anyhow::Result<Lsn> {
    let client = relay_postgres::connect(&config.postgres).await?;
    let slot = relay_postgres::catalog::slot(&client, &config.postgres.slot)
        .await?
        .ok_or_else(|| {
            anyhow::anyhow!("replication slot `{}` does not exist", config.postgres.slot)
        })?;
    slot.confirmed_flush_lsn.ok_or_else(|| {
        anyhow::anyhow!(
            "replication slot `{}` has no confirmed position",
            config.postgres.slot
        )
    })
}
