//! The WAL kept behind the stored checkpoint for `outbox-relay restore` (`[relay]
//! replay_retention`): the slot's confirmed position trails the checkpoint, and restore can go
//! back to it. For `validate --connect` and `status`, with a warning when the window nears
//! `max_slot_wal_keep_size` (past it PostgreSQL invalidates the slot, and the relay stops).

use std::time::{Duration, SystemTime};

use relay_core::Lsn;
use serde_json::Value;
use tokio_postgres::Client;

use crate::catalog::retention::{bytes, duration, settings};

/// A window at or above this share of `max_slot_wal_keep_size` is warned about.
const NEAR: f64 = 0.8;

/// What the slot keeps behind the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayWindow {
    /// The stored checkpoint.
    pub checkpoint: Option<Lsn>,
    /// The slot's confirmed position: the oldest commit restore can start at.
    pub confirmed_flush: Option<Lsn>,
    /// The oldest WAL the slot keeps (decoding state).
    pub restart_lsn: Option<Lsn>,
    /// WAL kept from `restart_lsn` to the insert position.
    pub retained_bytes: Option<i64>,
    /// Commit time of the newest position map anchor at or before `confirmed_flush`.
    pub since: Option<SystemTime>,
    /// `max_slot_wal_keep_size` in bytes (`None`: unlimited).
    pub max_slot_wal_keep_size: Option<u64>,
}

/// Reads the window of `slot`.
pub async fn replay_window(
    client: &Client,
    slot: &str,
) -> Result<ReplayWindow, tokio_postgres::Error> {
    let settings = settings(client).await?;
    let info = crate::catalog::slot(client, slot).await?;
    let checkpoint = crate::catalog::stored_checkpoint(client, slot)
        .await?
        .map(|(lsn, _)| lsn);
    let confirmed_flush = info.as_ref().and_then(|s| s.confirmed_flush_lsn);
    let since = match confirmed_flush {
        Some(lsn)
            if crate::catalog::relay_tables::position_map_access(client).await?
                == crate::catalog::relay_tables::TableAccess::Usable =>
        {
            super::anchor_at_or_before(client, slot, lsn)
                .await?
                .map(|a| a.commit_time)
        }
        _ => None,
    };
    Ok(ReplayWindow {
        checkpoint,
        confirmed_flush,
        restart_lsn: info.as_ref().and_then(|s| s.restart_lsn),
        retained_bytes: info.as_ref().and_then(|s| s.retained_bytes),
        since,
        max_slot_wal_keep_size: settings.max_slot_wal_keep_size,
    })
}

impl ReplayWindow {
    /// Bytes of WAL between the slot's confirmed position and the checkpoint.
    pub(crate) fn kept_bytes(&self) -> Option<u64> {
        Some(self.checkpoint?.0.saturating_sub(self.confirmed_flush?.0))
    }

    /// One line: how far back restore can go.
    pub fn summary(&self) -> String {
        let (Some(checkpoint), Some(confirmed)) = (self.checkpoint, self.confirmed_flush) else {
            return "no stored checkpoint or no slot: nothing to restore from".into();
        };
        let kept = checkpoint.0.saturating_sub(confirmed.0);
        let since = self.since.map_or_else(
            || " (commit time unknown: no position map anchor that old)".to_owned(),
            |t| {
                let age = SystemTime::now().duration_since(t).unwrap_or_default();
                format!(
                    ", events committed since about {} ({} ago)",
                    humantime_serde::re::humantime::format_rfc3339_seconds(t),
                    duration(Duration::from_secs(age.as_secs()))
                )
            },
        );
        format!(
            "restore can go back to commit LSN {confirmed}: {} of WAL behind the checkpoint {checkpoint}{since}; restart_lsn {}, {} of WAL kept in all",
            bytes(kept as f64),
            self.restart_lsn
                .map_or_else(|| "?".into(), |l| l.to_string()),
            self.retained_bytes
                .map_or_else(|| "?".into(), |b| bytes(b as f64)),
        )
    }

    /// A warning (detail, hint) when the window nears or passes `max_slot_wal_keep_size`:
    /// `setting_bytes` is `[relay] replay_retention` when given as a size.
    pub fn warning(&self, setting_bytes: Option<u64>) -> Option<(String, String)> {
        let limit = self.max_slot_wal_keep_size?;
        let hint = "raise max_slot_wal_keep_size or shorten [relay] replay_retention: past the limit PostgreSQL invalidates the slot (wal_status lost) and the relay stops (exit 65)".to_owned();
        let near = |n: u64| n as f64 >= limit as f64 * NEAR;
        let word = |n: u64| if n >= limit { "over" } else { "near" };
        if let Some(b) = setting_bytes.filter(|b| near(*b)) {
            return Some((
                format!(
                    "[relay] replay_retention keeps {} behind the checkpoint, {} max_slot_wal_keep_size ({})",
                    bytes(b as f64),
                    word(b),
                    bytes(limit as f64)
                ),
                hint,
            ));
        }
        let retained = u64::try_from(self.retained_bytes?).ok()?;
        near(retained).then(|| {
            (
                format!(
                    "the slot keeps {} of WAL, {} max_slot_wal_keep_size ({}); {} of it is the replay window behind the checkpoint",
                    bytes(retained as f64),
                    word(retained),
                    bytes(limit as f64),
                    bytes(self.kept_bytes().unwrap_or(0) as f64)
                ),
                hint,
            )
        })
    }

    /// For `status --json`.
    #[must_use]
    pub fn report(&self, setting_bytes: Option<u64>) -> ReplayWindowReport {
        let warning = self.warning(setting_bytes);
        ReplayWindowReport {
            checkpoint: self.checkpoint.map(|l| l.to_string()),
            restore_from_lsn: self.confirmed_flush.map(|l| l.to_string()),
            restart_lsn: self.restart_lsn.map(|l| l.to_string()),
            window_bytes: self.kept_bytes(),
            retained_wal_bytes: self.retained_bytes,
            since: self
                .since
                .map(|t| humantime_serde::re::humantime::format_rfc3339_seconds(t).to_string()),
            max_slot_wal_keep_size: self.max_slot_wal_keep_size,
            summary: self.summary(),
            warning: warning.as_ref().map(|(d, _)| d.clone()),
            hint: warning.map(|(_, h)| h),
        }
    }

    /// For `status --json`.
    pub fn to_json(&self, setting_bytes: Option<u64>) -> Value {
        serde_json::to_value(self.report(setting_bytes)).unwrap_or_default()
    }
}

/// The replay window as `status --json` shows it (see [`ReplayWindow`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplayWindowReport {
    /// The stored checkpoint.
    pub checkpoint: Option<String>,
    /// Where `outbox-relay restore` can replay from (the slot's confirmed position).
    pub restore_from_lsn: Option<String>,
    /// The oldest WAL the slot keeps.
    pub restart_lsn: Option<String>,
    /// Bytes of WAL between the replay start and the checkpoint.
    pub window_bytes: Option<u64>,
    /// WAL the slot keeps.
    pub retained_wal_bytes: Option<i64>,
    /// When the replay window starts.
    pub since: Option<String>,
    /// `max_slot_wal_keep_size`.
    pub max_slot_wal_keep_size: Option<u64>,
    /// One line.
    pub summary: String,
    /// A warning, when near or over a limit.
    pub warning: Option<String>,
    /// Its fix.
    pub hint: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(retained: i64, limit: Option<u64>) -> ReplayWindow {
        ReplayWindow {
            checkpoint: Some(Lsn(10_000)),
            confirmed_flush: Some(Lsn(4_000)),
            restart_lsn: Some(Lsn(3_000)),
            retained_bytes: Some(retained),
            since: None,
            max_slot_wal_keep_size: limit,
        }
    }

    #[test]
    fn warns_near_and_over_the_limit() {
        assert_eq!(window(1_000, Some(10_000)).warning(None), None);
        assert_eq!(window(1_000, None).warning(Some(u64::MAX)), None);
        let (detail, _) = window(8_500, Some(10_000)).warning(None).unwrap();
        assert!(detail.contains("near"), "{detail}");
        let (detail, _) = window(1_000, Some(10_000)).warning(Some(20_000)).unwrap();
        assert!(detail.contains("over"), "{detail}");
        assert_eq!(window(1_000, Some(10_000)).kept_bytes(), Some(6_000));
    }
}
