//! Who streams the relay's slot now: what a standby relay polls while it waits.

use tokio_postgres::Client;

use crate::PgError;

/// The pid of the backend streaming `slot` (`active_pid`) when that is another session than
/// this one, or `None`: the slot is free, missing, or not one the relay could stream (another
/// database's, or not a pgoutput slot).
///
/// It reads the slots in shared memory (no table, no WAL): cheap enough to poll every second.
/// A slot the relay could not stream anyway is left to the start-up checks, which refuse it
/// with the reason, rather than waited on.
pub async fn slot_holder(client: &Client, slot: &str) -> Result<Option<i32>, PgError> {
    let row = client
        .query_opt(
            "SELECT active_pid FROM pg_catalog.pg_replication_slots \
             WHERE slot_name = $1 AND database = current_database() AND plugin = 'pgoutput' \
               AND active_pid <> pg_backend_pid()",
            &[&slot],
        )
        .await
        .map_err(|source| PgError::Query {
            context: format!("cannot read which process streams replication slot {slot}"),
            source,
        })?;
    Ok(row.and_then(|r| r.get(0)))
}
