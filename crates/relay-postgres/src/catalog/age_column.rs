//! The cleanup's age column (`age_column`, or a partition key) as the catalog has it: its type,
//! judged by [`AgeSpec::judge`], and whether PostgreSQL knows `age_time_zone`.

use tokio_postgres::Client;

use crate::age_column::{AgeColumn, AgeKind, AgeSpec};

impl AgeSpec {
    /// Reads the type of the column of `schema.table` and judges it ([`Self::judge`]); checks
    /// that PostgreSQL knows `age_time_zone`. `Ok(None)` when the table or column does not
    /// exist.
    pub async fn resolve(
        &self,
        client: &Client,
        schema: &str,
        table: &str,
    ) -> Result<Option<Result<AgeColumn, String>>, tokio_postgres::Error> {
        let Some((type_oid, type_sql)) =
            column_base_type(client, schema, table, &self.column).await?
        else {
            return Ok(None);
        };
        let name = crate::sql::display_relation(schema, table);
        let judged = self.judge(&name, type_oid, &type_sql);
        if let Ok(AgeColumn {
            kind: AgeKind::WallClock { time_zone },
            ..
        }) = &judged
        {
            let known = client
                .query_one("SELECT now() AT TIME ZONE $1", &[time_zone])
                .await;
            if let Err(e) = known {
                return match e.as_db_error() {
                    Some(db) => Ok(Some(Err(format!(
                        "[outbox.cleanup] of {name}: age_time_zone = {time_zone:?} is not a time zone PostgreSQL knows ({}): use a name from pg_timezone_names, e.g. \"UTC\" or \"Europe/Berlin\"",
                        db.message()
                    )))),
                    None => Err(e),
                };
            }
        }
        Ok(Some(judged))
    }
}

/// The type of `column` of `schema.table`, a domain read as its base type: its oid and its SQL
/// name. `None` when the table or the column does not exist.
async fn column_base_type(
    client: &Client,
    schema: &str,
    table: &str,
    column: &str,
) -> Result<Option<(u32, String)>, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT COALESCE(NULLIF(t.typbasetype, 0), t.oid), \
                    pg_catalog.format_type(COALESCE(NULLIF(t.typbasetype, 0), t.oid), NULL) \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND a.attname = $3 \
               AND a.attnum > 0 AND NOT a.attisdropped",
            &[&schema, &table, &column],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

#[cfg(test)]
mod tests;
