//! Start-up checks and creation of the publication and slot.
//!
//! Order matters: the publication is created before the slot, because a slot decodes its WAL
//! with the catalog as it was then, and a publication created later is "missing" for that WAL.
//! A slot is created only when the relay has no checkpoint for it: a checkpoint without its slot
//! means the slot was dropped or lost, and a new one would silently skip everything committed in
//! between.

use std::str::FromStr;

use relay_core::Lsn;
use tokio_postgres::Client;

use crate::catalog::{self, SlotInfo};
use crate::sqlstate::SqlStateKind;
use crate::{PgError, PostgresSettings};

mod export;
mod filters;
mod publication;

use publication::{check_membership, ensure_publication};

pub use export::ExportedSlot;
pub use filters::PublishedTable;

/// The options of a publication the relay creates: inserts only, and a partitioned table's
/// rows as the table's own, not as their partitions' (`publish_via_partition_root`, PostgreSQL
/// 13+): the relay knows outbox tables by their relation OID and name.
pub const PUBLICATION_OPTIONS: &str = "publish = 'insert', publish_via_partition_root = true";

/// What the start-up checks found (or created).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// The slot's confirmed_flush_lsn.
    pub confirmed_flush_lsn: Lsn,
    /// The slot as the catalog describes it (restart_lsn, wal_status, the pid streaming it).
    pub slot: SlotInfo,
    /// Whether this start created the slot.
    pub created: bool,
    /// Whether this start created the publication.
    pub publication_created: bool,
    /// The stored checkpoint to resume from: the one given, or the one read again after the
    /// slot when the slot had moved past it (another relay stored and confirmed meanwhile).
    pub checkpoint: Option<Lsn>,
}

fn query_err(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> PgError {
    let context = context.into();
    move |source| PgError::Query { context, source }
}

fn parse_lsn(text: Option<String>) -> Option<Lsn> {
    text.and_then(|t| Lsn::from_str(&t).ok())
}

/// The slot (at `slot_lsn`) is past the checkpoint the caller read (`read`) before it: another
/// relay may have stored and confirmed a later position in between (a standby reads while the
/// active relay works). Every relay stores a position before it confirms it to the slot, so a
/// checkpoint read after the slot is at least the slot's position, unless the slot was moved
/// by hand or the checkpoint reset: only then is it still behind, and that is refused.
async fn checkpoint_after_slot(
    client: &Client,
    slot: &str,
    read: Lsn,
    slot_lsn: Lsn,
) -> Result<Lsn, PgError> {
    let again = crate::catalog::stored_checkpoint(client, slot)
        .await
        .map_err(query_err(format!(
            "cannot read the checkpoint of slot {slot}"
        )))?
        .map(|(lsn, _)| lsn);
    match again {
        Some(checkpoint) if checkpoint >= slot_lsn => {
            tracing::info!(slot, read = %read, checkpoint = %checkpoint, slot_lsn = %slot_lsn, "another relay stored and confirmed a later position while the slot was read");
            Ok(checkpoint)
        }
        again => Err(PgError::SlotAhead {
            slot: slot.to_owned(),
            slot_lsn,
            checkpoint: again.unwrap_or(read),
        }),
    }
}

/// Says once per process that the slot is no failover slot: below PostgreSQL 17 (where
/// `[postgres] failover = auto` leaves it off), or turned off by the setting.
fn note_failover_off(settings: &PostgresSettings, version_num: i32) {
    static NOTED: std::sync::Once = std::sync::Once::new();
    let slot = &settings.slot;
    if version_num < crate::settings::FAILOVER_SLOTS_SINCE {
        NOTED.call_once(|| {
            tracing::info!(
                slot = %slot,
                "failover slots need PostgreSQL 17 or later (this server runs {}): slot {slot} stays on this server, and after a failover to a standby the relay stops (exit 65); see docs/operations.md, \"Failover\"",
                crate::server_version::version_text(version_num)
            );
        });
    } else if settings.failover == crate::FailoverSetting::Off {
        NOTED.call_once(|| {
            tracing::info!(
                slot = %slot,
                "postgres.failover = false: slot {slot} stays on this server, and after a failover to a standby the relay stops (exit 65); see docs/operations.md, \"Failover\""
            );
        });
    }
}

/// The error for a slot that is gone while a checkpoint for it exists: on a server that was
/// promoted (timeline above 1), that it did not come over, and why, as far as can be told.
async fn slot_lost(
    client: &Client,
    slot: &str,
    checkpoint: Lsn,
    version_num: i32,
    failover: bool,
) -> PgError {
    let lost = PgError::SlotLost {
        slot: slot.to_owned(),
        checkpoint,
    };
    let timeline = match catalog::failover::timeline(client).await {
        Ok(Some(t)) if t > 1 => t,
        _ => return lost,
    };
    let why = if version_num < crate::settings::FAILOVER_SLOTS_SINCE {
        format!(
            "PostgreSQL {} has no failover slots (since 17), so no standby had a copy of it",
            crate::server_version::version_text(version_num)
        )
    } else if failover {
        "it was not synchronized to this server before its promotion (a failover slot needs, on the standby, sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name and dbname in primary_conninfo; a synchronized slot that was not persistent yet is dropped at promotion)".to_owned()
    } else {
        "it was no failover slot (postgres.failover = false, or created before the relay made failover slots)".to_owned()
    };
    PgError::SlotMissingAfterPromotion {
        slot: slot.to_owned(),
        checkpoint,
        timeline,
        why,
    }
}

/// On PostgreSQL 17+: warns (once per process) when the slot is no failover slot although
/// one is wanted, with the fix, and says when the slot came over from a former primary
/// (`synced`). Returns whether it did.
async fn check_failover_flag(
    client: &Client,
    settings: &PostgresSettings,
    server: &catalog::ServerInfo,
    wanted: bool,
) -> Result<bool, PgError> {
    if server.version_num < crate::settings::FAILOVER_SLOTS_SINCE {
        return Ok(false);
    }
    let slot = &settings.slot;
    let Some(info) = catalog::failover::slot(client, slot, server.version_num)
        .await
        .map_err(query_err(format!("cannot look up replication slot {slot}")))?
    else {
        return Ok(false);
    };
    if wanted && !info.failover {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                slot = %slot,
                "slot {slot} is no failover slot (failover = false): standbys do not synchronize it, and after a failover the relay stops (exit 65). Fix: {}",
                catalog::failover::alter_slot_hint(slot, &server.database)
            );
        });
    }
    if info.synced {
        tracing::info!(slot = %slot, "slot {slot} came over from the former primary (synced = true): this server was promoted");
    }
    Ok(info.synced)
}

/// Checks the server, tables, publication and slot; creates the publication and slot where
/// allowed. `checkpoint` is the relay's stored position.
pub async fn prepare(
    client: &Client,
    settings: &PostgresSettings,
    tables: &[PublishedTable],
    checkpoint: Option<Lsn>,
) -> Result<SlotState, PgError> {
    prepare_slot(client, settings, tables, checkpoint, false)
        .await
        .map(|(state, _)| state)
}

/// [`prepare`]; with `export`, a slot created now is created on a replication connection
/// with an exported snapshot, returned alive (`backfill = "on-create"`).
pub async fn prepare_slot(
    client: &Client,
    settings: &PostgresSettings,
    tables: &[PublishedTable],
    checkpoint: Option<Lsn>,
    export: bool,
) -> Result<(SlotState, Option<ExportedSlot>), PgError> {
    // `client` came from `crate::connect`, which validated `settings` for this session.
    let server = catalog::server(client)
        .await
        .map_err(query_err("cannot read wal_level"))?;
    if server.wal_level != "logical" {
        return Err(PgError::WalLevel {
            actual: server.wal_level,
        });
    }
    let quoted_tables = check_tables(client, settings, tables, &server).await?;
    let publication_created = ensure_publication(client, settings, tables, &quoted_tables).await?;
    check_membership(client, settings, tables, server.version_num).await?;

    let slot = &settings.slot;
    // Failover slots (PostgreSQL 17+), as `[postgres] failover` says; refused before 17 only
    // when asked for explicitly.
    let failover = settings.failover.wanted(server.version_num)?;
    note_failover_off(settings, server.version_num);
    let Some(info) = lookup_slot(client, slot).await? else {
        if let Some(checkpoint) = checkpoint {
            return Err(slot_lost(client, slot, checkpoint, server.version_num, failover).await);
        }
        if !settings.create_slot {
            return Err(PgError::SlotMissing { slot: slot.clone() });
        }
        let (lsn, exported) = if export {
            let exported = export::create(settings, failover, server.version_num).await?;
            (exported.consistent_point, Some(exported))
        } else {
            (create_slot(client, slot, failover).await?, None)
        };
        tracing::info!(slot = %slot, lsn = %lsn, failover, exported_snapshot = exported.is_some(), "created replication slot");
        let info = lookup_slot(client, slot)
            .await?
            .ok_or_else(|| PgError::SlotMissing { slot: slot.clone() })?;
        let state = SlotState {
            confirmed_flush_lsn: lsn,
            slot: info,
            created: true,
            publication_created,
            checkpoint,
        };
        return Ok((state, exported));
    };
    let confirmed_flush_lsn = usable_slot(slot, &info, &server)?;
    let synced = check_failover_flag(client, settings, &server, failover).await?;
    crate::publication_order::check(
        client,
        settings,
        confirmed_flush_lsn,
        info.active_pid.is_some(),
        server.version_num,
    )
    .await?;
    let checkpoint =
        reconcile_checkpoint(client, slot, checkpoint, confirmed_flush_lsn, synced).await?;
    let state = SlotState {
        confirmed_flush_lsn,
        slot: info,
        created: false,
        publication_created,
        checkpoint,
    };
    Ok((state, None))
}

async fn lookup_slot(client: &Client, slot: &str) -> Result<Option<catalog::SlotInfo>, PgError> {
    catalog::slot(client, slot)
        .await
        .map_err(query_err(format!("cannot look up replication slot {slot}")))
}

/// Every table exists, and the server can apply the row filters `settings` and the tables ask
/// for; returns the tables quoted.
async fn check_tables(
    client: &Client,
    settings: &PostgresSettings,
    tables: &[PublishedTable],
    server: &catalog::ServerInfo,
) -> Result<Vec<String>, PgError> {
    let mut quoted_tables = Vec::with_capacity(tables.len());
    for t in tables {
        let found = catalog::table(client, &t.schema, &t.table)
            .await
            .map_err(query_err(format!("cannot look up table {}", t.name())))?;
        if found.is_none() {
            return Err(filters::table_missing(client, t, server.database.clone()).await);
        }
        quoted_tables.push(t.relation());
    }

    if settings.shard.is_some() && server.version_num < crate::shard::ROW_FILTERS_SINCE {
        return Err(PgError::Settings(format!(
            "postgres.shard needs publication row filters, which PostgreSQL {} does not have (since 15): remove postgres.shard and run one relay, or upgrade",
            crate::server_version::version_text(server.version_num)
        )));
    }
    let filtered: Vec<String> = tables
        .iter()
        .filter(|t| t.row_filter.is_some())
        .map(PublishedTable::name)
        .collect();
    if let Some(problem) = crate::shard::row_filters_unsupported(&filtered, server.version_num) {
        return Err(PgError::Settings(problem));
    }
    Ok(quoted_tables)
}

/// The existing slot is a logical pgoutput slot of this database, not invalidated and not
/// being created by another relay; returns its confirmed position.
fn usable_slot(
    slot: &str,
    info: &catalog::SlotInfo,
    server: &catalog::ServerInfo,
) -> Result<Lsn, PgError> {
    let unusable = |reason: String| PgError::SlotUnusable {
        slot: slot.to_owned(),
        reason,
    };
    if info.slot_type != "logical" || info.plugin.as_deref() != Some("pgoutput") {
        return Err(unusable(format!(
            "it is a {} slot with plugin {:?}; the relay needs a logical slot with plugin pgoutput (use another postgres.slot name)",
            info.slot_type, info.plugin
        )));
    }
    if info.database.as_deref() != Some(server.database.as_str()) {
        return Err(unusable(format!(
            "it belongs to database {:?}, not {:?} (point postgres.url at that database or use another slot)",
            info.database, server.database
        )));
    }
    if info.is_lost() {
        return Err(PgError::SlotInvalidated {
            slot: slot.to_owned(),
        });
    }
    // A logical slot shows no confirmed position while its creator waits for a consistent
    // snapshot: another relay of the pair is creating it right now.
    info.confirmed_flush_lsn
        .ok_or_else(|| PgError::SlotCreatedConcurrently {
            slot: slot.to_owned(),
        })
}

/// The checkpoint to resume from, given the slot's confirmed position: a slot ahead of it is
/// refused unless explained ([`checkpoint_after_slot`]); a failover slot behind it resumes
/// from the checkpoint.
async fn reconcile_checkpoint(
    client: &Client,
    slot: &str,
    checkpoint: Option<Lsn>,
    confirmed_flush_lsn: Lsn,
    synced: bool,
) -> Result<Option<Lsn>, PgError> {
    Ok(match checkpoint {
        Some(read) if confirmed_flush_lsn > read => {
            let again = checkpoint_after_slot(client, slot, read, confirmed_flush_lsn).await;
            if synced && let Err(PgError::SlotAhead { checkpoint, .. }) = &again {
                tracing::warn!(
                    slot = %slot,
                    slot_lsn = %confirmed_flush_lsn,
                    checkpoint = %checkpoint,
                    "the slot came over from the former primary, which had confirmed {confirmed_flush_lsn} after the relay stored it there, but this server's copy of the checkpoint is older ({checkpoint}): the failover came between the checkpoint's write and its replication. Unless the slot was moved by hand on the former primary, everything before {confirmed_flush_lsn} was acknowledged by JetStream; check the stream (outbox-relay status) and rerun with --accept-slot-position (docs/operations.md, \"Failover\")"
                );
            }
            Some(again?)
        }
        Some(read) if synced && confirmed_flush_lsn < read => {
            tracing::info!(
                slot = %slot,
                slot_lsn = %confirmed_flush_lsn,
                checkpoint = %read,
                "the slot came over from the former primary behind the stored checkpoint (it was synchronized before the last confirmation): resuming from the checkpoint, which came over with the database, so nothing this server has is skipped"
            );
            Some(read)
        }
        other => other,
    })
}

/// Creates `slot` with SQL; returns its position.
async fn create_slot(client: &Client, slot: &str, failover: bool) -> Result<Lsn, PgError> {
    // pg_create_logical_replication_slot(slot, plugin, temporary, twophase, failover):
    // the fifth argument exists since PostgreSQL 17 (18 has the same signature).
    let sql = if failover {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)"
    } else {
        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')"
    };
    let created = client.query_one(sql, &[&slot]).await;
    if let Err(e) = &created
        && e.code()
            .is_some_and(|c| SqlStateKind::of(c.code()) == SqlStateKind::DuplicateObject)
    {
        // Another relay of the pair created it a moment ago: start over and wait as its
        // standby (a transient error), instead of stopping for good.
        return Err(PgError::SlotCreatedConcurrently {
            slot: slot.to_owned(),
        });
    }
    let row = created.map_err(query_err(format!("cannot create replication slot {slot}")))?;
    Ok(parse_lsn(row.get(0)).unwrap_or_default())
}
