//! Sharding one outbox over N relays (`[postgres] shard`): each relay reads its own slot
//! through its own publication, and each publication keeps, by a row filter (PostgreSQL 15+),
//! the rows whose shard key hashes to its index. One walsender decodes one slot; N slots are
//! decoded by N walsenders in parallel. Every row of one key lands in one shard, so the events
//! of one aggregate keep their commit order; events of different shards have no order between
//! them.
//!
//! The hash is PostgreSQL's `hashtext` of the key as text, which the row filter may use (it is
//! an immutable built-in): shard = `((hashtext(key::text) % count) + count) % count`, always in
//! `0..count` (`%` keeps the sign of `hashtext`'s negative values; no `abs()`, which fails on
//! the smallest integer).
//!
//! A publication whose row filter is not the configured shard's would skip rows no other relay
//! publishes, so the relay refuses to start on one ([`crate::catalog::row_filter`] checks the
//! filter by evaluating it against the expected one on many keys, not by comparing text).

use serde::{Deserialize, Serialize};

use crate::sql::quote_ident;

/// PostgreSQL got publication row filters in 15.
pub(crate) const ROW_FILTERS_SINCE: i32 = 150_000;

/// `[postgres] shard = { key = "aggregateid", count = 4, index = 0 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardSpec {
    /// The column whose value picks the shard (the same name in every outbox table).
    pub key: String,
    /// How many shards (relays) there are.
    pub count: u32,
    /// This relay's shard, `0..count`.
    pub index: u32,
}

impl ShardSpec {
    /// Why the spec cannot be used, if it cannot.
    #[must_use]
    pub fn problem(&self) -> Option<String> {
        if self.count < 2 {
            return Some(format!(
                "postgres.shard.count = {}: sharding needs at least 2 shards (leave postgres.shard out for one relay)",
                self.count
            ));
        }
        if self.count > 1024 {
            return Some(format!(
                "postgres.shard.count = {}: at most 1024 shards",
                self.count
            ));
        }
        if self.index >= self.count {
            return Some(format!(
                "postgres.shard.index = {} is not below postgres.shard.count = {}: shards are numbered 0 to {}",
                self.index,
                self.count,
                self.count - 1
            ));
        }
        if self.key.is_empty() {
            return Some("postgres.shard.key must name a column".into());
        }
        None
    }

    /// The shard of a row, as SQL over its key column (`column` is the SQL that names it).
    #[must_use]
    pub fn shard_of_sql(&self, column: &str) -> String {
        let n = self.count;
        format!("(((hashtext(({column})::text) % {n}) + {n}) % {n})")
    }

    /// The publication row filter of this shard (without the surrounding `WHERE (…)`).
    #[must_use]
    pub fn row_filter(&self) -> String {
        format!(
            "{} = {}",
            self.shard_of_sql(&quote_ident(&self.key)),
            self.index
        )
    }

    /// `2/4 by aggregateid`.
    #[must_use]
    pub fn describe(&self) -> String {
        format!("{}/{} by {}", self.index, self.count, self.key)
    }
}

/// What a publication's row filter on one outbox table means for the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowFilterVerdict {
    /// No filter and no shard: every row.
    Unfiltered,
    /// The configured shard's filter.
    Shard(ShardSpec),
    /// A filter, no shard configured: the publication owner's choice; rows it drops are not
    /// relayed.
    FilteredWithoutShard {
        /// `schema.table`.
        table: String,
        /// The publication.
        publication: String,
        /// The filter as PostgreSQL prints it.
        filter: String,
    },
    /// A shard is configured and the filter (or its absence) is not that shard's.
    NotTheShard {
        /// `schema.table`.
        table: String,
        /// `"schema"."table"`.
        relation: String,
        /// The publication.
        publication: String,
        /// The shard.
        shard: ShardSpec,
        /// The filter found, if any.
        found: Option<String>,
    },
    /// The table's `row_filter` (with the shard's, if one is configured), as configured.
    Configured {
        /// The filter as PostgreSQL prints it.
        filter: String,
    },
    /// A `row_filter` is configured and the publication's filter (or its absence) is not it.
    NotTheConfigured {
        /// `schema.table`.
        table: String,
        /// `"schema"."table"`.
        relation: String,
        /// The publication.
        publication: String,
        /// `row_filter` as configured.
        configured: String,
        /// The filter the publication must have, as PostgreSQL prints it.
        expected: String,
        /// The filter found, if any.
        found: Option<String>,
    },
    /// The configured `row_filter` is no valid condition on the table.
    InvalidFilter {
        /// `schema.table`.
        table: String,
        /// `row_filter` as configured.
        configured: String,
        /// The server's message.
        reason: String,
    },
    /// The configured `row_filter` could not be compared (a privilege the check needs).
    CannotCheck {
        /// `schema.table`.
        table: String,
        /// `"schema"."table"`.
        relation: String,
        /// The server's message.
        reason: String,
    },
}

impl RowFilterVerdict {
    /// Why the relay must not start on it, with the fix.
    #[must_use]
    pub fn problem(&self) -> Option<String> {
        match self {
            Self::NotTheShard {
                table,
                relation,
                publication,
                shard,
                found,
            } => Some(format!(
                "postgres.shard = {}: publication {publication} {} on {table}, which is not that shard's: rows of this shard would be skipped or another shard's doubled. ALTER PUBLICATION {publication} SET TABLE {relation} WHERE ({}) (every outbox table likewise), or fix postgres.shard / postgres.publication",
                shard.describe(),
                describe_found(found.as_deref()),
                shard.row_filter()
            )),
            Self::NotTheConfigured {
                table,
                relation,
                publication,
                configured,
                expected,
                found,
            } => Some(format!(
                "outbox table {table}: row_filter = {configured:?}, but publication {publication} {} on it: rows the configuration keeps would be skipped, or rows it leaves out relayed. Fix the publication in one transaction (rows committed before it keep the old filter): BEGIN; ALTER PUBLICATION {publication} DROP TABLE {relation}; ALTER PUBLICATION {publication} ADD TABLE {relation} WHERE ({expected}); COMMIT; or fix [[outbox]] row_filter",
                describe_found(found.as_deref())
            )),
            Self::InvalidFilter {
                table,
                configured,
                reason,
            } => Some(format!(
                "outbox table {table}: row_filter = {configured:?} is not a valid condition on {table}: {reason}. Fix [[outbox]] row_filter (a condition on the table's columns, as after WHERE in CREATE PUBLICATION … FOR TABLE … WHERE (…))"
            )),
            Self::CannotCheck {
                table,
                relation,
                reason,
            } => Some(format!(
                "outbox table {table}: cannot check row_filter against the publication: {reason}. The check parses the filter on an empty temporary copy of the table's columns: it needs SELECT on the table and TEMP on the database (GRANT SELECT ON {relation} TO <role>; GRANT TEMP ON DATABASE <database> TO <role>)"
            )),
            _ => None,
        }
    }

    /// What an operator should know although the relay runs.
    #[must_use]
    pub fn warning(&self) -> Option<String> {
        let Self::FilteredWithoutShard {
            table,
            publication,
            filter,
        } = self
        else {
            return None;
        };
        Some(format!(
            "publication {publication} keeps only the rows of {table} where ({filter}): rows it does not keep are never relayed. If that is not meant, ALTER PUBLICATION {publication} SET TABLE {table}; if it shards the outbox, configure postgres.shard"
        ))
    }
}

/// `has row filter (…)` or `has no row filter`.
fn describe_found(found: Option<&str>) -> String {
    found.map_or_else(
        || "has no row filter".to_owned(),
        |f| format!("has row filter ({f})"),
    )
}

/// Why the configured row filters cannot be used on PostgreSQL `version_num`, if they cannot:
/// publication row filters exist from 15 on. `tables` names the tables that have one.
#[must_use]
pub fn row_filters_unsupported(tables: &[String], version_num: i32) -> Option<String> {
    (version_num < ROW_FILTERS_SINCE && !tables.is_empty()).then(|| {
        format!(
            "outbox table {}: row_filter needs publication row filters, which PostgreSQL {} does not have (since 15): remove row_filter (every row of the table is then relayed) or upgrade PostgreSQL",
            tables.join(", "),
            crate::server_version::version_text(version_num)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked_and_filters_built() {
        let spec = ShardSpec {
            key: "aggregateid".into(),
            count: 4,
            index: 3,
        };
        assert_eq!(spec.problem(), None);
        assert_eq!(
            spec.row_filter(),
            "(((hashtext((\"aggregateid\")::text) % 4) + 4) % 4) = 3"
        );
        for (count, index) in [(1, 0), (4, 4), (2000, 0)] {
            let bad = ShardSpec {
                count,
                index,
                ..spec.clone()
            };
            assert!(bad.problem().is_some(), "{bad:?}");
        }
    }

    #[test]
    fn row_filters_are_refused_before_15_naming_the_tables() {
        let tables = vec!["public.event_publication".to_owned()];
        let problem = row_filters_unsupported(&tables, 140_011).expect("refused on 14");
        assert!(problem.contains("public.event_publication"), "{problem}");
        assert!(problem.contains("PostgreSQL 14.11"), "{problem}");
        assert!(problem.contains("remove row_filter"), "{problem}");
        assert_eq!(row_filters_unsupported(&tables, 150_000), None);
        assert_eq!(row_filters_unsupported(&[], 130_000), None);
    }

    #[test]
    fn a_filter_that_is_not_the_configured_one_names_the_fix() {
        let verdict = RowFilterVerdict::NotTheConfigured {
            table: "public.event_publication".into(),
            relation: "\"public\".\"event_publication\"".into(),
            publication: "relay_pub".into(),
            configured: "listener_id = 'a'".into(),
            expected: "(listener_id = 'a'::text)".into(),
            found: None,
        };
        let problem = verdict.problem().expect("refused");
        assert!(problem.contains("has no row filter"), "{problem}");
        assert!(
            problem.contains("ALTER PUBLICATION relay_pub ADD TABLE \"public\".\"event_publication\" WHERE ((listener_id = 'a'::text))"),
            "{problem}"
        );
        assert_eq!(
            RowFilterVerdict::Configured { filter: "x".into() }.problem(),
            None
        );
    }
}
