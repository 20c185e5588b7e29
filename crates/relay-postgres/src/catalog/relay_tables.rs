//! The relay's own tables in the catalog (`outbox_relay.*`): whether the cleanup's exist and
//! what the current role may do with them, and whether a slot has streamed to a stored
//! checkpoint.

use tokio_postgres::Client;

use crate::checkpoint::TableAccess;

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
