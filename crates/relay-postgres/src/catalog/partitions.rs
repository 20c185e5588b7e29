//! Partitioned outbox tables: their partitions, and whether the publication delivers their rows
//! under the outbox table's own relation.
//!
//! pgoutput sends a partition's row as the partitioned root's (the root's relation OID and
//! name) only when the publication says `publish_via_partition_root = true`. Without it the row
//! arrives under the partition's OID and name, which no configured outbox table has:
//! `pg_publication_tables` then lists the partitions instead of the root, and the relay would
//! count the outbox's rows as "some other table". So the relay creates its publication with
//! the option, and a publication without it is refused with the `ALTER PUBLICATION` that fixes
//! it ([`Membership::PublishedAsPartitions`]).
//!
//! Rows committed before such an `ALTER PUBLICATION` are decoded with the catalog of their
//! time, so they still arrive as their partitions'. The router is told every partition of every
//! partitioned outbox table the catalog holds at the start of a session ([`outbox_partitions`],
//! `Router::bind_partitions`), and routes those rows as the outbox table's.

use tokio_postgres::Client;

use super::table;

/// One partition (at any level) of a partitioned table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Relation OID.
    pub oid: u32,
    /// Schema.
    pub schema: String,
    /// Name.
    pub name: String,
    /// A leaf (holds rows), not a partitioned table itself.
    pub is_leaf: bool,
    /// The partition bound as PostgreSQL prints it (`FOR VALUES FROM (…) TO (…)`, `DEFAULT`).
    pub bound: String,
}

/// The partitions of `oid` at every level below it, leaves and partitioned tables, in
/// `pg_partition_tree` order (empty for a table that is not partitioned).
pub async fn partitions(
    client: &Client,
    oid: u32,
) -> Result<Vec<Partition>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT c.oid, n.nspname::text, c.relname::text, t.isleaf, \
                    COALESCE(pg_catalog.pg_get_expr(c.relpartbound, c.oid), '') \
             FROM pg_catalog.pg_partition_tree($1::oid::regclass) t \
             JOIN pg_catalog.pg_class c ON c.oid = t.relid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE t.level > 0 ORDER BY t.level, c.relname",
            &[&oid],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Partition {
            oid: r.get(0),
            schema: r.get(1),
            name: r.get(2),
            is_leaf: r.get(3),
            bound: r.get(4),
        })
        .collect())
}

/// `(schema, table, partition oid)` for every partition of every partitioned outbox table
/// (`(schema, table)`), for `Router::bind_partitions`. Tables that do not exist or are not
/// partitioned add nothing.
pub(crate) async fn outbox_partitions(
    client: &Client,
    tables: &[(String, String)],
) -> Result<Vec<(String, String, u32)>, tokio_postgres::Error> {
    let mut out = Vec::new();
    for (schema, name) in tables {
        let Some(info) = table(client, schema, name).await? else {
            continue;
        };
        if !info.partitioned {
            continue;
        }
        for p in partitions(client, info.oid).await? {
            out.push((schema.clone(), name.clone(), p.oid));
        }
    }
    Ok(out)
}

/// How a publication delivers an outbox table's inserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Membership {
    /// Under the table's own relation OID and name: what the relay needs.
    Member,
    /// The publication does not cover the table at all.
    NotInPublication,
    /// The table is partitioned and covered, but the publication lacks
    /// `publish_via_partition_root`: its rows arrive as the partitions'.
    PublishedAsPartitions,
    /// The table is itself a partition and the publication publishes through its partitioned
    /// ancestor `schema.table`: its rows arrive as that table's.
    PublishedAsAncestor(String),
}

impl Membership {
    /// The problem with the fix, for a table (`schema.table`) that is not a [`Member`](Self::Member)
    /// of `publication`; `None` for a member.
    #[must_use]
    pub fn problem(&self, publication: &str, table: &str) -> Option<String> {
        match self {
            Self::Member => None,
            Self::NotInPublication => Some(format!(
                "outbox table `{table}` is not in publication `{publication}`: ALTER PUBLICATION {publication} ADD TABLE {}",
                quote_displayed(table)
            )),
            Self::PublishedAsPartitions => Some(via_root_problem(publication, table)),
            Self::PublishedAsAncestor(ancestor) => Some(format!(
                "outbox table `{table}` is a partition of `{ancestor}`, and publication `{publication}` publishes its rows as `{ancestor}`'s (publish_via_partition_root = true): they would not arrive as `{table}`'s. Configure [[outbox]] {} instead, or remove `{ancestor}` from the publication: ALTER PUBLICATION {publication} DROP TABLE {}; ALTER PUBLICATION {publication} ADD TABLE {}",
                toml_line("table", ancestor),
                quote_displayed(ancestor),
                quote_displayed(table)
            )),
        }
    }
}

use crate::sql::quote_displayed;
use relay_core::ident::toml_line;

/// The message for a partitioned outbox table published per partition.
fn via_root_problem(publication: &str, table: &str) -> String {
    format!(
        "outbox table `{table}` is partitioned, and publication `{publication}` publishes its rows as its partitions' (publish_via_partition_root is off): they would arrive under the partitions' names, not as `{table}`'s. ALTER PUBLICATION {publication} SET (publish_via_partition_root = true) and restart. Rows committed before that ALTER are still decoded as their partitions' (logical decoding reads each transaction with the catalog of its time); the relay routes them as `{table}`'s by the partitions it finds at start-up, so keep every partition attached until the relay has confirmed past the ALTER"
    )
}

/// How publication `publication` delivers the inserts of `schema.table` (which must exist; a
/// missing table or publication is [`Membership::NotInPublication`]).
///
/// `pg_publication_tables` lists what pgoutput sends rows as: with
/// `publish_via_partition_root` the topmost published partitioned table, without it the leaf
/// partitions. A table it lists is a member; otherwise `pg_publication_rel` (and, on
/// PostgreSQL 15+, `pg_publication_namespace`) over the table and its ancestors tells why not.
pub async fn membership(
    client: &Client,
    publication: &str,
    schema: &str,
    name: &str,
) -> Result<Membership, tokio_postgres::Error> {
    if super::publication_has_table(client, publication, schema, name).await? {
        return Ok(Membership::Member);
    }
    let Some(info) = table(client, schema, name).await? else {
        return Ok(Membership::NotInPublication);
    };
    let Some(publication_info) = super::publication(client, publication).await? else {
        return Ok(Membership::NotInPublication);
    };
    let schemas = client
        .query_one(
            "SELECT current_setting('server_version_num')::int >= 150000",
            &[],
        )
        .await?
        .get::<_, bool>(0);
    // The table itself and every partitioned table above it.
    let covered_by = format!(
        "WITH lineage AS ( \
             SELECT $2::oid AS relid \
             UNION SELECT relid FROM pg_catalog.pg_partition_ancestors($2::oid::regclass)) \
         SELECT p.puballtables \
             OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r \
                        WHERE r.prpubid = p.oid AND r.prrelid IN (SELECT relid FROM lineage)) \
             {} \
         FROM pg_catalog.pg_publication p WHERE p.pubname = $1",
        if schemas {
            "OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace s \
                        JOIN pg_catalog.pg_class c ON c.relnamespace = s.pnnspid \
                        WHERE s.pnpubid = p.oid AND c.oid IN (SELECT relid FROM lineage))"
        } else {
            ""
        }
    );
    let covered = client
        .query_opt(&covered_by, &[&publication, &info.oid])
        .await?
        .is_some_and(|r| r.get::<_, bool>(0));
    if !covered {
        return Ok(Membership::NotInPublication);
    }
    if info.partitioned && !publication_info.via_root {
        return Ok(Membership::PublishedAsPartitions);
    }
    // A partition published through an ancestor: name the ancestor pg_publication_tables lists.
    let ancestor = client
        .query_opt(
            "SELECT t.schemaname::text, t.tablename::text \
             FROM pg_catalog.pg_partition_ancestors($2::oid::regclass) a \
             JOIN pg_catalog.pg_class c ON c.oid = a.relid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_catalog.pg_publication_tables t \
               ON t.pubname = $1 AND t.schemaname = n.nspname AND t.tablename = c.relname \
             WHERE a.relid <> $2::oid LIMIT 1",
            &[&publication, &info.oid],
        )
        .await?
        .map(|r| crate::sql::display_relation(r.get(0), r.get(1)));
    Ok(match ancestor {
        Some(ancestor) => Membership::PublishedAsAncestor(ancestor),
        // Covered, yet listed neither as itself nor as an ancestor (e.g. a column list or
        // filter quirk): report it as missing, with the plain fix.
        None => Membership::NotInPublication,
    })
}

/// The first outbox table (`(schema, table)`) publication `publication` does not deliver as
/// its own, with what is wrong and the fix; `None` when every table is a member.
pub async fn first_problem(
    client: &Client,
    publication: &str,
    tables: &[(String, String)],
) -> Result<Option<(String, Membership)>, tokio_postgres::Error> {
    for (schema, name) in tables {
        let found = membership(client, publication, schema, name).await?;
        if found != Membership::Member {
            return Ok(Some((crate::sql::display_relation(schema, name), found)));
        }
    }
    Ok(None)
}

/// Binds the partitions of the partitioned outbox tables (`(schema, table)`) in `router`, as
/// the catalog has them now ([`outbox_partitions`], `Router::bind_partitions`).
pub async fn bind(
    client: &Client,
    tables: &[(String, String)],
    router: &mut relay_core::route::Router,
) -> Result<(), crate::PgError> {
    let found =
        outbox_partitions(client, tables)
            .await
            .map_err(|source| crate::PgError::Query {
                context: "cannot read the partitions of the outbox tables".into(),
                source,
            })?;
    router.bind_partitions(&found);
    Ok(())
}
