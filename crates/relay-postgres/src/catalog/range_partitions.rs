//! A table range-partitioned on one column, as the cleanup's `drop-partitions` mode reads it:
//! its partition key, its direct partitions with their bounds, whether a partition may be
//! detached concurrently, and what became of a partition detached earlier. Relations are named
//! as SQL (`relation`: quoted `schema.table`, read with `::regclass`).

use tokio_postgres::{Client, GenericClient};

/// Whether the partitioned table `table_oid` is partitioned by RANGE on one column (what
/// dropping whole partitions by age needs).
pub async fn range_partitioned_on_one_column(
    client: &Client,
    table_oid: u32,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT partstrat = 'r' AND partnatts = 1 FROM pg_catalog.pg_partitioned_table \
             WHERE partrelid = $1",
            &[&table_oid],
        )
        .await?
        .is_some_and(|row| row.get(0)))
}

/// The partition key column of `relation`; `None` unless it is partitioned on one column (not
/// an expression).
pub(crate) async fn partition_key_column(
    client: &Client,
    relation: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT a.attname::text FROM pg_catalog.pg_partitioned_table pt \
             JOIN pg_catalog.pg_attribute a \
               ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0] \
             WHERE pt.partrelid = $1::text::regclass AND pt.partnatts = 1",
            &[&relation],
        )
        .await?
        .map(|r| r.get(0)))
}

/// A direct partition of a range-partitioned table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RangePartition {
    /// Relation OID.
    pub(crate) oid: u32,
    /// `schema.name`, quoted for SQL.
    pub(crate) name: String,
    /// The bound as PostgreSQL prints it (`FOR VALUES FROM (…) TO (…)`, `DEFAULT`).
    pub(crate) bound: String,
}

/// The direct partitions of `relation`, if it is range-partitioned on one column, by name;
/// partitions being detached concurrently are left out.
pub(crate) async fn range_partitions(
    client: &Client,
    relation: &str,
) -> Result<Vec<RangePartition>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT c.oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname), \
                    pg_catalog.pg_get_expr(c.relpartbound, c.oid) \
             FROM pg_catalog.pg_inherits i \
             JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_catalog.pg_partitioned_table pt ON pt.partrelid = i.inhparent \
             WHERE i.inhparent = $1::text::regclass AND pt.partstrat = 'r' AND pt.partnatts = 1 \
               AND NOT i.inhdetachpending \
             ORDER BY c.relname",
            &[&relation],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| RangePartition {
            oid: r.get(0),
            name: r.get(1),
            bound: r.get(2),
        })
        .collect())
}

/// Whether a partition of `relation` may be detached `CONCURRENTLY`: PostgreSQL 14+, and the
/// table has no default partition.
pub(crate) async fn may_detach_concurrently(
    client: &Client,
    relation: &str,
) -> Result<bool, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT current_setting('server_version_num')::int >= 140000 \
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_partitioned_table \
                                WHERE partrelid = $1::text::regclass AND partdefid <> 0)",
            &[&relation],
        )
        .await?
        .get(0))
}

/// What became of the relation `oid`, detached earlier (or being detached).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DetachState {
    /// The relation still exists.
    pub(crate) exists: bool,
    /// It is a partition (attached again, or its detach is pending).
    pub(crate) attached: bool,
    /// A concurrent detach of it was interrupted (`FINALIZE` finishes it).
    pub(crate) pending: bool,
}

/// [`DetachState`] of the relation `oid`.
pub(crate) async fn detach_state(
    client: &Client,
    oid: u32,
) -> Result<DetachState, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT c.oid IS NOT NULL, i.inhrelid IS NOT NULL, COALESCE(i.inhdetachpending, false) \
             FROM (SELECT $1::oid AS oid) o \
             LEFT JOIN pg_catalog.pg_class c ON c.oid = o.oid \
             LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = o.oid",
            &[&oid],
        )
        .await?;
    Ok(row
        .map(|r| DetachState {
            exists: r.get(0),
            attached: r.get(1),
            pending: r.get(2),
        })
        .unwrap_or_default())
}

/// The name (`schema.name`, quoted for SQL) of the relation `oid` if it is a table that is not a
/// partition (a detached partition not attached again nor dropped).
pub(crate) async fn detached_table_name(
    client: &impl GenericClient,
    oid: u32,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = $1 AND NOT c.relispartition",
            &[&oid],
        )
        .await?
        .map(|r| r.get(0)))
}

#[cfg(test)]
mod tests;
