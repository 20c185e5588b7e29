//! The relay's own tables in the catalog (`outbox_relay.*`): whether they exist and what the
//! current role may do with them (the checkpoint's, the position map's, the cleanup's, the
//! backfill cursors'), whether a slot has streamed to a stored checkpoint, and which existing
//! slots recorded positions in the position map. What the tables hold is read by their stores.

use tokio_postgres::{Client, GenericClient};

/// What the current role may do with one of the relay's tables (`outbox_relay.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableAccess {
    /// The table exists and the role may read and write it.
    Usable,
    /// The table exists; the role lacks USAGE on the schema or rights on the table.
    NotGranted {
        /// The current role.
        role: String,
    },
    /// No such table (yet).
    Missing,
}

/// What the current role may do with the relay's table `outbox_relay.<table>`: usable means
/// USAGE on the schema and every one of `privileges` (comma-separated) on the table. Looked up in the catalog, not with
/// to_regclass: looking a name up in a schema without USAGE is an error, and privileges are
/// checked by oid for a precise message.
async fn relay_table_access(
    client: &Client,
    table: &str,
    privileges: &str,
) -> Result<TableAccess, tokio_postgres::Error> {
    let found = client
        .query_opt(
            // has_table_privilege with a list is true when ANY of them is held: check each.
            "SELECT has_schema_privilege(n.oid, 'USAGE') \
                    AND (SELECT bool_and(has_table_privilege(c.oid, trim(p))) \
                         FROM unnest(string_to_array($2, ',')) AS p), current_user::text \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'outbox_relay' AND c.relname = $1",
            &[&table, &privileges],
        )
        .await?;
    Ok(match found {
        None => TableAccess::Missing,
        Some(row) if row.get::<_, bool>(0) => TableAccess::Usable,
        Some(row) => TableAccess::NotGranted { role: row.get(1) },
    })
}

/// What the current role may do with `outbox_relay.checkpoint`.
pub async fn checkpoint_table_access(
    client: &Client,
) -> Result<TableAccess, tokio_postgres::Error> {
    relay_table_access(client, "checkpoint", "SELECT, INSERT, UPDATE").await
}

/// What the current role may do with `outbox_relay.signal`: the relay reads and updates its
/// rows (the roles that signal insert them).
pub async fn signal_table_access(client: &Client) -> Result<TableAccess, tokio_postgres::Error> {
    relay_table_access(client, "signal", "SELECT, UPDATE").await
}

/// What the current role may do with `outbox_relay.position_map` (looked up like the checkpoint
/// table, see [`checkpoint_table_access`]).
pub async fn position_map_access(client: &Client) -> Result<TableAccess, tokio_postgres::Error> {
    relay_table_access(client, "position_map", "SELECT, INSERT, UPDATE, DELETE").await
}

/// What the current role may do with `outbox_relay.cleanup_fence` and
/// `outbox_relay.cleanup_detached` (usable only when both are there and writable).
pub async fn cleanup_tables_access(client: &Client) -> Result<TableAccess, tokio_postgres::Error> {
    // (A list of privileges asks whether any of them is held: one call each.)
    let rows = client
        .query(
            "SELECT has_schema_privilege(n.oid, 'USAGE') \
                    AND has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT') \
                    AND has_table_privilege(c.oid, 'UPDATE') AND has_table_privilege(c.oid, 'DELETE'), \
                    current_user::text \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'outbox_relay' AND c.relname IN ('cleanup_fence', 'cleanup_detached')",
            &[],
        )
        .await?;
    Ok(match rows.as_slice() {
        [a, b] if a.get::<_, bool>(0) && b.get::<_, bool>(0) => TableAccess::Usable,
        [a, _] | [a] => TableAccess::NotGranted { role: a.get(1) },
        [] | [_, _, ..] => TableAccess::Missing,
    })
}

/// Whether `slot` exists, has confirmed a position, and has a checkpoint stored in
/// `outbox_relay.checkpoint`: the slot has decoded up to somewhere the relay knows.
pub async fn slot_confirmed_with_checkpoint(
    client: &Client,
    slot: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_replication_slots s \
             JOIN outbox_relay.checkpoint c ON c.slot_name = s.slot_name \
             WHERE s.slot_name = $1 AND s.confirmed_flush_lsn IS NOT NULL",
            &[&slot],
        )
        .await?
        .is_some())
}

/// Whether `outbox_relay.backfill` exists, looked up by name (`to_regclass`, which fails
/// without USAGE on the schema).
pub async fn backfill_table_named(client: &Client) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT to_regclass('outbox_relay.backfill') IS NOT NULL",
            &[],
        )
        .await?
        .get(0))
}

/// Whether `outbox_relay.backfill` is in the catalog (whatever the role may do with it).
pub async fn backfill_table_exists(client: &Client) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
               WHERE n.nspname = 'outbox_relay' AND c.relname = 'backfill')",
            &[],
        )
        .await?
        .get(0))
}

/// Whether `outbox_relay.backfill` has the on-create columns (migration 0007).
pub async fn backfill_has_on_create_columns(
    client: &Client,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute \
               WHERE attrelid = 'outbox_relay.backfill'::regclass AND attname = 'on_create' \
                 AND NOT attisdropped)",
            &[],
        )
        .await?
        .get(0))
}

/// The slots of this database that recorded positions of `stream` in
/// `outbox_relay.position_map`, by name; slots that no longer exist are left out.
pub(crate) async fn slots_mapping_stream(
    client: &impl GenericClient,
    stream: &str,
) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT DISTINCT m.slot_name FROM outbox_relay.position_map m \
             JOIN pg_catalog.pg_replication_slots s \
               ON s.slot_name = m.slot_name AND s.database = current_database() \
             WHERE m.stream = $1 ORDER BY 1",
            &[&stream],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

#[cfg(test)]
mod tests;
