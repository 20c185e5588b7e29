//! Step 1 of `publication_order`: whether a publication may be newer than a replication slot,
//! by the ages of its catalog rows against the slot's `catalog_xmin` (tested through the
//! start-up check, e2e `publication_order`).

use tokio_postgres::Client;

use crate::PgError;

/// Whether the publication's oldest trace is not older than the slot's `catalog_xmin`
/// (compared by `age()`, safe across xid wraparound: the slot holds catalog vacuum back, so
/// no trace at or after its `catalog_xmin` can be frozen).
pub(crate) async fn maybe_newer_than_slot(
    client: &Client,
    slot: &str,
    publication: &str,
    server_version_num: i32,
) -> Result<bool, PgError> {
    let namespaces = if server_version_num >= 150_000 {
        ", (SELECT max(age(n.xmin)) FROM pg_catalog.pg_publication_namespace n \
            WHERE n.pnpubid = p.oid)"
    } else {
        ""
    };
    let sql = format!(
        "SELECT age(s.catalog_xmin), \
                GREATEST(age(p.xmin), \
                         (SELECT max(age(r.xmin)) FROM pg_catalog.pg_publication_rel r \
                          WHERE r.prpubid = p.oid){namespaces}) \
         FROM pg_catalog.pg_replication_slots s, pg_catalog.pg_publication p \
         WHERE s.slot_name = $1 AND p.pubname = $2"
    );
    let row = client
        .query_opt(&sql, &[&slot, &publication])
        .await
        .map_err(|source| PgError::Query {
            context: format!(
                "cannot compare publication {publication} with replication slot {slot}"
            ),
            source,
        })?;
    Ok(match row {
        Some(row) => match (row.get::<_, Option<i32>>(0), row.get::<_, Option<i32>>(1)) {
            (Some(slot_age), Some(publication_age)) => publication_age <= slot_age,
            _ => false,
        },
        None => false,
    })
}
