//! What failover needs, as `status --json` and `/status` show it.

use relay_core::check::{CheckReport, check_reports};
use serde::{Deserialize, Serialize};

use super::{FailoverCheck, FailoverFacts};

/// The facts that matter for a failover and every check (or why there are none:
/// `postgres.failover = true` on a server without failover slots).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverReport {
    /// `primary` or `standby`.
    pub server: String,
    /// `server_version_num`.
    pub version_num: i32,
    /// The server's timeline.
    pub timeline: Option<u32>,
    /// The slot's flags; `None` when it is missing.
    pub slot: Option<SlotFailoverReport>,
    /// `synchronized_standby_slots` (a primary's).
    pub synchronized_standby_slots: Option<Vec<String>>,
    /// The standbys streaming from a primary.
    pub standbys: Option<Vec<StandbyReport>>,
    /// Each check, when they could be made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<Vec<CheckReport>>,
    /// Why there are no checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The slot's failover flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotFailoverReport {
    /// `failover`.
    pub failover: bool,
    /// `synced`.
    pub synced: bool,
    /// `temporary`.
    pub temporary: bool,
    /// `invalidation_reason`.
    pub invalidated: Option<String>,
    /// Its confirmed position.
    pub confirmed_flush_lsn: Option<String>,
}

/// A standby streaming from the primary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StandbyReport {
    /// `application_name`.
    pub name: String,
    /// `client_addr`.
    pub client_addr: Option<String>,
    /// `state`.
    pub state: Option<String>,
    /// The physical slot it streams from.
    pub slot: Option<String>,
}

/// For `status --json` and `/status`: `facts` and `checks` (or why there are none).
pub fn report(
    facts: &FailoverFacts,
    checks: &Result<Vec<FailoverCheck>, crate::PgError>,
) -> FailoverReport {
    let (checks, error) = match checks {
        Ok(checks) => (Some(check_reports(checks)), None),
        Err(e) => (None, Some(e.to_string())),
    };
    FailoverReport {
        server: if facts.in_recovery {
            "standby"
        } else {
            "primary"
        }
        .to_owned(),
        version_num: facts.version_num,
        timeline: facts.timeline,
        slot: facts.slot.as_ref().map(|s| SlotFailoverReport {
            failover: s.failover,
            synced: s.synced,
            temporary: s.temporary,
            invalidated: s.invalidated.clone(),
            confirmed_flush_lsn: s.confirmed_flush_lsn.map(|l| l.to_string()),
        }),
        synchronized_standby_slots: facts
            .primary
            .as_ref()
            .map(|p| p.synchronized_standby_slots.clone()),
        standbys: facts.primary.as_ref().map(|p| {
            p.standbys
                .iter()
                .map(|s| StandbyReport {
                    name: s.name.clone(),
                    client_addr: s.client_addr.clone(),
                    state: s.state.clone(),
                    slot: s.slot.clone(),
                })
                .collect()
        }),
        checks,
        error,
    }
}
