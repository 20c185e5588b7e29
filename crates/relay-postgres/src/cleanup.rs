//! Cleanup of outbox rows tied to the confirmed position (opt-in, per table): rows whose
//! events are at or behind the stored checkpoint are deleted, or marked, in small batches on a
//! session of their own; whole partitions are detached and dropped.
//!
//! # Which rows are behind the checkpoint
//!
//! A row does not say at which WAL position its transaction committed, and neither its
//! `created_at` nor its commit time orders it against the checkpoint (a long transaction commits
//! after rows created later; commit timestamps need `track_commit_timestamp` and are not in WAL
//! order either). The rule used instead needs no server setting:
//!
//! 1. A `REPEATABLE READ` transaction's first statement reads `pg_current_wal_insert_lsn()`, the
//!    batch's **horizon**. The transaction's snapshot is taken before that statement runs, and
//!    PostgreSQL makes a transaction visible only after its commit record is in WAL, so every
//!    transaction the snapshot sees committed before the horizon.
//! 2. In that snapshot it selects candidate rows (older than `retain`, after the fence), by
//!    `(tableoid, ctid, xmin)`: each was written by a transaction the snapshot sees, so each
//!    row's insert committed before the horizon (an updated row's `xmin` is the updater's, which
//!    saw the insert committed). The transaction ends at once: nothing is held while waiting.
//! 3. The batch is applied only once the stored checkpoint (`outbox_relay.checkpoint`, which the
//!    relay writes only after JetStream acknowledged every event before it) is at or past the
//!    horizon, checked again in the transaction that deletes or marks. The checkpoint confirms
//!    every transaction that committed before it, so every row of the batch is behind it.
//! 4. The statement matches `(tableoid, ctid, xmin)` exactly: a row updated, deleted or
//!    replaced in the same place since the selection no longer matches and is left alone.
//!
//! A checkpoint that never reaches the horizon (a broker outage, a stuck relay) applies
//! nothing; the batch is dropped after a while and selected again later.
//!
//! Rows committed before the slot existed are behind every checkpoint, yet the relay never
//! published them. So only rows committed after the table's **fence** ([`fence`]) are selected:
//! a snapshot taken once the slot, its stored checkpoint and the table's membership in the
//! publication were seen; a transaction that snapshot does not see was decoded by the slot. The
//! only way a row ahead of the relay could still go is a checkpoint moved forward by hand
//! (`--accept-slot-position`): then rows the relay never published count as behind it.
//!
//! Partitions ([`DropPlan`]): a partition whose whole range is older than `retain` is detached
//! first, so no row can be added to it any more (every transaction that wrote into it has ended
//! when the detach returns); the horizon is read after that, and the partition is dropped once
//! the checkpoint is past it. Detached partitions waiting for their drop are recorded in
//! `outbox_relay.cleanup_detached`, so a restart finishes what a crash interrupted.

use std::str::FromStr;
use std::time::Duration;

use relay_core::Lsn;
use tokio_postgres::Client;

/// What cleanup does with rows behind the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanupAction {
    /// Delete them.
    Delete,
    /// Set columns: `status_column = status_value` and/or `sent_at_column = now()`.
    Mark {
        /// The status column and the value it gets, e.g. `("status", "sent")`.
        status: Option<(String, String)>,
        /// A timestamp column set to `now()`.
        sent_at: Option<String>,
    },
}

/// Row cleanup of one outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPlan {
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
    /// Delete or mark.
    pub action: CleanupAction,
    /// Rows are left alone until `age_column` is older than this (zero: no age condition).
    pub retain: Duration,
    /// The column `retain` is measured on (e.g. `created_at`).
    pub age_column: String,
    /// Rows per batch.
    pub batch_size: i64,
    /// `statement_timeout` of every cleanup statement.
    pub statement_timeout: Duration,
    /// `lock_timeout` of every cleanup statement.
    pub lock_timeout: Duration,
}

/// Rows selected in one snapshot, all committed before `horizon`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// `pg_current_wal_insert_lsn()` just after the snapshot was taken.
    pub horizon: Lsn,
    /// `tableoid:ctid:xmin` of each row.
    keys: Vec<String>,
    /// `ctid` of each row (for a TID scan).
    ctids: Vec<String>,
}

impl Batch {
    /// The batch in pieces of at most `size` rows, each with the batch's horizon.
    #[must_use]
    pub fn chunks(&self, size: usize) -> Vec<Batch> {
        let size = size.max(1);
        self.keys
            .chunks(size)
            .zip(self.ctids.chunks(size))
            .map(|(keys, ctids)| Batch {
                horizon: self.horizon,
                keys: keys.to_vec(),
                ctids: ctids.to_vec(),
            })
            .collect()
    }

    /// Rows in the batch.
    #[must_use]
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// No rows.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// What applying a batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Rows deleted or marked.
    Done(u64),
    /// The stored checkpoint is not at the batch's horizon yet (or none is stored): nothing was
    /// touched.
    NotConfirmed(Option<Lsn>),
}

/// Quotes an identifier for SQL (`"` doubled).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal for SQL (`'` doubled; `standard_conforming_strings` is on from
/// PostgreSQL 9.1).
fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

fn millis(d: Duration) -> u128 {
    d.as_millis().max(1)
}

/// `SET LOCAL` of the statement and lock timeouts.
fn timeouts(statement: Duration, lock: Duration) -> String {
    format!(
        "SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}",
        millis(statement),
        millis(lock)
    )
}

/// The stored checkpoint of `slot` on `client` (read committed), `None` when none is stored.
pub async fn stored_checkpoint(
    client: &impl tokio_postgres::GenericClient,
    slot: &str,
) -> Result<Option<Lsn>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT confirmed_lsn::text FROM outbox_relay.checkpoint WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row
        .and_then(|r| r.get::<_, Option<String>>(0))
        .and_then(|t| Lsn::from_str(&t).ok()))
}

/// The WAL insert position now (`pg_current_wal_insert_lsn()`).
pub async fn wal_insert_position(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Lsn, tokio_postgres::Error> {
    let text: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    Ok(Lsn::from_str(&text).unwrap_or_default())
}

impl RowPlan {
    /// `schema.table`, quoted.
    fn relation(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }

    /// `schema.table`.
    #[must_use]
    pub fn name(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    /// The conditions a candidate row meets (besides being behind the checkpoint).
    fn conditions(&self) -> String {
        let mut parts = Vec::new();
        if !self.retain.is_zero() {
            parts.push(format!(
                "{} < now() - make_interval(secs => {})",
                quote_ident(&self.age_column),
                self.retain.as_secs_f64()
            ));
        }
        if let CleanupAction::Mark { status, sent_at } = &self.action {
            // Not marked yet: a marked row is not selected again.
            match (status, sent_at) {
                (Some((column, value)), _) => parts.push(format!(
                    "{} IS DISTINCT FROM {}",
                    quote_ident(column),
                    quote_literal(value)
                )),
                (None, Some(column)) => parts.push(format!("{} IS NULL", quote_ident(column))),
                (None, None) => parts.push("false".into()),
            }
        }
        if parts.is_empty() {
            "true".into()
        } else {
            parts.join(" AND ")
        }
    }

    /// Selects the next batch: the horizon, then up to `limit` candidate rows, in one
    /// `REPEATABLE READ` snapshot (see the module documentation). Apply it in [`Batch::chunks`]
    /// of `batch_size`: one wait for the checkpoint serves them all.
    /// Only rows committed after `fence` ([`fence`]) are selected.
    pub async fn select(
        &self,
        client: &mut Client,
        limit: i64,
        fence: &str,
    ) -> Result<Batch, tokio_postgres::Error> {
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        // The first statement takes the snapshot: before pg_current_wal_insert_lsn() runs. (SET
        // LOCAL takes none.)
        tx.batch_execute(&timeouts(self.statement_timeout, self.lock_timeout))
            .await?;
        let horizon = wal_insert_position(&tx).await?;
        let rows = tx
            .query(
                &format!(
                    "SELECT tableoid::oid::text || ':' || ctid::text || ':' || xmin::text, ctid::text \
                     FROM {} WHERE {} AND {} LIMIT $1",
                    self.relation(),
                    self.conditions(),
                    after_fence("$2")
                ),
                &[&limit, &fence],
            )
            .await?;
        tx.commit().await?;
        let (keys, ctids) = rows.iter().map(|r| (r.get(0), r.get(1))).unzip();
        Ok(Batch {
            horizon,
            keys,
            ctids,
        })
    }

    /// Deletes or marks the batch's rows if the stored checkpoint of `slot` is at or past its
    /// horizon, checked in the same transaction.
    pub async fn apply(
        &self,
        client: &mut Client,
        slot: &str,
        batch: &Batch,
    ) -> Result<Applied, tokio_postgres::Error> {
        if batch.is_empty() {
            return Ok(Applied::Done(0));
        }
        let tx = client.transaction().await?;
        tx.batch_execute(&timeouts(self.statement_timeout, self.lock_timeout))
            .await?;
        let checkpoint = stored_checkpoint(&tx, slot).await?;
        if checkpoint.is_none_or(|c| c < batch.horizon) {
            tx.rollback().await?;
            return Ok(Applied::NotConfirmed(checkpoint));
        }
        let matching = "ctid = ANY($1::text[]::tid[]) \
             AND (tableoid::oid::text || ':' || ctid::text || ':' || xmin::text) = ANY($2::text[])";
        let sql = match &self.action {
            CleanupAction::Delete => format!("DELETE FROM {} WHERE {matching}", self.relation()),
            CleanupAction::Mark { status, sent_at } => {
                let mut set = Vec::new();
                if let Some((column, value)) = status {
                    set.push(format!(
                        "{} = {}",
                        quote_ident(column),
                        quote_literal(value)
                    ));
                }
                if let Some(column) = sent_at {
                    set.push(format!("{} = now()", quote_ident(column)));
                }
                format!(
                    "UPDATE {} SET {} WHERE {matching} AND {}",
                    self.relation(),
                    set.join(", "),
                    self.conditions()
                )
            }
        };
        let n = tx.execute(&sql, &[&batch.ctids, &batch.keys]).await?;
        tx.commit().await?;
        Ok(Applied::Done(n))
    }
}

/// The migration that creates `outbox_relay.cleanup_fence` and `outbox_relay.cleanup_detached`
/// (also shipped in `migrations/`).
pub const CLEANUP_MIGRATION: &str = include_str!("../../../migrations/0006_outbox_cleanup.sql");

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
        format!("{}.{}", self.schema, self.table)
    }

    fn relation(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
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
        for (oid, name) in self.expired(client, fence).await? {
            self.detach(client, oid, &name).await?;
            report.detached.push(name);
            report.waiting += 1;
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
        let state = client
            .query_opt(
                "SELECT c.oid IS NOT NULL, i.inhrelid IS NOT NULL, COALESCE(i.inhdetachpending, false) \
                 FROM (SELECT $1::oid AS oid) o \
                 LEFT JOIN pg_catalog.pg_class c ON c.oid = o.oid \
                 LEFT JOIN pg_catalog.pg_inherits i ON i.inhrelid = o.oid",
                &[&detached.oid],
            )
            .await?;
        let (exists, attached, pending) = state
            .map(|r| {
                (
                    r.get::<_, bool>(0),
                    r.get::<_, bool>(1),
                    r.get::<_, bool>(2),
                )
            })
            .unwrap_or_default();
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
        let table = tx
            .query_opt(
                "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) \
                 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = $1 AND NOT c.relispartition",
                &[&detached.oid],
            )
            .await?
            .map(|r| r.get::<_, String>(0));
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
    ) -> Result<Vec<(u32, String)>, tokio_postgres::Error> {
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
                &[&self.relation()],
            )
            .await?;
        let mut out = Vec::new();
        for row in rows {
            let (oid, name, bound): (u32, String, String) = (row.get(0), row.get(1), row.get(2));
            let Some(upper) = range_upper(&bound) else {
                continue;
            };
            // The literal is PostgreSQL's own rendering of the bound.
            let old = client
                .query_one(
                    &format!(
                        "SELECT ({upper})::timestamptz <= now() - make_interval(secs => {})",
                        self.retain.as_secs_f64()
                    ),
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
        let concurrently = client
            .query_one(
                "SELECT current_setting('server_version_num')::int >= 140000 \
                    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_partitioned_table \
                                    WHERE partrelid = $1::text::regclass AND partdefid <> 0)",
                &[&self.relation()],
            )
            .await?
            .get::<_, bool>(0);
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

    #[test]
    fn mark_conditions_skip_marked_rows() {
        let plan = RowPlan {
            schema: "public".into(),
            table: "outbox".into(),
            action: CleanupAction::Mark {
                status: Some(("status".into(), "it's sent".into())),
                sent_at: Some("sent_at".into()),
            },
            retain: Duration::ZERO,
            age_column: "created_at".into(),
            batch_size: 10,
            statement_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(1),
        };
        assert_eq!(
            plan.conditions(),
            "\"status\" IS DISTINCT FROM 'it''s sent'"
        );
        let plan = RowPlan {
            action: CleanupAction::Delete,
            retain: Duration::from_secs(90),
            ..plan
        };
        assert_eq!(
            plan.conditions(),
            "\"created_at\" < now() - make_interval(secs => 90)"
        );
    }
}

/// The statements that let `role` use the cleanup's tables.
pub fn cleanup_tables_grants(role: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA outbox_relay TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.cleanup_fence, outbox_relay.cleanup_detached TO {role}"
    )
}

/// What the current role may do with `outbox_relay.cleanup_fence` and
/// `outbox_relay.cleanup_detached` (usable only when both are there and writable).
pub async fn cleanup_tables_access(
    client: &Client,
) -> Result<crate::checkpoint::TableAccess, tokio_postgres::Error> {
    use crate::checkpoint::TableAccess;
    // (A list of privileges asks whether any of them is held: one call each.)
    let rows = client
        .query(
            "SELECT has_schema_privilege(n.oid, 'USAGE') \
                    AND has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT') \
                    AND has_table_privilege(c.oid, 'UPDATE') AND has_table_privilege(c.oid, 'DELETE'), \
                    current_user::text \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'outbox_relay' AND c.relname IN ('cleanup_fence', 'cleanup_detached')",
            &[],
        )
        .await?;
    Ok(match rows.as_slice() {
        [a, b] if a.get::<_, bool>(0) && b.get::<_, bool>(0) => TableAccess::Usable,
        [a, _] | [a] => TableAccess::NotGranted { role: a.get(1) },
        [] | [_, _, ..] => TableAccess::Missing,
    })
}

/// Makes sure the cleanup's tables exist and may be written (creating them when missing and
/// allowed); otherwise what to do about it.
pub async fn ensure_tables(client: &Client) -> Result<(), String> {
    use crate::checkpoint::TableAccess;
    let missing = "apply migrations/0006_outbox_cleanup.sql as an administrator (it needs outbox_relay.checkpoint, migrations/0002)";
    match cleanup_tables_access(client).await {
        Ok(TableAccess::Usable) => Ok(()),
        Ok(TableAccess::NotGranted { role }) => match client.batch_execute(CLEANUP_MIGRATION).await
        {
            // One of the two was missing and is there now.
            Ok(()) if matches!(cleanup_tables_access(client).await, Ok(TableAccess::Usable)) => {
                Ok(())
            }
            _ => Err(cleanup_tables_grants(&role)),
        },
        Ok(TableAccess::Missing) => client.batch_execute(CLEANUP_MIGRATION).await.map_err(|e| {
            format!("the cleanup's tables do not exist and cannot be created ({e}): {missing}")
        }),
        Err(e) => Err(e.to_string()),
    }
}

/// `NOT pg_visible_in_snapshot(xmin, fence)`: the row's transaction is one the fence snapshot
/// (parameter `fence_param`) does not see, i.e. it committed after the fence was taken. `xmin`
/// (32 bits) is widened against the current snapshot's `xmax`: a committed row's `xmin` is
/// below it and, short of 2^32 transactions ago, that many transactions back at most; a value
/// that cannot be widened (a special xid) counts as before the fence.
pub(crate) fn after_fence(fence_param: &str) -> String {
    let next = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint";
    format!(
        "NOT pg_visible_in_snapshot(GREATEST({next} - (({next} % 4294967296) - xmin::text::bigint + 4294967296) % 4294967296, 3)::text::xid8, {fence_param}::text::pg_snapshot)"
    )
}

/// The fence of `schema.table` for `slot` (see `migrations/0006_outbox_cleanup.sql`): read, or
/// established now when the slot exists, the relay stored a checkpoint for it, and publication
/// `publication` delivers the table's rows. `None` while that is not so (no row is cleaned).
pub async fn fence(
    client: &Client,
    slot: &str,
    schema: &str,
    table: &str,
    publication: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    let name = format!("{schema}.{table}");
    let read = async || -> Result<Option<String>, tokio_postgres::Error> {
        Ok(client
            .query_opt(
                "SELECT fence FROM outbox_relay.cleanup_fence WHERE slot_name = $1 AND table_name = $2",
                &[&slot, &name],
            )
            .await?
            .map(|r| r.get(0)))
    };
    if let Some(fence) = read().await? {
        return Ok(Some(fence));
    }
    let slot_ready = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_replication_slots s \
             JOIN outbox_relay.checkpoint c ON c.slot_name = s.slot_name \
             WHERE s.slot_name = $1 AND s.confirmed_flush_lsn IS NOT NULL",
            &[&slot],
        )
        .await?
        .is_some();
    let member = slot_ready
        && crate::catalog::partitions::membership(client, publication, schema, table).await?
            == crate::catalog::partitions::Membership::Member;
    if !member {
        return Ok(None);
    }
    // Taken after both were seen: a transaction it does not see commits after them.
    client
        .execute(
            "INSERT INTO outbox_relay.cleanup_fence (slot_name, table_name, fence) \
             VALUES ($1, $2, pg_current_snapshot()::text) ON CONFLICT DO NOTHING",
            &[&slot, &name],
        )
        .await?;
    let fence = read().await?;
    if let Some(fence) = &fence {
        tracing::info!(slot, table = %name, fence = %fence, "cleanup fence established: rows committed before it were not decoded by this slot and are never cleaned");
    }
    Ok(fence)
}

/// Whether the current role may run `plan`'s mode on `schema.table`, and if not, the statement
/// that grants it: `DELETE` (delete), `UPDATE` of the marked columns (mark), ownership of the
/// table (drop-partitions: `DETACH PARTITION` and `DROP TABLE` need it).
pub async fn privilege_problem(
    client: &Client,
    schema: &str,
    table: &str,
    mode: &PrivilegeNeed<'_>,
) -> Result<Option<String>, tokio_postgres::Error> {
    let relation = format!("{}.{}", quote_ident(schema), quote_ident(table));
    let row = client
        .query_opt(
            "SELECT c.oid, current_user::text, pg_catalog.pg_get_userbyid(c.relowner)::text, \
                    pg_catalog.pg_has_role(c.relowner, 'USAGE') \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let (oid, user, owner, owns): (u32, String, String, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    Ok(match mode {
        PrivilegeNeed::Delete => {
            let ok: bool = client
                // (A list of privileges asks whether any of them is held: one call each.)
                .query_one(
                    "SELECT has_table_privilege($1::oid, 'SELECT') \
                        AND has_table_privilege($1::oid, 'DELETE')",
                    &[&oid],
                )
                .await?
                .get(0);
            (!ok).then(|| format!("GRANT SELECT, DELETE ON {relation} TO {user}"))
        }
        PrivilegeNeed::Update(columns) => {
            let mut missing = Vec::new();
            for column in *columns {
                let ok: bool = client
                    .query_one(
                        "SELECT has_column_privilege($1::oid, $2::text, 'UPDATE')",
                        &[&oid, column],
                    )
                    .await?
                    .get(0);
                if !ok {
                    missing.push(quote_ident(column));
                }
            }
            (!missing.is_empty()).then(|| {
                format!(
                    "GRANT UPDATE ({}) ON {relation} TO {user}",
                    missing.join(", ")
                )
            })
        }
        PrivilegeNeed::Own => (!owns).then(|| {
            format!(
                "GRANT {} TO {user} (DETACH PARTITION and DROP TABLE need the table's owner, role {owner}; its partitions must be owned by it too)",
                quote_ident(&owner)
            )
        }),
    })
}

/// What a cleanup mode needs on the table.
#[derive(Debug, Clone, Copy)]
pub enum PrivilegeNeed<'a> {
    /// `delete`: `SELECT, DELETE`.
    Delete,
    /// `mark`: `UPDATE` of these columns.
    Update(&'a [String]),
    /// `drop-partitions`: membership in the owning role.
    Own,
}
