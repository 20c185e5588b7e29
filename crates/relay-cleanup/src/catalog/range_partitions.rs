//! A table range-partitioned on one column, as the cleanup's `drop-partitions` mode reads it:
//! its partition key, its direct partitions with their bounds, whether a partition may be
//! detached concurrently, what became of a partition detached earlier, and its newest range
//! (what `create_ahead` takes the width of new partitions from). Relations are named as SQL
//! (`relation`: quoted `schema.table`, read with `::regclass`).

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

/// The newest finite range of a table range-partitioned on one column: the bounds of its direct
/// partition (not being detached) with the greatest upper bound, as text values of the key's
/// type (unquoted), and that type. `None` when the table is not so partitioned or has no
/// partition with both bounds finite (only `DEFAULT`, `MINVALUE` or `MAXVALUE` ones).
pub async fn newest_range(
    client: &Client,
    relation: &str,
) -> Result<Option<NewestRange>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid), \
                    pg_catalog.format_type(a.atttypid, a.atttypmod) \
             FROM pg_catalog.pg_inherits i \
             JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid \
             JOIN pg_catalog.pg_partitioned_table pt ON pt.partrelid = i.inhparent \
             JOIN pg_catalog.pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0] \
             WHERE i.inhparent = $1::text::regclass AND pt.partstrat = 'r' AND pt.partnatts = 1 \
               AND NOT i.inhdetachpending",
            &[&relation],
        )
        .await?;
    let mut lowers = Vec::new();
    let mut uppers = Vec::new();
    let mut key_type = String::new();
    for row in &rows {
        let bound: String = row.get(0);
        if let Some((lower, upper)) = range_bounds(&bound) {
            lowers.push(lower);
            uppers.push(upper);
            key_type = row.get(1);
        }
    }
    if lowers.is_empty() {
        return Ok(None);
    }
    // Compared as the key's type, as PostgreSQL compares them.
    let newest = client
        .query_one(
            &format!(
                "SELECT l, u FROM unnest($1::text[], $2::text[]) AS b(l, u) \
                 ORDER BY u::{key_type} DESC LIMIT 1"
            ),
            &[&lowers, &uppers],
        )
        .await?;
    Ok(Some(NewestRange {
        lower: newest.get(0),
        upper: newest.get(1),
        key_type,
    }))
}

/// See [`newest_range`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewestRange {
    /// Lower bound, a value of `key_type` as text.
    pub lower: String,
    /// Upper bound (exclusive).
    pub upper: String,
    /// The partition key's type, e.g. `timestamp with time zone`.
    pub key_type: String,
}

/// The bounds of a one-column range partition (`FOR VALUES FROM ('a') TO ('b')`) as the values'
/// text (quotes removed); `None` for `DEFAULT`, `MINVALUE`/`MAXVALUE`, lists and hashes.
pub(crate) fn range_bounds(bound: &str) -> Option<(String, String)> {
    let rest = bound.strip_prefix("FOR VALUES FROM (")?;
    let (lower, upper) = rest.split_once(") TO (")?;
    let upper = upper.strip_suffix(')')?;
    Some((unquote(lower)?, unquote(upper)?))
}

/// `'it''s'` -> `it's`; `None` for anything that is not one quoted literal (`MAXVALUE`, a
/// number key is printed unquoted and has no time to age by anyway).
fn unquote(literal: &str) -> Option<String> {
    let inner = literal.strip_prefix('\'')?.strip_suffix('\'')?;
    Some(inner.replace("''", "'"))
}

#[cfg(test)]
mod tests;
