//! The relay's publication: there and publishing inserts of every outbox table (with its row
//! filter), or created.

use tokio_postgres::Client;

use super::{PUBLICATION_OPTIONS, PublishedTable, filters, query_err};
use crate::catalog;
use crate::catalog::partitions::{self, Membership};
use crate::{PgError, PostgresSettings};

/// The publication exists and publishes inserts, or is created (`create_publication`) with
/// every table and its row filter; returns whether it was created now.
pub(super) async fn ensure_publication(
    client: &Client,
    settings: &PostgresSettings,
    tables: &[PublishedTable],
    quoted_tables: &[String],
) -> Result<bool, PgError> {
    let publication = &settings.publication;
    let found = catalog::publication(client, publication)
        .await
        .map_err(query_err(format!(
            "cannot look up publication {publication}"
        )))?;
    Ok(match found {
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
            // A shard's publication keeps its shard's rows of every table, and a table's
            // row_filter its rows (as the server prints the filter back: one condition).
            let mut members = Vec::with_capacity(tables.len());
            for t in tables {
                members.push(match filters::creation_filter(client, settings, t).await? {
                    Some(filter) => format!("{} WHERE ({filter})", t.relation()),
                    None => t.relation(),
                });
            }
            let sql = format!(
                "CREATE PUBLICATION {publication} FOR TABLE {} WITH ({PUBLICATION_OPTIONS})",
                members.join(", ")
            );
            client.batch_execute(&sql).await.map_err(query_err(format!(
                "cannot create publication {publication}"
            )))?;
            tracing::info!(publication = %publication, tables = %members.join(", "), "created publication");
            true
        }
        None => {
            return Err(PgError::PublicationMissing {
                publication: publication.clone(),
                tables: quoted_tables.join(", "),
            });
        }
    })
}

/// Every table is a member of the publication, with the row filter it is configured with.
pub(super) async fn check_membership(
    client: &Client,
    settings: &PostgresSettings,
    tables: &[PublishedTable],
    version_num: i32,
) -> Result<(), PgError> {
    let publication = &settings.publication;
    for t in tables {
        let membership = partitions::membership(client, publication, &t.schema, &t.table)
            .await
            .map_err(query_err(format!("cannot read publication {publication}")))?;
        let name = t.name();
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
        filters::check_row_filter(client, settings, version_num, t).await?;
    }
    Ok(())
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
