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

use crate::catalog::partitions::{self, Membership};
use crate::catalog::{self, SlotInfo};
use crate::sqlstate::SqlStateKind;
use crate::{PgError, PostgresSettings};

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

/// Quotes an identifier for SQL (`"` doubled).
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Fails closed instead of creating the publication after the slot: the slot decodes its WAL
/// with the catalog as it was, so rows committed between the slot's position and the new
/// publication cannot be read through it (PostgreSQL 17 and older stop decoding with
/// "publication does not exist", 18 skips those rows with a server-log warning).
async fn refuse_publication_after_slot(
    client: &Client,
    settings: &PostgresSettings,
) -> Result<(), PgError> {
    let (slot, publication) = (&settings.slot, &settings.publication);
    let found = catalog::slot(client, slot)
        .await
        .map_err(query_err(format!("cannot look up replication slot {slot}")))?;
    let Some(info) = found else { return Ok(()) };
    let position = info
        .confirmed_flush_lsn
        .map_or_else(|| "?".to_owned(), |l| l.to_string());
    Err(PgError::SlotUnusable {
        slot: slot.clone(),
        reason: format!(
            "publication `{publication}` does not exist, and creating it now would make it newer than the slot's position {position}: PostgreSQL cannot decode the slot's older WAL through it (17 and older stop with \"publication does not exist\", 18 silently skips those rows). Reconcile outbox rows committed since {position} from the outbox table, then create the publication before the slot: SELECT pg_drop_replication_slot('{slot}'), delete the slot's row from outbox_relay.checkpoint, and start the relay (or run `outbox-relay setup`), which creates the publication first"
        ),
    })
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

/// Checks the server, tables, publication and slot; creates the publication and slot where
/// allowed. `tables` are `(schema, table)`; `checkpoint` is the relay's stored position.
pub async fn prepare(
    client: &Client,
    settings: &PostgresSettings,
    tables: &[(String, String)],
    checkpoint: Option<Lsn>,
) -> Result<SlotState, PgError> {
    // `client` came from `crate::connect`, which validated `settings` for this session.
    let server = catalog::server(client)
        .await
        .map_err(query_err("cannot read wal_level"))?;
    if server.wal_level != "logical" {
        return Err(PgError::WalLevel {
            actual: server.wal_level,
        });
    }

    let mut quoted_tables = Vec::with_capacity(tables.len());
    for (schema, table) in tables {
        let found = catalog::table(client, schema, table)
            .await
            .map_err(query_err(format!("cannot look up table {schema}.{table}")))?;
        if found.is_none() {
            return Err(PgError::TableMissing {
                table: format!("{schema}.{table}"),
                database: server.database,
            });
        }
        quoted_tables.push(format!("{}.{}", quote_ident(schema), quote_ident(table)));
    }

    let publication = &settings.publication;
    let found = catalog::publication(client, publication)
        .await
        .map_err(query_err(format!(
            "cannot look up publication {publication}"
        )))?;
    let publication_created = match found {
        Some(info) if !info.publishes_inserts => {
            return Err(PgError::PublicationNoInsert {
                publication: publication.clone(),
            });
        }
        Some(_) => false,
        None if settings.create_publication => {
            refuse_publication_after_slot(client, settings).await?;
            // Names are validated identifiers; tables are quoted. Partitioned tables' rows are
            // published as the table's own (its OID and name), not as their partitions'.
            let sql = format!(
                "CREATE PUBLICATION {publication} FOR TABLE {} WITH ({PUBLICATION_OPTIONS})",
                quoted_tables.join(", ")
            );
            client.batch_execute(&sql).await.map_err(query_err(format!(
                "cannot create publication {publication}"
            )))?;
            tracing::info!(publication = %publication, tables = %quoted_tables.join(", "), "created publication");
            true
        }
        None => {
            return Err(PgError::PublicationMissing {
                publication: publication.clone(),
                tables: quoted_tables.join(", "),
            });
        }
    };
    for (schema, table) in tables {
        let membership = partitions::membership(client, publication, schema, table)
            .await
            .map_err(query_err(format!("cannot read publication {publication}")))?;
        let name = format!("{schema}.{table}");
        match membership {
            Membership::Member => {}
            Membership::NotInPublication => {
                return Err(PgError::PublicationMissingTable {
                    publication: publication.clone(),
                    table: name,
                });
            }
            other => {
                return Err(PgError::Settings(
                    other.problem(publication, &name).unwrap_or_default(),
                ));
            }
        }
    }

    let slot = &settings.slot;
    let lookup = |slot: &str| {
        let slot = slot.to_owned();
        async move {
            catalog::slot(client, &slot)
                .await
                .map_err(query_err(format!("cannot look up replication slot {slot}")))
        }
    };
    let Some(info) = lookup(slot).await? else {
        if let Some(checkpoint) = checkpoint {
            return Err(PgError::SlotLost {
                slot: slot.clone(),
                checkpoint,
            });
        }
        if !settings.create_slot {
            return Err(PgError::SlotMissing { slot: slot.clone() });
        }
        let created = client
            .query_one(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                &[slot],
            )
            .await;
        if let Err(e) = &created
            && e.code()
                .is_some_and(|c| SqlStateKind::of(c.code()) == SqlStateKind::DuplicateObject)
        {
            // Another relay of the pair created it a moment ago: start over and wait as its
            // standby (a transient error), instead of stopping for good.
            return Err(PgError::SlotCreatedConcurrently { slot: slot.clone() });
        }
        let row = created.map_err(query_err(format!("cannot create replication slot {slot}")))?;
        let lsn = parse_lsn(row.get(0)).unwrap_or_default();
        tracing::info!(slot = %slot, lsn = %lsn, "created replication slot");
        let info = lookup(slot)
            .await?
            .ok_or_else(|| PgError::SlotMissing { slot: slot.clone() })?;
        return Ok(SlotState {
            confirmed_flush_lsn: lsn,
            slot: info,
            created: true,
            publication_created,
            checkpoint,
        });
    };
    let unusable = |reason: String| PgError::SlotUnusable {
        slot: slot.clone(),
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
        return Err(PgError::SlotInvalidated { slot: slot.clone() });
    }
    // A logical slot shows no confirmed position while its creator waits for a consistent
    // snapshot: another relay of the pair is creating it right now.
    let Some(confirmed_flush_lsn) = info.confirmed_flush_lsn else {
        return Err(PgError::SlotCreatedConcurrently { slot: slot.clone() });
    };
    crate::publication_order::check(
        client,
        settings,
        confirmed_flush_lsn,
        info.active_pid.is_some(),
        server.version_num,
    )
    .await?;
    let checkpoint = match checkpoint {
        Some(read) if confirmed_flush_lsn > read => {
            Some(checkpoint_after_slot(client, slot, read, confirmed_flush_lsn).await?)
        }
        other => other,
    };
    Ok(SlotState {
        confirmed_flush_lsn,
        slot: info,
        created: false,
        publication_created,
        checkpoint,
    })
}
