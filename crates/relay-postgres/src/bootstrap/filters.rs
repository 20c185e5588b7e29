//! The outbox tables the publication must deliver, and the row filter it keeps of each: the
//! shard's (`[postgres] shard`), the table's `row_filter`, or both.

use tokio_postgres::Client;

use super::query_err;
use crate::catalog::row_filter::{self, Canonical};
use crate::{PgError, PostgresSettings};

/// An outbox table the publication must deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedTable {
    /// The schema, as the catalog stores it.
    pub schema: String,
    /// The table, as the catalog stores it.
    pub table: String,
    /// `[[outbox]] row_filter`: the publication keeps only the rows it keeps (PostgreSQL 15+).
    pub row_filter: Option<String>,
}

impl PublishedTable {
    /// A table without a row filter.
    #[must_use]
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> Self {
        Self {
            schema: schema.into(),
            table: table.into(),
            row_filter: None,
        }
    }

    /// `schema.table`, as the configuration writes it.
    #[must_use]
    pub fn name(&self) -> String {
        crate::sql::display_relation(&self.schema, &self.table)
    }

    /// `"schema"."table"`.
    #[must_use]
    pub fn relation(&self) -> String {
        crate::sql::quote_relation(&self.schema, &self.table)
    }
}

/// The error for a table that does not exist, naming tables of a similar name (another case, a
/// dot that needed quotes, another schema) with the line that names them.
pub(super) async fn table_missing(
    client: &Client,
    t: &PublishedTable,
    database: String,
) -> PgError {
    let lookalikes = crate::catalog::table_lookalikes(client, &t.schema, &t.table)
        .await
        .unwrap_or_default();
    PgError::TableMissing {
        table: t.name(),
        database,
        lookalikes: crate::catalog::lookalikes_hint(&lookalikes),
    }
}

/// The row filter a publication the relay creates gets on `t`: the shard's and the table's,
/// the latter as the server prints it back (one condition, checked before it goes into the
/// statement).
pub(super) async fn creation_filter(
    client: &Client,
    settings: &PostgresSettings,
    t: &PublishedTable,
) -> Result<Option<String>, PgError> {
    let Some(configured) = &t.row_filter else {
        return Ok(settings
            .shard
            .as_ref()
            .map(crate::shard::ShardSpec::row_filter));
    };
    let wanted = row_filter::shard_and_filter(settings.shard.as_ref(), configured);
    let canonical = row_filter::canonical_filter(client, &t.schema, &t.table, &wanted)
        .await
        .map_err(query_err(format!(
            "cannot check the row_filter of {}",
            t.name()
        )))?;
    match canonical {
        Canonical::Filter(filter) => Ok(Some(filter)),
        Canonical::Invalid(reason) => Err(PgError::Settings(
            crate::shard::RowFilterVerdict::InvalidFilter {
                table: t.name(),
                configured: configured.clone(),
                reason,
            }
            .problem()
            .unwrap_or_default(),
        )),
        Canonical::CannotCheck(reason) => Err(PgError::Settings(
            crate::shard::RowFilterVerdict::CannotCheck {
                table: t.name(),
                relation: t.relation(),
                reason,
            }
            .problem()
            .unwrap_or_default(),
        )),
    }
}

/// The publication's row filter on `t` against `[postgres] shard` and `t`'s `row_filter` (see
/// [`row_filter::row_filter_verdict`]): refused when it is not what they make; a filter
/// without either is the publication owner's choice, said once at start.
pub(super) async fn check_row_filter(
    client: &Client,
    settings: &PostgresSettings,
    version_num: i32,
    t: &PublishedTable,
) -> Result<(), PgError> {
    let publication = &settings.publication;
    let verdict = row_filter::row_filter_verdict(
        client,
        settings,
        version_num,
        &t.schema,
        &t.table,
        t.row_filter.as_deref(),
    )
    .await
    .map_err(query_err(format!(
        "cannot check the row filter of {} in publication {publication}",
        t.name()
    )))?;
    if let Some(problem) = verdict.problem() {
        return Err(PgError::Settings(problem));
    }
    if let Some(warning) = verdict.warning() {
        tracing::warn!(publication = %publication, table = %t.name(), "{warning}");
    }
    Ok(())
}
