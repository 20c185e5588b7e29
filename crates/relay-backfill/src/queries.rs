//! The queries of one table's backfill: the key range, rows without a key, the row count (an
//! estimate from the plan first), and a page of rows.

use pgoutput::{Insert, TupleData, TupleValue};
use tokio_postgres::{Client, SimpleQueryMessage};

use super::{BackfillError, TableShape, query_err, walk_index};
use relay_postgres::sql::{quote_ident, quote_literal};

impl TableShape {
    /// The rows whose `event_id_column` is `event_id`, as pgoutput would send them: at most
    /// two (a second one means the id is not unique). Rows the publication's row filter leaves
    /// out are not among them.
    pub async fn rows_with_event_id(
        &self,
        client: &Client,
        event_id_column: &str,
        event_id: &str,
    ) -> Result<Vec<Insert>, BackfillError> {
        let filter = format!(
            "{}::text = {}",
            quote_ident(event_id_column),
            quote_literal(event_id)
        );
        let Some(upto) = self.last_key(client, Some(&filter)).await? else {
            return Ok(Vec::new());
        };
        let rows = self.page(client, Some(&filter), None, &upto, 2).await?;
        Ok(rows.into_iter().map(|(_, insert)| insert).collect())
    }

    /// The rows a query reads: the table, or the rows of it that the publication's row filter
    /// and `filter` keep, as a subquery of their own. The key range and the order stay outside
    /// it ([`Self::key_range`]), so that even a filter closing a parenthesis it did not open
    /// ([`check_filter`](Self::check_filter) refuses one first) could not take a page outside
    /// its range. Each filter on lines of its own: a `--` comment would end with its line.
    /// PostgreSQL pulls such a subquery up into the query: the plan is the same.
    pub(super) fn rows(&self, filter: Option<&str>) -> String {
        let kept: Vec<String> = self
            .row_filter
            .as_deref()
            .into_iter()
            .chain(filter)
            .map(|f| format!("(\n{f}\n)"))
            .collect();
        if kept.is_empty() {
            return self.from.clone();
        }
        format!(
            "(SELECT * FROM {} WHERE {}) AS backfill_rows",
            self.from,
            kept.join(" AND ")
        )
    }

    /// ` WHERE key > after AND key <= upto`, the parts that apply.
    pub(super) fn key_range(&self, after: Option<&str>, upto: Option<&str>) -> String {
        let key = quote_ident(&self.key.name);
        let mut parts = Vec::new();
        if let Some(after) = after {
            parts.push(format!(
                "{key} > {}::{}",
                quote_literal(after),
                self.key.type_sql
            ));
        }
        if let Some(upto) = upto {
            parts.push(format!(
                "{key} <= {}::{}",
                quote_literal(upto),
                self.key.type_sql
            ));
        }
        if parts.is_empty() {
            return String::new();
        }
        format!(" WHERE {}", parts.join(" AND "))
    }

    /// Checks that `filter` is one condition that cannot leave the query it is put in
    /// ([`crate::condition`]), then that it is a valid condition on the table (prepared: the
    /// extended protocol takes one statement only).
    pub async fn check_filter(&self, client: &Client, filter: &str) -> Result<(), BackfillError> {
        super::check_one_condition(filter)?;
        let sql = format!("SELECT 1 FROM {}", self.rows(Some(filter)));
        client
            .prepare(&sql)
            .await
            .map(drop)
            .map_err(|source| BackfillError::Filter {
                filter: filter.to_owned(),
                table: self.table.clone(),
                source,
            })
    }

    /// The last key of the rows to backfill now, `None` when there is none.
    pub async fn last_key(
        &self,
        client: &Client,
        filter: Option<&str>,
    ) -> Result<Option<String>, BackfillError> {
        let key = quote_ident(&self.key.name);
        let sql = format!(
            "SELECT {key} FROM {} ORDER BY {key} DESC NULLS LAST LIMIT 1",
            self.rows(filter)
        );
        let rows = simple_rows(client, &sql).await.map_err(query_err(format!(
            "cannot read the last key of {}",
            self.table
        )))?;
        Ok(rows
            .first()
            .and_then(|r| r.try_get(0).ok().flatten().map(str::to_owned)))
    }

    /// Rows whose key is NULL (never in a page; only a unique index allows them).
    pub async fn null_keys(
        &self,
        client: &Client,
        filter: Option<&str>,
    ) -> Result<u64, BackfillError> {
        if !self.key.nullable {
            return Ok(0);
        }
        let sql = format!(
            "SELECT count(*) FROM {} WHERE {} IS NULL",
            self.rows(filter),
            quote_ident(&self.key.name)
        );
        let rows = simple_rows(client, &sql).await.map_err(query_err(format!(
            "cannot count NULL keys of {}",
            self.table
        )))?;
        Ok(rows
            .first()
            .and_then(|r| r.try_get(0).ok().flatten())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// The rows in `(after, upto]`: counted when that takes at most `count_for`, else the
    /// planner's estimate (no rows read); `(rows, exact)`.
    pub async fn count_rows(
        &self,
        client: &Client,
        filter: Option<&str>,
        after: Option<&str>,
        upto: &str,
        count_for: std::time::Duration,
    ) -> Result<Option<(u64, bool)>, BackfillError> {
        let from = format!(
            "FROM {}{}",
            self.rows(filter),
            self.key_range(after, Some(upto))
        );
        let err = || format!("cannot count the rows of {}", self.table);
        let counted = simple_rows(
            client,
            &format!(
                "SET statement_timeout = {}; SELECT count(*) {from}",
                count_for.as_millis().max(1)
            ),
        )
        .await;
        client
            .batch_execute("RESET statement_timeout")
            .await
            .map_err(query_err(err()))?;
        match counted {
            Ok(rows) => {
                let n = rows.first().and_then(|r| r.try_get(0).ok().flatten());
                return Ok(n.and_then(|n| n.parse().ok()).map(|n| (n, true)));
            }
            // 57014 query_canceled: the timeout; estimate instead.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {}
            Err(e) => return Err(query_err(err())(e)),
        }
        let rows = simple_rows(client, &format!("EXPLAIN SELECT 1 {from}"))
            .await
            .map_err(query_err(err()))?;
        let plan = rows.first().and_then(|r| r.try_get(0).ok().flatten());
        Ok(plan.and_then(plan_rows).map(|n| (n, false)))
    }

    /// Up to `limit` rows after `after` (from the first when `None`) up to `upto`, in key order:
    /// each its key and the Insert pgoutput would send for it.
    pub async fn page(
        &self,
        client: &Client,
        filter: Option<&str>,
        after: Option<&str>,
        upto: &str,
        limit: usize,
    ) -> Result<Vec<(String, Insert)>, BackfillError> {
        let sql = walk_index(&self.page_sql(filter, after, upto, limit));
        let rows = simple_rows(client, &sql)
            .await
            .map_err(query_err(format!("cannot read a page of {}", self.table)))?;
        let width = self.relation.columns.len();
        let mut page = Vec::with_capacity(rows.len());
        for row in rows {
            let text = |i: usize| row.try_get(i).ok().flatten();
            let Some(key) = text(0) else {
                continue;
            };
            let values = (1..=width)
                .map(|i| match text(i) {
                    Some(v) => TupleValue::Text(bytes::Bytes::copy_from_slice(v.as_bytes())),
                    None => TupleValue::Null,
                })
                .collect();
            page.push((
                key.to_owned(),
                Insert {
                    relation_id: self.relation.id,
                    new: TupleData { values },
                },
            ));
        }
        Ok(page)
    }
}

/// The rows of a simple query (values in their output text form).
pub(super) async fn simple_rows(
    client: &Client,
    sql: &str,
) -> Result<Vec<tokio_postgres::SimpleQueryRow>, tokio_postgres::Error> {
    Ok(client
        .simple_query(sql)
        .await?
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .collect())
}

/// `rows=N` of an EXPLAIN line.
pub(super) fn plan_rows(line: &str) -> Option<u64> {
    let rest = &line[line.find("rows=")? + 5..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}
