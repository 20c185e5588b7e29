//! The backfill's read snapshot: every page of a run is read in one read-only REPEATABLE READ
//! transaction, so a run sees the table as it was when it began, whatever commits meanwhile.
//! Rows committed later are the slot's to stream (the on-demand backfill requires the relay's
//! slot; the on-create backfill reads in the slot's exported snapshot).

use relay_core::Lsn;
use tokio_postgres::Client;

use super::{BackfillError, query_err, simple_rows};

/// Opens the read transaction of an on-demand backfill run on `reader`; returns the WAL insert
/// position read just after its snapshot was taken. Every transaction the snapshot sees
/// committed before that position, so once the relay's checkpoint reaches it, every row the
/// pages can return is in the stream (or on its way through the backfill itself), and rows the
/// relay publishes later were committed after the snapshot: the pages never return them.
pub async fn begin_page_snapshot(reader: &Client) -> Result<Lsn, BackfillError> {
    begin_read_only(reader).await?;
    // The transaction's first statement takes the snapshot before its function runs.
    relay_postgres::catalog::wal_insert_position(reader)
        .await
        .map_err(query_err("cannot open the backfill's snapshot"))
}

/// Opens a read-only REPEATABLE READ transaction on `reader` (a resumed backfill reads its
/// pages and [`super::on_create::streamed_ids`] in one snapshot); returns it as `pg_snapshot`
/// text.
pub async fn begin_snapshot(reader: &Client) -> Result<String, BackfillError> {
    begin_read_only(reader).await?;
    current_snapshot(reader).await
}

/// `BEGIN` of the read transaction; its first statement takes the snapshot.
async fn begin_read_only(reader: &Client) -> Result<(), BackfillError> {
    reader
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .map_err(query_err("cannot open the backfill's snapshot"))
}

pub(super) async fn current_snapshot(reader: &Client) -> Result<String, BackfillError> {
    let rows = simple_rows(reader, "SELECT pg_catalog.pg_current_snapshot()::text")
        .await
        .map_err(query_err("cannot read the backfill's snapshot"))?;
    Ok(rows
        .first()
        .and_then(|r| r.try_get(0).ok().flatten())
        .unwrap_or_default()
        .to_owned())
}

/// Ends the read transaction.
pub async fn end_snapshot(reader: &Client) -> Result<(), BackfillError> {
    reader
        .batch_execute("COMMIT")
        .await
        .map_err(query_err("cannot end the backfill's snapshot"))
}
