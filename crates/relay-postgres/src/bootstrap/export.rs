//! Creating the slot on a replication connection with an exported snapshot, for
//! `backfill = "on-create"`.
//!
//! `CREATE_REPLICATION_SLOT … LOGICAL pgoutput (SNAPSHOT 'export')` returns the slot's
//! consistent point and the name of a snapshot that sees exactly the transactions the slot
//! will *not* stream (those committed before the consistent point). The snapshot lives until
//! the next command on that connection or its end, so the connection is kept open, idle,
//! until another session imported it (`SET TRANSACTION SNAPSHOT`): [`ExportedSlot`] owns it.
//! pgwire-replication's gated session (`connect_gated` + `simple_query`) runs the command on an
//! authenticated replication connection without starting replication; tokio-postgres cannot
//! open a `replication=database` connection.

use std::str::FromStr as _;

use pgwire_replication::{PgWireError, ReplicationClient};
use relay_core::Lsn;

use crate::sqlstate::{SqlStateKind, wire_sqlstate};
use crate::{PgError, PostgresSettings};

/// A slot just created, with its exported snapshot still alive.
pub struct ExportedSlot {
    /// The slot's consistent point: transactions committing at or after it are streamed.
    pub consistent_point: Lsn,
    /// The snapshot's name, for `SET TRANSACTION SNAPSHOT`.
    pub snapshot_name: String,
    /// The replication connection that holds the snapshot; dropping it ends the snapshot.
    session: ReplicationClient,
}

impl std::fmt::Debug for ExportedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportedSlot")
            .field("consistent_point", &self.consistent_point)
            .field("snapshot_name", &self.snapshot_name)
            .finish_non_exhaustive()
    }
}

impl ExportedSlot {
    /// Ends the replication connection (and with it the exported snapshot) without starting
    /// replication; the slot stays.
    pub fn release(self) {
        drop(self.session);
    }
}

/// The replication command: the option list from PostgreSQL 15 on (`FAILOVER` from 17), the
/// older keyword form before.
fn command(slot: &str, failover: bool, version_num: i32) -> String {
    if version_num >= 150_000 {
        let failover = if failover { ", FAILOVER" } else { "" };
        format!("CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput (SNAPSHOT 'export'{failover})")
    } else {
        format!("CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput EXPORT_SNAPSHOT")
    }
}

fn export_error(slot: &str, error: PgWireError) -> PgError {
    let code = wire_sqlstate(&error).map(SqlStateKind::of);
    match code {
        Some(SqlStateKind::DuplicateObject) => PgError::SlotCreatedConcurrently {
            slot: slot.to_owned(),
        },
        _ => PgError::SlotExport {
            slot: slot.to_owned(),
            transient: matches!(code, None | Some(SqlStateKind::Transient)),
            detail: error.to_string(),
        },
    }
}

/// Creates `settings.slot` (a validated name) with an exported snapshot on a replication
/// connection of its own.
pub(crate) async fn create(
    settings: &PostgresSettings,
    failover: bool,
    version_num: i32,
) -> Result<ExportedSlot, PgError> {
    let slot = settings.slot.as_str();
    let config = crate::connect::replication_config(settings, Lsn(0))?;
    let mut session = crate::connect::gated(config)
        .await
        .map_err(|e| export_error(slot, e))?;
    let rows = session
        .simple_query(&command(slot, failover, version_num))
        .await
        .map_err(|e| export_error(slot, e))?;
    // slot_name, consistent_point, snapshot_name, output_plugin.
    let text = |i: usize| {
        rows.first()
            .and_then(|r| r.get(i).cloned().flatten())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let consistent_point = text(1).and_then(|t| Lsn::from_str(&t).ok());
    let (Some(consistent_point), Some(snapshot_name)) = (consistent_point, text(2)) else {
        return Err(PgError::SlotExport {
            slot: slot.to_owned(),
            transient: false,
            detail: format!(
                "the server's answer to CREATE_REPLICATION_SLOT has no consistent point or snapshot name ({rows:?}); the slot exists now without a snapshot: drop it (SELECT pg_drop_replication_slot('{slot}')) and start again"
            ),
        });
    };
    Ok(ExportedSlot {
        consistent_point,
        snapshot_name,
        session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_by_version() {
        assert_eq!(
            command("s", false, 150_004),
            "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput (SNAPSHOT 'export')"
        );
        assert_eq!(
            command("s", true, 170_000),
            "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER)"
        );
        assert_eq!(
            command("s", false, 140_010),
            "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput EXPORT_SNAPSHOT"
        );
    }
}
