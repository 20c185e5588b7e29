//! Publication row filters (PostgreSQL 15+): what a publication keeps of an outbox table, and
//! whether that is exactly a shard ([`crate::shard`]) or the table's configured `row_filter`
//! (with the shard's, both).

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
pub(crate) async fn filter_is_shard(
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

/// What the server makes of a configured row filter on a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Canonical {
    /// The filter as PostgreSQL prints it back (as `pg_publication_tables.rowfilter` does).
    Filter(String),
    /// Not one valid condition on the table: the server's message.
    Invalid(String),
    /// The check could not run (a privilege): the server's message.
    CannotCheck(String),
}

/// The probe table [`canonical_filter`] parses a filter on.
const PROBE: &str = "pg_temp.outbox_relay_row_filter";

/// How PostgreSQL prints the condition `filter` on `schema.table` back: parsed as a `CHECK`
/// constraint of an empty temporary copy of the table's columns (`LIKE`: names, types,
/// collations), then printed by `pg_get_expr` as `pg_publication_tables` prints a row filter
/// (both are the expression as parsed, printed against one relation). So a publication's filter
/// equals the configured one exactly when the two printed texts are equal, whatever spacing,
/// casts or parentheses the configuration wrote. Everything is rolled back; the statement that
/// parses the filter goes over the extended protocol, which takes one statement only.
pub(crate) async fn canonical_filter(
    client: &Client,
    schema: &str,
    table: &str,
    filter: &str,
) -> Result<Canonical, tokio_postgres::Error> {
    client.batch_execute("BEGIN").await?;
    let result = probe(client, schema, table, filter).await;
    client.batch_execute("ROLLBACK").await?;
    result
}

async fn probe(
    client: &Client,
    schema: &str,
    table: &str,
    filter: &str,
) -> Result<Canonical, tokio_postgres::Error> {
    let server_message = |e: &tokio_postgres::Error| {
        e.as_db_error()
            .map(|db| db.message().to_owned())
            .unwrap_or_else(|| e.to_string())
    };
    let copy = format!(
        "CREATE TEMP TABLE {} (LIKE {})",
        quote_ident("outbox_relay_row_filter"),
        crate::sql::quote_relation(schema, table)
    );
    if let Err(e) = client.execute(&copy, &[]).await {
        return match e.as_db_error() {
            Some(_) => Ok(Canonical::CannotCheck(server_message(&e))),
            None => Err(e),
        };
    }
    // On lines of its own: a `--` comment in the filter ends with its line.
    let parse = format!(
        "ALTER TABLE {PROBE} ADD CONSTRAINT outbox_relay_row_filter CHECK (\n{filter}\n) NOT VALID"
    );
    if let Err(e) = client.execute(&parse, &[]).await {
        return match e.code() {
            Some(code) if sqlstate::is_expression_mismatch(code) => {
                Ok(Canonical::Invalid(server_message(&e)))
            }
            Some(_) => Ok(Canonical::CannotCheck(server_message(&e))),
            None => Err(e),
        };
    }
    let row = client
        .query_one(
            &format!(
                "SELECT (SELECT pg_catalog.pg_get_expr(conbin, conrelid) FROM pg_catalog.pg_constraint \
                         WHERE conrelid = '{PROBE}'::regclass AND conname = 'outbox_relay_row_filter'), \
                        (SELECT count(*) FROM pg_catalog.pg_constraint \
                         WHERE conrelid = '{PROBE}'::regclass AND contype = 'c')"
            ),
            &[],
        )
        .await?;
    Ok(
        match (row.get::<_, Option<String>>(0), row.get::<_, i64>(1)) {
            (Some(printed), 1) => Canonical::Filter(printed),
            _ => Canonical::Invalid(
                "it is not one condition (it closes the parentheses around it)".into(),
            ),
        },
    )
}

/// The condition a publication keeps of a table when both a shard and a row filter apply.
#[must_use]
pub(crate) fn shard_and_filter(shard: Option<&ShardSpec>, filter: &str) -> String {
    match shard {
        Some(shard) => format!("({}) AND ({filter})", shard.row_filter()),
        None => filter.to_owned(),
    }
}

/// Reads and judges the filter of `schema.table` in `settings.publication` against the
/// configured shard and the table's `row_filter` (`configured`).
pub async fn row_filter_verdict(
    client: &tokio_postgres::Client,
    settings: &crate::PostgresSettings,
    version_num: i32,
    schema: &str,
    table: &str,
    configured: Option<&str>,
) -> Result<RowFilterVerdict, tokio_postgres::Error> {
    let publication = settings.publication.clone();
    let filter = row_filter(client, version_num, &publication, schema, table).await?;
    let name = crate::sql::display_relation(schema, table);
    let relation = crate::sql::quote_relation(schema, table);
    if let Some(configured) = configured {
        let wanted = shard_and_filter(settings.shard.as_ref(), configured);
        return Ok(
            match canonical_filter(client, schema, table, &wanted).await? {
                Canonical::Filter(expected) if filter.as_ref() == Some(&expected) => {
                    RowFilterVerdict::Configured { filter: expected }
                }
                Canonical::Filter(expected) => RowFilterVerdict::NotTheConfigured {
                    table: name,
                    relation,
                    publication,
                    configured: configured.to_owned(),
                    expected,
                    found: filter,
                },
                Canonical::Invalid(reason) => RowFilterVerdict::InvalidFilter {
                    table: name,
                    configured: configured.to_owned(),
                    reason,
                },
                Canonical::CannotCheck(reason) => RowFilterVerdict::CannotCheck {
                    table: name,
                    relation,
                    reason,
                },
            },
        );
    }
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
                    relation,
                    publication,
                    shard: shard.clone(),
                    found,
                }
            }
        }
    })
}
