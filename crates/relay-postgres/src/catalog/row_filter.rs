//! Publication row filters (PostgreSQL 15+): what a publication keeps of an outbox table, and
//! whether that is exactly a shard ([`crate::shard`]).

use tokio_postgres::Client;

use crate::shard::{ROW_FILTERS_SINCE, RowFilterVerdict, ShardSpec};
use crate::sql::quote_ident;
use crate::sqlstate;

/// The row filter of `schema.table` in `publication` as PostgreSQL prints it; `None` without
/// one (or before PostgreSQL 15, which has none).
pub async fn row_filter(
    client: &Client,
    version_num: i32,
    publication: &str,
    schema: &str,
    table: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    if version_num < ROW_FILTERS_SINCE {
        return Ok(None);
    }
    Ok(client
        .query_opt(
            "SELECT rowfilter FROM pg_catalog.pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &schema, &table],
        )
        .await?
        .and_then(|r| r.get::<_, Option<String>>(0)))
}

/// Keys a filter is tried on: enough that a filter of another shard, another count or another
/// key disagrees on some (each disagrees on about half of them or more).
const SAMPLE_KEYS: i32 = 4096;

/// Whether the printed row filter `filter` keeps exactly the rows of `shard`: both are
/// evaluated on [`SAMPLE_KEYS`] keys, as the key column of a one-column row. A filter that
/// reads another column does not match (it cannot be evaluated on that row).
pub async fn filter_is_shard(
    client: &Client,
    filter: &str,
    shard: &ShardSpec,
) -> Result<bool, tokio_postgres::Error> {
    let key = crate::sql::quote_ident(&shard.key);
    // The filter is the server's own rendering of an expression it accepted as a row filter
    // (immutable built-ins over the table's columns only); it runs inside a read-only,
    // rolled-back transaction all the same.
    let sql = format!(
        "SELECT count(*) FROM (SELECT md5(g::text) || g AS {key} \
                               FROM generate_series(1, {SAMPLE_KEYS}) g) AS row_ \
         WHERE ({filter}) IS DISTINCT FROM ({})",
        shard.row_filter()
    );
    client.batch_execute("BEGIN TRANSACTION READ ONLY").await?;
    let result = client.query_one(&sql, &[]).await;
    client.batch_execute("ROLLBACK").await?;
    match result {
        Ok(row) => Ok(row.get::<_, i64>(0) == 0),
        // The filter reads a column the sample row does not have, or compares it as another
        // type: not this shard's filter.
        Err(e) if e.code().is_some_and(sqlstate::is_expression_mismatch) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads and judges the filter of `schema.table` in `settings.publication` against the
/// configured shard.
pub async fn row_filter_verdict(
    client: &tokio_postgres::Client,
    settings: &crate::PostgresSettings,
    version_num: i32,
    schema: &str,
    table: &str,
) -> Result<RowFilterVerdict, tokio_postgres::Error> {
    let publication = settings.publication.clone();
    let filter = row_filter(client, version_num, &publication, schema, table).await?;
    let name = format!("{schema}.{table}");
    Ok(match (&settings.shard, filter) {
        (None, None) => RowFilterVerdict::Unfiltered,
        (None, Some(filter)) => RowFilterVerdict::FilteredWithoutShard {
            table: name,
            publication,
            filter,
        },
        (Some(shard), found) => {
            let matches = match &found {
                Some(filter) => filter_is_shard(client, filter, shard).await?,
                None => false,
            };
            if matches {
                RowFilterVerdict::Shard(shard.clone())
            } else {
                RowFilterVerdict::NotTheShard {
                    table: name,
                    relation: format!("{}.{}", quote_ident(schema), quote_ident(table)),
                    publication,
                    shard: shard.clone(),
                    found,
                }
            }
        }
    })
}
