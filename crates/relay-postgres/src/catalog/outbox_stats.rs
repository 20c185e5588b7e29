//! An outbox table's size, and how old its oldest row not yet confirmed is: for `status` and the
//! running relay's `/metrics` and `/status`.
//!
//! Rows and bytes come from the catalog (`pg_class.reltuples`, `pg_total_relation_size`, summed
//! over the partitions of a partitioned table), so they cost nothing whatever the table's size.
//!
//! "Not yet confirmed" is told by time, from a moment `since` whose WAL position is known to be
//! at or behind the stored checkpoint: a row created after `since` (its transaction started
//! after it) committed after that position, so it may still be ahead of the checkpoint; the
//! oldest such row is the one reported. The caller finds `since`: the running relay from its own
//! samples of (time, WAL position) ([`position_now`]), `status` from the position map
//! ([`confirmed_since_from_map`]). The query reads the rows created after `since`: cheap with an
//! index on the time column or partitions by it, a scan of the table otherwise.

use tokio_postgres::Client;

use super::table;
use crate::sql::quote_ident;

/// One outbox table as sampled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TableSample {
    /// Rows, estimated (`pg_class.reltuples`; 0 before the first `ANALYZE`).
    pub rows_estimate: f64,
    /// Bytes with indexes and TOAST.
    pub size_bytes: i64,
    /// Seconds since the oldest row created after `since` was created; 0 when there is none.
    /// `None` when the table has no such time column (or may not be read).
    pub oldest_unconfirmed_age: Option<f64>,
}

/// Samples `schema.table`: rows, bytes, and the oldest row created after `since` (Unix seconds;
/// `None`: every row counts) by the time column `age`, read by its type
/// ([`crate::age_column::AgeSpec`]). `None` when the table does not exist.
pub async fn sample(
    client: &Client,
    schema: &str,
    name: &str,
    age: &crate::age_column::AgeSpec,
    since: Option<f64>,
) -> Result<Option<TableSample>, tokio_postgres::Error> {
    let Some(info) = table(client, schema, name).await? else {
        return Ok(None);
    };
    let row = client
        .query_one(
            "SELECT COALESCE(sum(GREATEST(c.reltuples, 0)), 0)::float8, \
                    COALESCE(sum(pg_catalog.pg_total_relation_size(c.oid)), 0)::bigint \
             FROM pg_catalog.pg_class c \
             WHERE c.oid = $1 \
                OR c.oid IN (SELECT relid FROM pg_catalog.pg_partition_tree($1::oid::regclass))",
            &[&info.oid],
        )
        .await?;
    // A column that is missing or cannot be read as a time has no age to report.
    let column = match age.resolve(client, schema, name).await? {
        Some(Ok(column)) if info.readable => Some(column),
        _ => None,
    };
    let oldest_unconfirmed_age = match column {
        Some(column) => {
            let instant = column.instant(&quote_ident(&column.column));
            let sql = format!(
                "SELECT COALESCE(extract(epoch FROM clock_timestamp() - min({instant}))::float8, 0) \
                 FROM {} WHERE {instant} > to_timestamp($1)",
                crate::sql::quote_relation(schema, name),
            );
            let since = since.unwrap_or(f64::NEG_INFINITY);
            Some(
                client
                    .query_one(&sql, &[&since])
                    .await?
                    .get::<_, f64>(0)
                    .max(0.0),
            )
        }
        None => None,
    };
    Ok(Some(TableSample {
        rows_estimate: row.get(0),
        size_bytes: row.get(1),
        oldest_unconfirmed_age,
    }))
}

/// The time (microseconds since 1970, exact: a float of seconds loses the last microsecond) of
/// the row of `schema.table` whose `event_id_column` is `event_id`, read from its time column
/// `age` by the column's type; `None` when no row matches or the column is missing or holds no
/// time.
pub async fn row_time(
    client: &Client,
    schema: &str,
    name: &str,
    age: &crate::age_column::AgeSpec,
    event_id_column: &str,
    event_id: &str,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let Some(Ok(column)) = age.resolve(client, schema, name).await? else {
        return Ok(None);
    };
    let instant = column.instant(&quote_ident(&column.column));
    let sql = format!(
        "SELECT (extract(epoch FROM {instant}) * 1000000)::int8 FROM {} WHERE {}::text = $1 LIMIT 1",
        crate::sql::quote_relation(schema, name),
        quote_ident(event_id_column),
    );
    let row = client.query_opt(&sql, &[&event_id]).await?;
    Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)))
}

/// The server's time (Unix seconds) and WAL insert position now, the position read first: a
/// transaction that starts after the time commits after the position.
pub async fn position_now(
    client: &Client,
) -> Result<(f64, relay_core::Lsn), tokio_postgres::Error> {
    let position = super::wal_insert_position(client).await?;
    let time: f64 = client
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await?
        .get(0);
    Ok((time, position))
}

/// The newest commit time the position map records at or behind `checkpoint` (Unix seconds),
/// a stand-in for `since` when no sample of the relay's own is behind it; `None` without a
/// usable map.
pub async fn confirmed_since_from_map(
    client: &Client,
    slot: &str,
    checkpoint: relay_core::Lsn,
) -> Option<f64> {
    client
        .query_opt(
            "SELECT extract(epoch FROM max(commit_time))::float8 FROM outbox_relay.position_map \
             WHERE slot_name = $1 AND commit_lsn <= $2::text::pg_lsn",
            &[&slot, &checkpoint.to_string()],
        )
        .await
        .ok()
        .flatten()
        .and_then(|r| r.get::<_, Option<f64>>(0))
}
