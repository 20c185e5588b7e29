//! The backfill's cursor in `outbox_relay.backfill` (`migrations/0003_relay_backfill.sql`,
//! `0007_backfill_on_create.sql`): where a backfill is, so that a killed one resumes.

use tokio_postgres::Client;

use super::{BACKFILL_MIGRATION, BACKFILL_ON_CREATE_MIGRATION, BackfillError, query_err};
use relay_postgres::catalog::relay_tables;

/// Which backfill a cursor belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorId {
    /// The relay's slot (the stream and configuration it belongs to).
    pub slot: String,
    /// `schema.table`.
    pub table: String,
    /// The `--where` filter, `""` for none.
    pub filter: String,
}

/// A stored cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The column pages are keyed by.
    pub key_column: String,
    /// The last key when the backfill started (`None`: nothing to backfill).
    pub end_key: Option<String>,
    /// Every row up to this key was acknowledged (`None`: none yet).
    pub last_key: Option<String>,
    /// Rows acknowledged (or found already in the stream) so far, over every run.
    pub rows_done: i64,
    /// The planner's estimate of all rows when the backfill started.
    pub rows_estimate: Option<i64>,
    /// When the first run started, RFC 3339.
    pub started_at: String,
    /// When it finished, RFC 3339.
    pub finished_at: Option<String>,
    /// The relay's backfill at slot creation (`backfill = "on-create"`), not the command's.
    pub on_create: bool,
}

/// A stored cursor as `status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct CursorStatus {
    /// Which backfill.
    pub id: CursorId,
    /// Where it is.
    pub cursor: Cursor,
    /// Seconds since the cursor last moved (or the backfill started or finished).
    pub updated_secs_ago: f64,
}

/// Every backfill cursor of `slot`, oldest first; empty when no backfill ever ran (no table).
pub async fn list_cursors(client: &Client, slot: &str) -> Result<Vec<CursorStatus>, BackfillError> {
    let exists = relay_tables::backfill_table_named(client)
        .await
        .map_err(query_err("cannot look up outbox_relay.backfill"))?;
    if !exists {
        return Ok(Vec::new());
    }
    // `on_create` came with migration 0007: a table without it holds no on-create cursors.
    let on_create = has_on_create_columns(client).await?;
    let rows = client
        .query(
            &format!(
                "SELECT table_name, filter, key_column, end_key, last_key, rows_done, rows_estimate, \
                        to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                        to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                        {}, extract(epoch FROM now() - updated_at)::float8 \
                 FROM outbox_relay.backfill WHERE slot_name = $1 ORDER BY started_at",
                if on_create { "on_create" } else { "false" }
            ),
            &[&slot],
        )
        .await
        .map_err(query_err("cannot read outbox_relay.backfill"))?;
    Ok(rows
        .iter()
        .map(|r| CursorStatus {
            id: CursorId {
                slot: slot.to_owned(),
                table: r.get(0),
                filter: r.get(1),
            },
            cursor: Cursor {
                key_column: r.get(2),
                end_key: r.get(3),
                last_key: r.get(4),
                rows_done: r.get(5),
                rows_estimate: r.get(6),
                started_at: r.get(7),
                finished_at: r.get(8),
                on_create: r.get(9),
            },
            updated_secs_ago: r.get(10),
        })
        .collect())
}

/// Whether `outbox_relay.backfill` has the on-create columns (migration 0007).
async fn has_on_create_columns(client: &Client) -> Result<bool, BackfillError> {
    relay_tables::backfill_has_on_create_columns(client)
        .await
        .map_err(query_err("cannot look up outbox_relay.backfill"))
}

/// The cursor table's key columns for `id`, as statement parameters.
fn key_params(id: &CursorId) -> [&(dyn tokio_postgres::types::ToSql + Sync); 3] {
    [&id.slot, &id.table, &id.filter]
}

const CURSOR_KEY: &str = "slot_name = $1 AND table_name = $2 AND filter_hash = md5($3)";

/// Sets up a session for the cursor: [`ensure_cursor_table`], and the backfill's application
/// name. A cursor write that a server crash loses only makes the next run repeat rows
/// (deduplicated by event id): the cursor is never ahead of the acks.
pub async fn prepare_cursor_session(client: &Client) -> Result<(), BackfillError> {
    ensure_cursor_table(client).await?;
    client
        .batch_execute("SET application_name = 'outbox-relay backfill'")
        .await
        .map_err(query_err("cannot set up the backfill's cursor session"))
}

/// Creates `outbox_relay.backfill` (and adds its on-create columns) when missing (a role
/// without CREATE works once an administrator applied the migrations).
pub async fn ensure_cursor_table(client: &Client) -> Result<(), BackfillError> {
    let exists = relay_tables::backfill_table_exists(client)
        .await
        .map_err(query_err("cannot look up outbox_relay.backfill"))?;
    if !exists {
        client.batch_execute(BACKFILL_MIGRATION).await.map_err(query_err(
            "outbox_relay.backfill does not exist and cannot be created: apply migrations/0003_relay_backfill.sql as an administrator, and GRANT SELECT, INSERT, UPDATE ON outbox_relay.backfill to the relay's role",
        ))?;
    }
    let on_create_columns = has_on_create_columns(client).await?;
    if !on_create_columns {
        client
            .batch_execute(BACKFILL_ON_CREATE_MIGRATION)
            .await
            .map_err(query_err(
                "outbox_relay.backfill lacks the on-create columns and the relay's role cannot add them: apply migrations/0007_backfill_on_create.sql as an administrator",
            ))?;
    }
    Ok(())
}

/// The stored cursor of `id`, if any.
pub async fn load_cursor(client: &Client, id: &CursorId) -> Result<Option<Cursor>, BackfillError> {
    let row = client
        .query_opt(
            &format!(
                "SELECT key_column, end_key, last_key, rows_done, rows_estimate, \
                        to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                        to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                        on_create \
                 FROM outbox_relay.backfill WHERE {CURSOR_KEY}"
            ),
            &key_params(id),
        )
        .await
        .map_err(query_err("cannot read outbox_relay.backfill"))?;
    Ok(row.map(|r| Cursor {
        key_column: r.get(0),
        end_key: r.get(1),
        last_key: r.get(2),
        rows_done: r.get(3),
        rows_estimate: r.get(4),
        started_at: r.get(5),
        finished_at: r.get(6),
        on_create: r.get(7),
    }))
}

/// Starts the backfill `id` from the beginning (replacing any earlier cursor).
pub async fn start_cursor(
    client: &Client,
    id: &CursorId,
    key_column: &str,
    end_key: Option<&str>,
    rows_estimate: Option<i64>,
) -> Result<(), BackfillError> {
    client
        .execute(
            "INSERT INTO outbox_relay.backfill AS b \
               (slot_name, table_name, filter_hash, filter, key_column, end_key, rows_estimate) \
             VALUES ($1, $2, md5($3), $3, $4, $5, $6) \
             ON CONFLICT (slot_name, table_name, filter_hash) DO UPDATE SET \
               filter = EXCLUDED.filter, key_column = EXCLUDED.key_column, \
               end_key = EXCLUDED.end_key, last_key = NULL, rows_done = 0, \
               rows_estimate = EXCLUDED.rows_estimate, started_at = now(), updated_at = now(), \
               finished_at = NULL, on_create = false, snapshot = NULL, consistent_lsn = NULL",
            &[
                &id.slot,
                &id.table,
                &id.filter,
                &key_column,
                &end_key,
                &rows_estimate,
            ],
        )
        .await
        .map_err(query_err("cannot store the backfill's cursor"))?;
    Ok(())
}

/// Stores that every row up to `last_key` is done (`rows_done` in all). Never moves back.
pub async fn save_cursor(
    client: &Client,
    id: &CursorId,
    last_key: &str,
    rows_done: i64,
) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            &format!(
                "UPDATE outbox_relay.backfill SET last_key = $4, rows_done = $5, updated_at = now() \
                 WHERE {CURSOR_KEY} AND rows_done <= $5"
            ),
            &[&id.slot, &id.table, &id.filter, &last_key, &rows_done],
        )
        .await?;
    Ok(())
}

/// Marks the backfill `id` finished.
pub async fn finish_cursor(client: &Client, id: &CursorId) -> Result<(), BackfillError> {
    client
        .execute(
            &format!(
                "UPDATE outbox_relay.backfill SET finished_at = now(), updated_at = now() \
                 WHERE {CURSOR_KEY}"
            ),
            &key_params(id),
        )
        .await
        .map_err(query_err("cannot mark the backfill finished"))?;
    Ok(())
}
