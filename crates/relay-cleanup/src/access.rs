//! What cleanup needs before it may touch a row: its own tables, the fence (rows the slot
//! decoded), and the privileges of the mode chosen.

use super::*;
use crate::catalog::privileges::{self, TableOwnership};

/// The statements that let `role` use the cleanup's tables.
pub fn cleanup_tables_grants(role: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA outbox_relay TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.cleanup_fence, outbox_relay.cleanup_detached TO {role}"
    )
}

pub use relay_postgres::catalog::relay_tables::cleanup_tables_access;

/// Makes sure the cleanup's tables exist and may be written (creating them when missing and
/// allowed); otherwise what to do about it.
pub async fn ensure_tables(client: &Client) -> Result<(), String> {
    use relay_postgres::catalog::relay_tables::TableAccess;
    let missing = "apply migrations/0006_outbox_cleanup.sql as an administrator (it needs outbox_relay.checkpoint, migrations/0002)";
    match cleanup_tables_access(client).await {
        Ok(TableAccess::Usable) => Ok(()),
        Ok(TableAccess::NotGranted { role }) => match client.batch_execute(CLEANUP_MIGRATION).await
        {
            // One of the two was missing and is there now.
            Ok(()) if matches!(cleanup_tables_access(client).await, Ok(TableAccess::Usable)) => {
                Ok(())
            }
            _ => Err(cleanup_tables_grants(&role)),
        },
        Ok(TableAccess::Missing) => client.batch_execute(CLEANUP_MIGRATION).await.map_err(|e| {
            format!("the cleanup's tables do not exist and cannot be created ({e}): {missing}")
        }),
        Err(e) => Err(e.to_string()),
    }
}

/// The fence of `schema.table` for `slot` (see `migrations/0006_outbox_cleanup.sql`): read, or
/// established now when the slot exists, the relay stored a checkpoint for it, and publication
/// `publication` delivers the table's rows. `None` while that is not so (no row is cleaned).
pub async fn fence(
    client: &Client,
    slot: &str,
    schema: &str,
    table: &str,
    publication: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    let name = relay_postgres::sql::display_relation(schema, table);
    let read = async || -> Result<Option<String>, tokio_postgres::Error> {
        Ok(client
            .query_opt(
                "SELECT fence FROM outbox_relay.cleanup_fence WHERE slot_name = $1 AND table_name = $2",
                &[&slot, &name],
            )
            .await?
            .map(|r| r.get(0)))
    };
    if let Some(fence) = read().await? {
        return Ok(Some(fence));
    }
    let slot_ready =
        relay_postgres::catalog::relay_tables::slot_confirmed_with_checkpoint(client, slot).await?;
    let member = slot_ready
        && relay_postgres::catalog::partitions::membership(client, publication, schema, table)
            .await?
            == relay_postgres::catalog::partitions::Membership::Member;
    if !member {
        return Ok(None);
    }
    // Taken after both were seen: a transaction it does not see commits after them.
    client
        .execute(
            "INSERT INTO outbox_relay.cleanup_fence (slot_name, table_name, fence) \
             VALUES ($1, $2, pg_current_snapshot()::text) ON CONFLICT DO NOTHING",
            &[&slot, &name],
        )
        .await?;
    let fence = read().await?;
    if let Some(fence) = &fence {
        tracing::info!(slot, table = %name, fence = %fence, "cleanup fence established: rows committed before it were not decoded by this slot and are never cleaned");
    }
    Ok(fence)
}

/// Whether the current role may run `plan`'s mode on `schema.table`, and if not, the statement
/// that grants it: `DELETE` (delete), `UPDATE` of the marked columns (mark), ownership of the
/// table (drop-partitions: `DETACH PARTITION` and `DROP TABLE` need it).
pub async fn privilege_problem(
    client: &Client,
    schema: &str,
    table: &str,
    mode: &PrivilegeNeed<'_>,
) -> Result<Option<String>, tokio_postgres::Error> {
    let relation = relay_postgres::sql::quote_relation(schema, table);
    let Some(TableOwnership {
        oid,
        user,
        owner,
        acts_as_owner: owns,
    }) = privileges::table_ownership(client, schema, table).await?
    else {
        return Ok(None);
    };
    Ok(match mode {
        PrivilegeNeed::Delete => {
            let ok = privileges::may_select_and_delete(client, oid).await?;
            (!ok).then(|| format!("GRANT SELECT, DELETE ON {relation} TO {user}"))
        }
        PrivilegeNeed::Update(columns) => {
            let mut missing = Vec::new();
            for column in *columns {
                let ok = privileges::may_update_column(client, oid, column).await?;
                if !ok {
                    missing.push(quote_ident(column));
                }
            }
            (!missing.is_empty()).then(|| {
                format!(
                    "GRANT UPDATE ({}) ON {relation} TO {user}",
                    missing.join(", ")
                )
            })
        }
        PrivilegeNeed::Own => (!owns).then(|| {
            format!(
                "GRANT {} TO {user} (DETACH PARTITION and DROP TABLE need the table's owner, role {owner}; its partitions must be owned by it too)",
                quote_ident(&owner)
            )
        }),
    })
}

/// What a cleanup mode needs on the table.
#[derive(Debug, Clone, Copy)]
pub enum PrivilegeNeed<'a> {
    /// `delete`: `SELECT, DELETE`.
    Delete,
    /// `mark`: `UPDATE` of these columns.
    Update(&'a [String]),
    /// `drop-partitions`: membership in the owning role.
    Own,
}
