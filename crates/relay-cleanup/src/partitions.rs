//! Partition cleanup (`drop-partitions`): detach partitions older than `retain`, drop them once
//! the stored checkpoint is past the horizon read after the detach.

use super::*;
use crate::catalog::range_partitions;

/// Partition cleanup of one partitioned outbox table (range-partitioned on one column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropPlan {
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
    /// A partition is detached once the upper bound of its range is older than this.
    pub retain: Duration,
    /// `statement_timeout` of every cleanup statement (a `DETACH … CONCURRENTLY` waits for older
    /// transactions within it; cancelled, it is finished on a later round).
    pub statement_timeout: Duration,
    /// `lock_timeout` of every cleanup statement (a plain `DETACH` takes an `ACCESS EXCLUSIVE`
    /// lock on the table for a moment: inserts wait at most this long).
    pub lock_timeout: Duration,
    /// Partitions are created so that they cover at least this far past now ([`super::ahead`]);
    /// `None`: none are created.
    pub create_ahead: Option<Duration>,
    /// `age_unit`: the epoch unit of an integer partition key.
    pub age_unit: Option<EpochUnit>,
    /// `age_time_zone`: the zone of a `timestamp without time zone` partition key.
    pub age_time_zone: Option<String>,
}

/// What one round of partition cleanup did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DropReport {
    /// Partitions detached this round (`schema.name`).
    pub detached: Vec<String>,
    /// Partitions dropped this round.
    pub dropped: Vec<String>,
    /// Detached partitions waiting for the checkpoint to pass their horizon.
    pub waiting: usize,
    /// Partitions created ahead of time this round.
    pub created: Vec<String>,
    /// Why partitions could not be created ahead, if they could not.
    pub ahead_problem: Option<String>,
    /// Why no partition was judged by age this round (its key's type), if none was.
    pub key_problem: Option<String>,
}

/// A detached partition on record.
#[derive(Debug)]
struct Detached {
    oid: u32,
    name: String,
    horizon: Option<Lsn>,
}

impl DropPlan {
    /// `schema.table`.
    #[must_use]
    pub fn name(&self) -> String {
        relay_postgres::sql::display_relation(&self.schema, &self.table)
    }

    /// The partition key with `age_unit`/`age_time_zone`; `None` unless the table is
    /// partitioned on one column.
    pub async fn key_spec(
        &self,
        client: &Client,
    ) -> Result<Option<AgeSpec>, tokio_postgres::Error> {
        let key = range_partitions::partition_key_column(client, &self.relation()).await?;
        Ok(key.map(|column| AgeSpec {
            column,
            unit: self.age_unit,
            time_zone: self.age_time_zone.clone(),
        }))
    }

    /// The partition key, its type read now and judged ([`AgeSpec::judge`]); `Err` when it
    /// cannot be read as a time (nothing is detached).
    pub async fn key_column(
        &self,
        client: &Client,
    ) -> Result<Result<AgeColumn, String>, tokio_postgres::Error> {
        let Some(spec) = self.key_spec(client).await? else {
            return Ok(Err(format!(
                "[outbox.cleanup] of {}: mode = \"drop-partitions\" needs a table partitioned by RANGE on one time column (not an expression)",
                self.name()
            )));
        };
        Ok(
            match spec.resolve(client, &self.schema, &self.table).await? {
                Some(judged) => judged.map_err(|p| super::of_partition_key(&p)),
                None => Err(format!(
                    "[outbox.cleanup] of {}: no partition key column",
                    self.name()
                )),
            },
        )
    }

    pub(super) fn relation(&self) -> String {
        relay_postgres::sql::quote_relation(&self.schema, &self.table)
    }

    /// One round: drops detached partitions the checkpoint of `slot` is past, then detaches the
    /// partitions whose range is older than `retain` and that hold no row from before `fence`
    /// ([`fence`]).
    pub async fn round(
        &self,
        client: &mut Client,
        slot: &str,
        fence: &str,
    ) -> Result<DropReport, tokio_postgres::Error> {
        let mut report = DropReport::default();
        client
            .batch_execute(&format!(
                "SET statement_timeout = {}; SET lock_timeout = {}",
                millis(self.statement_timeout),
                millis(self.lock_timeout)
            ))
            .await?;
        let result = self.round_inner(client, slot, fence, &mut report).await;
        // The session is the cleanup's own, but leave it as it was for the next user.
        let _ = client
            .batch_execute("RESET statement_timeout; RESET lock_timeout")
            .await;
        result.map(|()| report)
    }

    async fn round_inner(
        &self,
        client: &mut Client,
        slot: &str,
        fence: &str,
        report: &mut DropReport,
    ) -> Result<(), tokio_postgres::Error> {
        for detached in self.on_record(client).await? {
            match detached.horizon {
                None => self.finish_detach(client, &detached).await?,
                Some(horizon) => {
                    if self
                        .drop_if_confirmed(client, slot, &detached, horizon)
                        .await?
                    {
                        report.dropped.push(detached.name.clone());
                    } else {
                        report.waiting += 1;
                    }
                }
            }
        }
        match self.key_column(client).await? {
            Ok(key) => {
                for (oid, name) in self.expired(client, fence, &key).await? {
                    self.detach(client, oid, &name).await?;
                    report.detached.push(name);
                    report.waiting += 1;
                }
            }
            Err(problem) => report.key_problem = Some(problem),
        }
        if let Some(ahead) = self.create_ahead {
            let created = self.create_ahead(client, ahead).await?;
            report.created = created.created;
            report.ahead_problem = created.problem;
        }
        Ok(())
    }

    async fn on_record(&self, client: &Client) -> Result<Vec<Detached>, tokio_postgres::Error> {
        let rows = client
            .query(
                "SELECT partition_oid, partition, horizon::text FROM outbox_relay.cleanup_detached \
                 WHERE table_name = $1 ORDER BY detached_at",
                &[&self.name()],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Detached {
                oid: r.get(0),
                name: r.get(1),
                horizon: r
                    .get::<_, Option<String>>(2)
                    .and_then(|t| Lsn::from_str(&t).ok()),
            })
            .collect())
    }

    /// A detach that was interrupted: finished (`FINALIZE` of a concurrent detach left
    /// pending), recorded with its horizon (done), or forgotten (never happened, or the table
    /// is gone).
    async fn finish_detach(
        &self,
        client: &Client,
        detached: &Detached,
    ) -> Result<(), tokio_postgres::Error> {
        let range_partitions::DetachState {
            exists,
            attached,
            pending,
        } = range_partitions::detach_state(client, detached.oid).await?;
        if exists && pending {
            client
                .batch_execute(&format!(
                    "ALTER TABLE {} DETACH PARTITION {} FINALIZE",
                    self.relation(),
                    detached.name
                ))
                .await?;
        } else if !exists || attached {
            return forget(client, detached.oid).await;
        }
        record_horizon(client, detached.oid).await
    }

    async fn drop_if_confirmed(
        &self,
        client: &mut Client,
        slot: &str,
        detached: &Detached,
        horizon: Lsn,
    ) -> Result<bool, tokio_postgres::Error> {
        let tx = client.transaction().await?;
        let checkpoint = stored_checkpoint(&tx, slot).await?;
        if checkpoint.is_none_or(|c| c < horizon) {
            tx.rollback().await?;
            return Ok(false);
        }
        // Still a detached table of that OID (not attached again, not dropped by someone else).
        let table = range_partitions::detached_table_name(&tx, detached.oid).await?;
        if let Some(table) = table {
            tx.batch_execute(&format!("DROP TABLE {table}")).await?;
        }
        tx.execute(
            "DELETE FROM outbox_relay.cleanup_detached WHERE partition_oid = $1",
            &[&detached.oid],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Direct partitions of a table range-partitioned on one column whose upper bound is older
    /// than `retain` (never the default partition, never one up to `MAXVALUE`) and that hold no
    /// row from before `fence`: `(oid, name)`.
    async fn expired(
        &self,
        client: &Client,
        fence: &str,
        key: &AgeColumn,
    ) -> Result<Vec<(u32, String)>, tokio_postgres::Error> {
        let partitions = range_partitions::range_partitions(client, &self.relation()).await?;
        let mut out = Vec::new();
        for range_partitions::RangePartition { oid, name, bound } in partitions {
            let Some(upper) = range_upper(&bound) else {
                continue;
            };
            // The literal is PostgreSQL's own rendering of the bound, read in the key's terms.
            let old = client
                .query_one(
                    &format!("SELECT {}", key.older_than(&key.typed(upper), self.retain)),
                    &[],
                )
                .await;
            match old {
                Ok(row) if row.get::<_, bool>(0) => {
                    let before_fence: bool = client
                        .query_one(
                            &format!(
                                "SELECT EXISTS (SELECT 1 FROM {name} WHERE NOT {})",
                                after_fence("$1")
                            ),
                            &[&fence],
                        )
                        .await?
                        .get(0);
                    if before_fence {
                        tracing::debug!(partition = %name, "partition holds rows from before the cleanup fence (not published by this slot): left alone");
                    } else {
                        out.push((oid, name));
                    }
                }
                Ok(_) => {}
                Err(e) if e.as_db_error().is_some() => {
                    tracing::debug!(partition = %name, bound, error = %e, "partition bound is not a time: not a cleanup candidate");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Records the partition, detaches it (`CONCURRENTLY` where PostgreSQL allows it: 14+, no
    /// default partition), then records its horizon.
    async fn detach(
        &self,
        client: &Client,
        oid: u32,
        name: &str,
    ) -> Result<(), tokio_postgres::Error> {
        client
            .execute(
                "INSERT INTO outbox_relay.cleanup_detached (partition_oid, table_name, partition) \
                 VALUES ($1, $2, $3) ON CONFLICT (partition_oid) DO NOTHING",
                &[&oid, &self.name(), &name],
            )
            .await?;
        let concurrently =
            range_partitions::may_detach_concurrently(client, &self.relation()).await?;
        client
            .batch_execute(&format!(
                "ALTER TABLE {} DETACH PARTITION {name}{}",
                self.relation(),
                if concurrently { " CONCURRENTLY" } else { "" }
            ))
            .await?;
        tracing::info!(table = %self.name(), partition = name, concurrently, "detached an outbox partition older than retain; it is dropped once the checkpoint is past its rows");
        record_horizon(client, oid).await
    }
}

/// Sets the horizon of a detached partition: the WAL insert position now, after the detach.
async fn record_horizon(client: &Client, oid: u32) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "UPDATE outbox_relay.cleanup_detached SET horizon = pg_current_wal_insert_lsn() \
             WHERE partition_oid = $1",
            &[&oid],
        )
        .await?;
    Ok(())
}

async fn forget(client: &Client, oid: u32) -> Result<(), tokio_postgres::Error> {
    client
        .execute(
            "DELETE FROM outbox_relay.cleanup_detached WHERE partition_oid = $1",
            &[&oid],
        )
        .await?;
    Ok(())
}

/// The upper bound of a one-column range partition bound (`FOR VALUES FROM (…) TO ('x')`), as
/// the SQL literal PostgreSQL printed; `None` for `DEFAULT`, `MAXVALUE`, lists, hashes.
fn range_upper(bound: &str) -> Option<&str> {
    let upper = bound.rsplit_once(" TO (")?.1.strip_suffix(')')?;
    (!upper.eq_ignore_ascii_case("MAXVALUE") && !upper.is_empty()).then_some(upper)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_upper_bounds() {
        assert_eq!(
            range_upper("FOR VALUES FROM ('2030-01-01 00:00:00+00') TO ('2030-01-02 00:00:00+00')"),
            Some("'2030-01-02 00:00:00+00'")
        );
        assert_eq!(
            range_upper("FOR VALUES FROM (MINVALUE) TO (MAXVALUE)"),
            None
        );
        assert_eq!(range_upper("DEFAULT"), None);
        assert_eq!(range_upper("FOR VALUES IN (1, 2)"), None);
    }
}
