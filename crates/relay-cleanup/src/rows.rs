//! Row cleanup (`delete`, `mark`): batches selected in a snapshot, applied once the stored
//! checkpoint is past their horizon (the rule is in the module above).

use super::*;

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
    /// The table's `row_filter`: only rows it keeps are the relay's to clean.
    pub row_filter: Option<String>,
    /// Delete or mark.
    pub action: CleanupAction,
    /// Rows are left alone until `age_column` is older than this (zero: no age condition).
    pub retain: Duration,
    /// The column `retain` is measured on (e.g. `created_at`), and how to read it.
    pub age: AgeSpec,
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

impl RowPlan {
    /// `schema.table`, quoted.
    fn relation(&self) -> String {
        relay_postgres::sql::quote_relation(&self.schema, &self.table)
    }

    /// `schema.table`.
    #[must_use]
    pub fn name(&self) -> String {
        relay_postgres::sql::display_relation(&self.schema, &self.table)
    }

    /// The time column `retain` counts from, its type read now and judged
    /// ([`AgeSpec::resolve`]); `Ok(None)` without an age condition (`retain` zero). An
    /// `Err(problem)` means nothing may be cleaned: no such column, or one whose type does not
    /// fit the configuration.
    pub async fn age_column(
        &self,
        client: &Client,
    ) -> Result<Result<Option<AgeColumn>, String>, tokio_postgres::Error> {
        if self.retain.is_zero() {
            return Ok(Ok(None));
        }
        Ok(
            match self.age.resolve(client, &self.schema, &self.table).await? {
                Some(judged) => judged.map(Some),
                None => Err(format!(
                    "[outbox.cleanup] of {}: no column `{}` (age_column): fix age_column or add the column",
                    self.name(),
                    self.age.column
                )),
            },
        )
    }

    /// The conditions a candidate row meets (besides being behind the checkpoint); `age` is
    /// [`Self::age_column`]'s.
    fn conditions(&self, age: Option<&AgeColumn>) -> String {
        let mut parts = Vec::new();
        if let Some(age) = age.filter(|_| !self.retain.is_zero()) {
            parts.push(age.older_than(&quote_ident(&age.column), self.retain));
        }
        // The condition the publication keeps the table's rows by (checked at start to be
        // exactly that): rows it leaves out are never published, so never the relay's.
        if let Some(filter) = &self.row_filter {
            parts.push(format!("(\n{filter}\n)"));
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
    /// Only rows committed after `fence` ([`fence`]) are selected; `age` is
    /// [`Self::age_column`]'s.
    pub async fn select(
        &self,
        client: &mut Client,
        limit: i64,
        fence: &str,
        age: Option<&AgeColumn>,
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
        let horizon = relay_postgres::catalog::wal_insert_position(&tx).await?;
        let rows = tx
            .query(
                &format!(
                    "SELECT tableoid::oid::text || ':' || ctid::text || ':' || xmin::text, ctid::text \
                     FROM {} WHERE {} AND {} LIMIT $1",
                    self.relation(),
                    self.conditions(age),
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
    /// horizon, checked in the same transaction; `age` is [`Self::age_column`]'s.
    pub async fn apply(
        &self,
        client: &mut Client,
        slot: &str,
        batch: &Batch,
        age: Option<&AgeColumn>,
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
                    self.conditions(age)
                )
            }
        };
        let n = tx.execute(&sql, &[&batch.ctids, &batch.keys]).await?;
        tx.commit().await?;
        Ok(Applied::Done(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_conditions_skip_marked_rows() {
        let plan = RowPlan {
            schema: "public".into(),
            table: "outbox".into(),
            row_filter: None,
            action: CleanupAction::Mark {
                status: Some(("status".into(), "it's sent".into())),
                sent_at: Some("sent_at".into()),
            },
            retain: Duration::ZERO,
            age: AgeSpec {
                column: "created_at".into(),
                unit: None,
                time_zone: None,
            },
            batch_size: 10,
            statement_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(1),
        };
        assert_eq!(
            plan.conditions(None),
            "\"status\" IS DISTINCT FROM E'it''s sent'"
        );
        let plan = RowPlan {
            action: CleanupAction::Delete,
            retain: Duration::from_secs(90),
            ..plan
        };
        let age = plan
            .age
            .judge("public.outbox", 1184, "timestamp with time zone")
            .unwrap();
        assert_eq!(
            plan.conditions(Some(&age)),
            "\"created_at\" < now() - make_interval(secs => 90)"
        );
        let plan = RowPlan {
            row_filter: Some("listener_id = 'relay'".into()),
            ..plan
        };
        assert_eq!(
            plan.conditions(Some(&age)),
            "\"created_at\" < now() - make_interval(secs => 90) AND (\nlistener_id = 'relay'\n)"
        );
    }
}
