//! Partitions created ahead of time (`drop-partitions` with `create_ahead`): the partitions
//! after the newest one, each as wide as it (its `age()`: `1 day`, `1 mon`, `01:00:00`, so
//! months and days stay calendar months and days in the server's time zone), until the
//! partitions cover `now() + create_ahead`. An insert past the last partition otherwise fails,
//! or lands in a default partition that blocks every later `CREATE … PARTITION OF` over its
//! rows. New partitions need nothing from the relay: the publication publishes through the root.

use super::*;
use crate::catalog::range_partitions::{NewestRange, newest_range};

/// At most this many partitions are created in one round (a very narrow partition width and a
/// long `create_ahead` would otherwise create thousands at once).
pub const MAX_CREATED_PER_ROUND: i64 = 64;

/// What one round of creating partitions ahead did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AheadReport {
    /// Partitions created (`schema.name`).
    pub created: Vec<String>,
    /// Why none could be created, when none could (nothing to take the width from).
    pub problem: Option<String>,
}

impl DropPlan {
    /// Creates the partitions missing up to `now() + ahead` (see the module).
    pub async fn create_ahead(
        &self,
        client: &Client,
        ahead: Duration,
    ) -> Result<AheadReport, tokio_postgres::Error> {
        let mut report = AheadReport::default();
        let Some(newest) = newest_range(client, &self.relation()).await? else {
            report.problem = Some(format!(
                "create_ahead: {} has no range partition with both bounds to take the width of \
                 new partitions from; create the first one by hand",
                self.name()
            ));
            return Ok(report);
        };
        let NewestRange {
            lower,
            upper,
            key_type,
        } = newest;
        // Each new range from the newest upper bound on, in steps of the newest width; the
        // name's suffix is the range's start, as precise as the width needs.
        let plan = client
            .query(
                &format!(
                    "WITH p AS (SELECT $1::text::{key_type}::timestamptz AS b, \
                                       age($1::text::{key_type}::timestamptz, $2::text::{key_type}::timestamptz) AS w) \
                     SELECT (b + w * (k - 1))::{key_type}::text, (b + w * k)::{key_type}::text, \
                            to_char(b + w * (k - 1), CASE \
                                WHEN date_trunc('month', w) = w THEN 'YYYYMM' \
                                WHEN date_trunc('day', w) = w THEN 'YYYYMMDD' \
                                WHEN date_trunc('hour', w) = w THEN 'YYYYMMDD\"_\"HH24' \
                                ELSE 'YYYYMMDD\"_\"HH24MISS' END), \
                            w > interval '0' \
                     FROM p, generate_series(1, $3::bigint) AS k \
                     WHERE b + w * (k - 1) < now() + make_interval(secs => $4::float8) \
                     ORDER BY k"
                ),
                &[
                    &upper,
                    &lower,
                    &MAX_CREATED_PER_ROUND,
                    &ahead.as_secs_f64(),
                ],
            )
            .await?;
        for row in plan {
            let (from, to, suffix, positive): (String, String, String, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if !positive {
                report.problem = Some(format!(
                    "create_ahead: the newest partition of {} spans nothing ({lower} to {upper})",
                    self.name()
                ));
                break;
            }
            let name = format!("{}_{suffix}", self.table);
            // PostgreSQL would cut a longer name to 63 bytes, silently naming another table.
            if name.len() > 63 {
                report.problem = Some(format!(
                    "create_ahead: partition name {name} is longer than 63 bytes; create \
                     partitions of {} by hand or use a shorter table name",
                    self.name()
                ));
                break;
            }
            let qualified = relay_postgres::sql::quote_relation(&self.schema, &name);
            client
                .batch_execute(&format!(
                    "CREATE TABLE {qualified} PARTITION OF {} FOR VALUES FROM ({}) TO ({})",
                    self.relation(),
                    quote_literal(&from),
                    quote_literal(&to)
                ))
                .await?;
            tracing::info!(table = %self.name(), partition = %name, from, to, "created an outbox partition ahead of time");
            report.created.push(format!("{}.{name}", self.schema));
        }
        Ok(report)
    }
}
