//! A table's shape in the catalog: its columns (and which belong to the replica identity), its
//! replica identity setting, what a publication publishes of it (column list, row filter), the
//! single-column key a backfill pages by.

use tokio_postgres::Client;

/// A column of a table, as pgoutput's Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnFacts {
    /// `attname`.
    pub(crate) name: String,
    /// `atttypid`.
    pub(crate) type_oid: u32,
    /// `atttypmod`.
    pub(crate) type_modifier: i32,
    /// Whether the column is part of the replica identity (every column with `FULL`).
    pub(crate) in_replica_identity: bool,
}

/// The columns of the table `oid` in order (dropped and generated columns left out).
pub(crate) async fn columns(
    client: &Client,
    oid: u32,
) -> Result<Vec<ColumnFacts>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod, \
                    CASE c.relreplident \
                      WHEN 'f' THEN true \
                      WHEN 'd' THEN EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
                        WHERE i.indrelid = c.oid AND i.indisprimary AND a.attnum = ANY (i.indkey)) \
                      WHEN 'i' THEN EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
                        WHERE i.indrelid = c.oid AND i.indisreplident AND a.attnum = ANY (i.indkey)) \
                      ELSE false END \
             FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' \
             ORDER BY a.attnum",
            &[&oid],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| ColumnFacts {
            name: r.get(0),
            type_oid: r.get(1),
            type_modifier: r.get(2),
            in_replica_identity: r.get(3),
        })
        .collect())
}

/// The replica identity setting of the table `oid` (`relreplident`: `d`, `n`, `f` or `i`).
pub(crate) async fn replica_identity(
    client: &Client,
    oid: u32,
) -> Result<i8, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT relreplident FROM pg_catalog.pg_class WHERE oid = $1",
            &[&oid],
        )
        .await?
        .get(0))
}

/// What `publication` publishes of `schema.table` (PostgreSQL 15+): its column list and row
/// filter (each `None` when there is none); `None` when the table is not in the publication.
pub(crate) async fn published_columns(
    client: &Client,
    publication: &str,
    schema: &str,
    table: &str,
) -> Result<Option<(Option<Vec<String>>, Option<String>)>, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT attnames::text[], rowfilter FROM pg_catalog.pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &schema, &table],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// A column that alone makes a unique key of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyColumn {
    /// The column.
    pub(crate) name: String,
    /// Its type, as SQL (`format_type`).
    pub(crate) type_sql: String,
    /// Whether it may be NULL (a unique index allows NULLs).
    pub(crate) nullable: bool,
    /// Whether it is the primary key (else a unique index on `event_id`).
    pub(crate) primary: bool,
}

/// The single-column primary key of the table `oid`, else the `event_id` column if a unique
/// index (valid, not partial, no expressions) covers it alone.
pub(crate) async fn single_column_key(
    client: &Client,
    oid: u32,
    event_id: &str,
) -> Result<Option<KeyColumn>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod), \
                    NOT a.attnotnull, i.indisprimary \
             FROM pg_catalog.pg_index i \
             JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = $1 AND i.indnkeyatts = 1 AND i.indisvalid \
               AND i.indpred IS NULL AND i.indexprs IS NULL \
               AND (i.indisprimary OR (i.indisunique AND a.attname = $2)) \
             ORDER BY i.indisprimary DESC LIMIT 1",
            &[&oid, &event_id],
        )
        .await?;
    Ok(row.map(|r| KeyColumn {
        name: r.get(0),
        type_sql: r.get(1),
        nullable: r.get(2),
        primary: r.get(3),
    }))
}

#[cfg(test)]
mod tests;
