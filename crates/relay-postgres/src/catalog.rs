//! Catalog queries about the outbox tables, the publication and the slot.

use std::str::FromStr;

use relay_core::Lsn;
use tokio_postgres::Client;

use crate::PgError;

/// The outbox tables' relation OIDs as the catalog has them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxOids {
    /// `(schema, table, oid)` of each configured table that exists.
    pub tables: Vec<(String, String, u32)>,
    /// The WAL insert position read just before the catalog: a transaction that committed
    /// before it was decoded with an older (or the same) catalog.
    pub read_at: Lsn,
}

/// The relation OID of each configured outbox table (`(schema, table)`), as the catalog names
/// it now; a table that does not exist is left out (start-up checks report it).
///
/// The router binds these OIDs so that a table renamed before the relay read its first row of
/// the session is still recognised as the outbox, and refused, instead of being skipped.
pub async fn outbox_table_oids(
    client: &Client,
    tables: &[(String, String)],
) -> Result<OutboxOids, PgError> {
    let read_at = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map_err(|source| PgError::Query {
            context: "cannot read the current WAL position".into(),
            source,
        })?;
    let read_at: String = read_at.get(0);
    let read_at = Lsn::from_str(&read_at).map_err(|_| {
        PgError::Settings(format!(
            "pg_current_wal_lsn() returned `{read_at}`, not an LSN"
        ))
    })?;
    let mut found = Vec::with_capacity(tables.len());
    for (schema, table) in tables {
        let row = client
            .query_opt(
                "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
                &[schema, table],
            )
            .await
            .map_err(|source| PgError::Query {
                context: format!("cannot look up table {schema}.{table}"),
                source,
            })?;
        if let Some(row) = row {
            found.push((schema.clone(), table.clone(), row.get::<_, u32>(0)));
        }
    }
    Ok(OutboxOids {
        tables: found,
        read_at,
    })
}
