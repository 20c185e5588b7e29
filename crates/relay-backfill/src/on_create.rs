//! The SQL of the backfill at slot creation (`backfill = "on-create"`, docs/replay.md).
//!
//! **First run.** The slot is created with an exported snapshot
//! ([`relay_postgres::bootstrap::ExportedSlot`]); the read session imports it
//! ([`import_snapshot`]) and reads every page inside it: the rows of transactions committed
//! before the slot's consistent point, and none after (those the slot streams). The snapshot
//! (`pg_current_snapshot()` text) and the consistent point are stored in the cursor row.
//!
//! **Resumed run.** The exported snapshot died with its connection. The pages are read in a new
//! REPEATABLE READ snapshot from the stored cursor to the stored end key, all rows: a row
//! committed before the consistent point is one of them unless it was deleted since. Rows in
//! that range whose inserting transaction the stored snapshot does not see are also in the
//! slot's stream ([`streamed_ids`]): the caller hands their event ids to the live pipeline,
//! which then does not publish them a second time.

use relay_core::Lsn;
use tokio_postgres::Client;

use super::snapshot::current_snapshot;
pub use super::snapshot::{begin_snapshot, end_snapshot};
use super::{BackfillError, CursorId, TableShape, query_err, quote_literal, simple_rows};

/// `pg_try_advisory_lock` key of a slot's on-create work: one relay at a time creates the slot
/// and runs its backfill (the lock ends with the session, also on kill -9).
const LOCK_KEY: &str = "hashtextextended('outbox-relay on-create backfill ' || $1, 0)";

/// Takes the slot's on-create lock on this session, if free.
pub async fn try_lock(client: &Client, slot: &str) -> Result<bool, BackfillError> {
    Ok(client
        .query_one(
            &format!("SELECT pg_try_advisory_lock({LOCK_KEY})"),
            &[&slot],
        )
        .await
        .map_err(query_err("cannot take the on-create backfill's lock"))?
        .get(0))
}

/// Releases the slot's on-create lock (the backfills finished: the relay streams now).
pub async fn unlock(client: &Client, slot: &str) -> Result<(), BackfillError> {
    client
        .execute(&format!("SELECT pg_advisory_unlock({LOCK_KEY})"), &[&slot])
        .await
        .map_err(query_err("cannot release the on-create backfill's lock"))?;
    Ok(())
}

/// Marks, before the slot is created, that the relay is creating it for an on-create
/// backfill of `tables` (`schema.table`): one cursor row each, without a snapshot yet.
pub async fn mark_pending(
    client: &Client,
    slot: &str,
    tables: &[String],
) -> Result<(), BackfillError> {
    client
        .execute(
            "INSERT INTO outbox_relay.backfill AS b \
               (slot_name, table_name, filter_hash, filter, key_column, on_create) \
             SELECT $1, t, md5(''), '', '', true FROM unnest($2::text[]) t \
             ON CONFLICT (slot_name, table_name, filter_hash) DO UPDATE SET \
               key_column = '', end_key = NULL, last_key = NULL, rows_done = 0, \
               rows_estimate = NULL, started_at = now(), updated_at = now(), \
               finished_at = NULL, on_create = true, snapshot = NULL, consistent_lsn = NULL",
            &[&slot, &tables],
        )
        .await
        .map_err(query_err("cannot store the on-create backfill's cursor"))?;
    Ok(())
}

/// Whether an on-create cursor of `slot` has no snapshot recorded: the relay that created the
/// slot died before it recorded the snapshot.
pub async fn unrecorded(client: &Client, slot: &str) -> Result<bool, BackfillError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM outbox_relay.backfill \
               WHERE slot_name = $1 AND on_create AND snapshot IS NULL)",
            &[&slot],
        )
        .await
        .map_err(query_err("cannot read outbox_relay.backfill"))?
        .get(0))
}

/// Drops `slot`, which the relay created for an on-create backfill and never streamed from
/// (no checkpoint, no snapshot recorded), so that it is created again with a snapshot.
pub async fn drop_unrecorded_slot(client: &Client, slot: &str) -> Result<(), BackfillError> {
    relay_postgres::catalog::drop_slot_if_exists(client, slot)
        .await
        .map_err(query_err(format!(
            "cannot drop replication slot {slot} (created for an on-create backfill whose snapshot was never recorded)"
        )))?;
    Ok(())
}

/// Records the snapshot of the on-create backfill `id`: its page key, the last key the
/// snapshot sees (`None`: the table was empty, the backfill is finished), the snapshot and the
/// slot's consistent point.
pub async fn record(
    client: &Client,
    id: &CursorId,
    key_column: &str,
    end_key: Option<&str>,
    snapshot: &str,
    consistent_lsn: Lsn,
) -> Result<(), BackfillError> {
    let consistent = consistent_lsn.to_string();
    client
        .execute(
            "UPDATE outbox_relay.backfill SET key_column = $4, end_key = $5, snapshot = $6, \
               consistent_lsn = $7::text::pg_lsn, updated_at = now(), \
               finished_at = CASE WHEN $5::text IS NULL THEN now() END \
             WHERE slot_name = $1 AND table_name = $2 AND filter_hash = md5($3) AND on_create",
            &[
                &id.slot,
                &id.table,
                &id.filter,
                &key_column,
                &end_key,
                &snapshot,
                &consistent,
            ],
        )
        .await
        .map_err(query_err("cannot store the on-create backfill's snapshot"))?;
    Ok(())
}

/// An on-create backfill that has not finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// `schema.table`.
    pub table: String,
    /// The slot's exported snapshot, `pg_snapshot` text.
    pub snapshot: String,
    /// The slot's consistent point.
    pub consistent_lsn: Lsn,
}

/// The on-create backfills of `slot` with a recorded snapshot that have not finished.
pub async fn unfinished(client: &Client, slot: &str) -> Result<Vec<Unfinished>, BackfillError> {
    let rows = client
        .query(
            "SELECT table_name, snapshot, consistent_lsn::text FROM outbox_relay.backfill \
             WHERE slot_name = $1 AND on_create AND snapshot IS NOT NULL \
               AND finished_at IS NULL ORDER BY table_name",
            &[&slot],
        )
        .await
        .map_err(query_err("cannot read outbox_relay.backfill"))?;
    Ok(rows
        .iter()
        .map(|r| Unfinished {
            table: r.get(0),
            snapshot: r.get(1),
            consistent_lsn: r
                .get::<_, Option<String>>(2)
                .and_then(|t| t.parse().ok())
                .unwrap_or_default(),
        })
        .collect())
}

/// Opens a read-only REPEATABLE READ transaction on `reader` in the exported snapshot
/// `snapshot_name` (while its replication connection is still open); returns the snapshot as
/// `pg_snapshot` text.
pub async fn import_snapshot(
    reader: &Client,
    snapshot_name: &str,
) -> Result<String, BackfillError> {
    reader
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
            quote_literal(snapshot_name)
        ))
        .await
        .map_err(query_err(format!(
            "cannot import the slot's exported snapshot {snapshot_name}"
        )))?;
    current_snapshot(reader).await
}

/// The event ids of the rows in `(after, end]` whose inserting transaction the slot's exported
/// `snapshot` does not see: committed after the consistent point, so the slot streams them,
/// and a resumed backfill (which reads every row in its range) publishes them too. At most
/// `limit`; `None` when there are more (then the stream's copies are only deduplicated by
/// JetStream within its duplicate window).
pub async fn streamed_ids(
    reader: &Client,
    shape: &TableShape,
    after: Option<&str>,
    end: &str,
    snapshot: &str,
    limit: usize,
) -> Result<Option<Vec<String>>, BackfillError> {
    let Some(column) = shape.event_id.map(|i| &shape.relation.columns[i].name) else {
        return Ok(Some(Vec::new()));
    };
    // The table itself, not [`TableShape::rows`]: the fence reads the row's `xmin`. The row
    // filter is the server's own rendering of the publication's.
    let row_filter = shape
        .row_filter
        .as_deref()
        .map(|f| format!(" AND (\n{f}\n)"))
        .unwrap_or_default();
    let sql = format!(
        "SELECT {}::text FROM {}{}{row_filter} AND {} LIMIT {}",
        super::quote_ident(column),
        shape.from,
        shape.key_range(after, Some(end)),
        relay_postgres::sql::after_fence(&quote_literal(snapshot)),
        limit + 1
    );
    let rows = simple_rows(reader, &sql).await.map_err(query_err(format!(
        "cannot read the rows of {} committed after the slot's consistent point",
        shape.table
    )))?;
    if rows.len() > limit {
        return Ok(None);
    }
    Ok(Some(
        rows.iter()
            .filter_map(|r| r.try_get(0).ok().flatten().map(str::to_owned))
            .collect(),
    ))
}
