//! What a backfill checks before it reads a row: the table is an outbox table, the mapping
//! fits it, the row filter is the publication's, no row to read has a NULL key.

use anyhow::anyhow;
use relay_backfill::{self as sql, BackfillError, TableShape};
use relay_core::route::{OutboxTableConfig, Router};

use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind};

/// The exit of a backfill that failed on `error`.
pub fn backfill_exit(error: BackfillError) -> Failure {
    let kind = match &error {
        e if e.is_transient() => FailureKind::Unavailable,
        BackfillError::Query { .. } => FailureKind::Internal,
        _ => FailureKind::Config,
    };
    Failure::new(kind, error)
}

/// The `[[outbox]]` mapping of `table` (`schema.table` or `table`).
pub fn mapping<'a>(config: &'a RelayConfig, table: &str) -> Result<&'a OutboxTableConfig, Failure> {
    let wanted = relay_core::ident::TableName::parse(table)
        .map_err(|e| Failure::config(anyhow!("--table: {e}")))?;
    config
        .outbox
        .iter()
        .find(|o| o.is_table(&wanted.schema, &wanted.table))
        .ok_or_else(|| {
            let configured: Vec<String> = config
                .outbox
                .iter()
                .map(OutboxTableConfig::display_name)
                .collect();
            Failure::config(anyhow!(
                "table `{}` is not configured as an outbox table (configured: {}): add an [[outbox]] entry for it, or name one of those",
                wanted.display(),
                configured.join(", ")
            ))
        })
}

/// The table's shape, checked before anything is read: the mapping fits it (the relay's own
/// check of its Relation), `filter` is a valid condition, no row to read has a NULL key.
pub async fn checked_shape(
    config: &RelayConfig,
    mapping: &OutboxTableConfig,
    reader: &tokio_postgres::Client,
    filter: Option<&str>,
) -> Result<TableShape, Failure> {
    let pg = &config.postgres;
    let (schema, table) = mapping.qualified_name();
    let shape = sql::table_shape(reader, &schema, &table, &mapping.event_id, &pg.publication)
        .await
        .map_err(backfill_exit)?;
    // The pages keep what the publication keeps; with a row_filter that must be the configured
    // one, or rows the relay would never stream get published (or the reverse).
    if mapping.row_filter.is_some() {
        let unavailable = |e: tokio_postgres::Error| Failure::new(FailureKind::Unavailable, e);
        let version = relay_postgres::catalog::server(reader)
            .await
            .map_err(unavailable)?
            .version_num;
        let verdict = relay_postgres::catalog::row_filter::row_filter_verdict(
            reader,
            pg,
            version,
            &schema,
            &table,
            mapping.row_filter.as_deref(),
        )
        .await
        .map_err(unavailable)?;
        if let Some(problem) = verdict.problem() {
            return Err(Failure::config(anyhow!("{problem}")));
        }
    }
    if !shape.in_publication {
        tracing::warn!(table = %shape.table, publication = %pg.publication, "the table is not in the publication: the live relay does not publish its new rows");
    }
    // The mapping must fit the table before anything is read: the same check the relay makes
    // on the table's Relation message.
    let mut check = Router::new(std::slice::from_ref(mapping)).map_err(Failure::config)?;
    check
        .on_relation(shape.relation.clone(), None)
        .map_err(|e| {
            Failure::config(
                anyhow::Error::new(e).context("the [[outbox]] mapping does not fit the table"),
            )
        })?;
    if let Some(filter) = filter {
        shape
            .check_filter(reader, filter)
            .await
            .map_err(backfill_exit)?;
    }
    let nulls = shape
        .null_keys(reader, filter)
        .await
        .map_err(backfill_exit)?;
    if nulls > 0 {
        return Err(Failure::new(
            FailureKind::DataSafety,
            anyhow!(
                "{nulls} rows of {} have a NULL event id (`{}`): no message can be built for them (the relay refuses such rows too). Fix or delete them, or leave them out with --where \"{} IS NOT NULL\"",
                shape.table,
                shape.key.name,
                shape.key.name
            ),
        ));
    }

    Ok(shape)
}
