//! Trimming outbox tables behind the checkpoint (`[outbox.cleanup]`, opt-in per table): the
//! settings, the privileges and relay tables cleanup needs ([`privilege_problem`],
//! [`ensure_tables`], [`fence`]), the row plans that delete or mark ([`RowPlan`]), the
//! partitions detached and dropped or created ahead ([`DropPlan`]), and the task that runs the
//! rounds beside the relay ([`CleanupTask`], which reports through [`CleanupReport`]). The
//! catalog reads only cleanup makes are its own ([`catalog`]).
//!
//! Its own crate because it changes for reasons of its own (modes, the fence, partition
//! handling, privileges) that the streaming path never meets. It depends on `relay-postgres`
//! for sessions, `PgError`, SQLSTATE classes, quoting, the shared catalog reads and the age
//! column ([`AgeSpec`], re-exported here as part of the settings' API); `relay-postgres` never
//! depends on it.
//!
//! Cleanup of outbox rows tied to the confirmed position (opt-in, per table): rows whose
//! events are at or behind the stored checkpoint are deleted, or marked, in small batches on a
//! session of their own; whole partitions are detached and dropped.
//!
//! # Which rows are behind the checkpoint
//!
//! A row does not say at which WAL position its transaction committed, and neither its
//! `created_at` nor its commit time orders it against the checkpoint (a long transaction commits
//! after rows created later; commit timestamps need `track_commit_timestamp` and are not in WAL
//! order either). The rule used instead needs no server setting:
//!
//! 1. A `REPEATABLE READ` transaction's first statement reads `pg_current_wal_insert_lsn()`, the
//!    batch's **horizon**. The transaction's snapshot is taken before that statement runs, and
//!    PostgreSQL makes a transaction visible only after its commit record is in WAL, so every
//!    transaction the snapshot sees committed before the horizon.
//! 2. In that snapshot it selects candidate rows (older than `retain`, after the fence), by
//!    `(tableoid, ctid, xmin)`: each was written by a transaction the snapshot sees, so each
//!    row's insert committed before the horizon (an updated row's `xmin` is the updater's, which
//!    saw the insert committed). The transaction ends at once: nothing is held while waiting.
//! 3. The batch is applied only once the stored checkpoint (`outbox_relay.checkpoint`, which the
//!    relay writes only after JetStream acknowledged every event before it) is at or past the
//!    horizon, checked again in the transaction that deletes or marks. The checkpoint confirms
//!    every transaction that committed before it, so every row of the batch is behind it.
//! 4. The statement matches `(tableoid, ctid, xmin)` exactly: a row updated, deleted or
//!    replaced in the same place since the selection no longer matches and is left alone.
//!
//! A checkpoint that never reaches the horizon (a broker outage, a stuck relay) applies
//! nothing; the batch is dropped after a while and selected again later.
//!
//! Rows committed before the slot existed are behind every checkpoint, yet the relay never
//! published them. So only rows committed after the table's **fence** ([`fence`]) are selected:
//! a snapshot taken once the slot, its stored checkpoint and the table's membership in the
//! publication were seen; a transaction that snapshot does not see was decoded by the slot. The
//! only way a row ahead of the relay could still go is a checkpoint moved forward by hand
//! (`--accept-slot-position`): then rows the relay never published count as behind it.
//!
//! Partitions ([`DropPlan`]): a partition whose whole range is older than `retain` is detached
//! first, so no row can be added to it any more (every transaction that wrote into it has ended
//! when the detach returns); the horizon is read after that, and the partition is dropped once
//! the checkpoint is past it. Detached partitions waiting for their drop are recorded in
//! `outbox_relay.cleanup_detached`, so a restart finishes what a crash interrupted.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

use std::str::FromStr;
use std::time::Duration;

use relay_core::Lsn;
use tokio_postgres::Client;

mod access;
mod ahead;
pub mod catalog;
mod partitions;
mod rows;
mod settings;
mod task;

pub use access::{
    PrivilegeNeed, cleanup_tables_access, cleanup_tables_grants, ensure_tables, fence,
    privilege_problem,
};
pub use ahead::{AheadReport, MAX_CREATED_PER_ROUND};
pub use partitions::{DropPlan, DropReport};
pub use relay_postgres::age_column::{AgeColumn, AgeKind, AgeSpec, EpochUnit, of_partition_key};
pub use rows::{Applied, Batch, CleanupAction, RowPlan};
pub use settings::{CleanupMode, CleanupSettings};
pub use task::{CleanupReport, CleanupTask};

use relay_postgres::sql::after_fence;
use relay_postgres::sql::quote_ident;
use relay_postgres::sql::quote_literal;

fn millis(d: Duration) -> u128 {
    d.as_millis().max(1)
}

/// `SET LOCAL` of the statement and lock timeouts.
fn timeouts(statement: Duration, lock: Duration) -> String {
    format!(
        "SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}",
        millis(statement),
        millis(lock)
    )
}

/// The stored checkpoint of `slot` on `client` (read committed), `None` when none is stored.
pub async fn stored_checkpoint(
    client: &impl tokio_postgres::GenericClient,
    slot: &str,
) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT confirmed_lsn::text FROM outbox_relay.checkpoint WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row
        .and_then(|r| r.get::<_, Option<String>>(0))
        .and_then(|t| Lsn::from_str(&t).ok()))
}

/// The migration that creates `outbox_relay.cleanup_fence` and `outbox_relay.cleanup_detached`
/// (also shipped in `migrations/`).
pub const CLEANUP_MIGRATION: &str = include_str!("../../../migrations/0006_outbox_cleanup.sql");
