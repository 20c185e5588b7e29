//! `verify`: whether every event committed in a window is in the stream, checked against the
//! WAL itself. The window is decoded from a copy of the slot as `restore --dry-run` does: each
//! event is routed as the relay routed it, and an event whose `Nats-Msg-Id` the stream does not
//! hold is a gap. Nothing is published, the slot and the checkpoint are not touched. A window
//! the slot no longer keeps WAL for cannot be checked, and says so: never "no gap".

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use relay_core::Lsn;
use relay_core::stage::WouldPublish;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::RestoreRequest;
use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind};
use crate::progress::{Mode, Say};

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// The stream checked.
    pub stream: String,
    /// The window `[from, to)` asked for (`to`: the stored checkpoint when not given).
    pub from: String,
    pub to: Option<String>,
    /// Whether a window was checked at all (`false`: it was empty).
    pub checked: bool,
    /// Events of the window the stream does not hold.
    pub missing_count: u64,
    /// The first of them (at most 1,000), in commit order.
    pub missing: Vec<MissingEvent>,
    /// The decode's summary line.
    pub summary: Option<String>,
}

/// An event committed in the window that the stream does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MissingEvent {
    pub event_id: String,
    pub commit_lsn: String,
}

/// Checks the window `[from, to)` (`to`: at most the stored checkpoint). A window the slot
/// keeps no WAL for fails naming what cannot be checked.
pub async fn verify(
    config: &RelayConfig,
    from: Lsn,
    to: Option<Lsn>,
    progress_mode: Mode,
    say: Say,
    shutdown: &CancellationToken,
) -> Result<VerifyReport, Failure> {
    let record = Arc::new(WouldPublish::default());
    let request = RestoreRequest {
        from_lsn: from,
        to_lsn: to,
        dry_run: true,
        max_in_flight: 1024,
        progress_interval: Duration::from_secs(5),
        progress_mode,
        say,
        would_publish: Some(record.clone()),
    };
    let summary = super::restore(config, &request, shutdown)
        .await
        .map_err(|f| Failure {
            kind: f.kind,
            error: f.error.context(format!(
                "cannot verify the events committed from {from}: nothing was checked, so this is no statement that the stream holds them"
            )),
        })?;
    let first = record
        .first
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(VerifyReport {
        stream: config.nats.stream.clone(),
        from: from.to_string(),
        to: to.map(|l| l.to_string()),
        checked: summary.is_some(),
        missing_count: record.count.load(Ordering::Relaxed),
        missing: first
            .into_iter()
            .map(|(event_id, lsn)| MissingEvent {
                event_id,
                commit_lsn: lsn.to_string(),
            })
            .collect(),
        summary,
    })
}

impl VerifyReport {
    /// A gap is a data-safety finding (exit 65), naming the first missing event and the
    /// restore that brings the window back.
    pub fn verdict(&self) -> Result<(), Failure> {
        let Some(first) = self.missing.first() else {
            return Ok(());
        };
        Err(Failure::new(
            FailureKind::DataSafety,
            anyhow::anyhow!(
                "gap: {} events committed in the window are not in stream `{}` (the first: event {} of commit LSN {}); publish them again with `outbox-relay restore --from-lsn {}`",
                self.missing_count,
                self.stream,
                first.event_id,
                first.commit_lsn,
                first.commit_lsn
            ),
        ))
    }
}
