//! `[outbox.cleanup]`: the settings of one table's cleanup and the plans they make. Beside the
//! plans, so that what a setting means for the SQL is decided in one crate.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{AgeSpec, CleanupAction, DropPlan, EpochUnit, RowPlan, of_partition_key};

/// What `[outbox.cleanup]` does with rows whose events are at or behind the stored checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanupMode {
    /// Delete them (older than `retain`), in batches.
    Delete,
    /// Detach and drop whole partitions whose range is older than `retain` (a table
    /// range-partitioned on one time column), once the checkpoint is past their rows.
    DropPartitions,
    /// Set `status_column` and/or `sent_at_column` (for teams coming from a polling relay).
    Mark,
}

/// `[outbox.cleanup]`: opt-in cleanup of one outbox table, tied to the confirmed position: no
/// row is deleted, marked or dropped before the stored checkpoint is past its transaction
/// ([`crate`]). Off unless present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CleanupSettings {
    /// `delete`, `drop-partitions` or `mark`.
    pub mode: CleanupMode,
    /// How long rows (partitions: the end of a partition's range) are kept after `age_column`,
    /// even when confirmed. Default `7d` for `delete` and `drop-partitions`, `0s` for `mark`.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub retain: Option<Duration>,
    /// The row's time column `retain` counts from. Default `created_at`. A `timestamptz`, a
    /// `timestamp without time zone` (with `age_time_zone`) or a `bigint`/`integer` epoch count
    /// (with `age_unit`); its type is read at start and every round, and anything else is
    /// refused ([`AgeSpec`]).
    #[serde(default = "default_age_column")]
    pub age_column: String,
    /// The epoch unit of an integer `age_column` (`drop-partitions`: partition key): `"s"`,
    /// `"ms"` (Eventuate's `creation_time`) or `"us"`. Required for such a column, refused for
    /// any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_unit: Option<EpochUnit>,
    /// The time zone the values of a `timestamp without time zone` `age_column`
    /// (`drop-partitions`: partition key) are in, e.g. `"UTC"` or `"Europe/Berlin"` (CAP's
    /// `Added`). Required for such a column, refused for any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_time_zone: Option<String>,
    /// How often a round runs. Default `1m`.
    #[serde(default = "default_cleanup_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Rows per statement (`delete`, `mark`). Default 1000.
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// Pause between batches of a round, so cleanup stays off the hot path. Default `100ms`.
    #[serde(default = "default_batch_pause", with = "humantime_serde")]
    pub batch_pause: Duration,
    /// `statement_timeout` of every cleanup statement. Default `5s`.
    #[serde(default = "default_statement_timeout", with = "humantime_serde")]
    pub statement_timeout: Duration,
    /// `lock_timeout` of every cleanup statement. Default `1s`.
    #[serde(default = "default_lock_timeout", with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// `mark`: the status column to set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_column: Option<String>,
    /// `mark`: the value `status_column` gets. Default `sent`.
    #[serde(default = "default_status_value")]
    pub status_value: String,
    /// `mark`: a timestamp column set to `now()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at_column: Option<String>,
    /// `mark`: also delete confirmed rows once `age_column` is older than this (what a polling
    /// relay's cleanup job did after marking). Off unless set; at least `retain`.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub delete_after: Option<Duration>,
    /// `drop-partitions`: create the partitions after the newest one, each as wide as it, so
    /// that they cover at least this far past now (e.g. `"3d"`). Off unless set.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub create_ahead: Option<Duration>,
}

fn default_age_column() -> String {
    "created_at".into()
}
fn default_cleanup_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_batch_size() -> u32 {
    1000
}
fn default_batch_pause() -> Duration {
    Duration::from_millis(100)
}
fn default_statement_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_lock_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_status_value() -> String {
    "sent".into()
}

impl CleanupSettings {
    /// `retain`, or the mode's default.
    pub fn retain(&self) -> Duration {
        self.retain.unwrap_or(match self.mode {
            CleanupMode::Mark => Duration::ZERO,
            CleanupMode::Delete | CleanupMode::DropPartitions => Duration::from_secs(7 * 86400),
        })
    }

    /// Why these settings cannot be used, if they cannot.
    pub fn problem(&self) -> Option<String> {
        if self.interval.is_zero() {
            return Some("interval must be positive".into());
        }
        if self.batch_size == 0 {
            return Some("batch_size must be at least 1".into());
        }
        if self.statement_timeout.is_zero() || self.lock_timeout.is_zero() {
            return Some("statement_timeout and lock_timeout must be positive".into());
        }
        if self.age_column.is_empty() {
            return Some("age_column must name a column".into());
        }
        if self.age_unit.is_some() && self.age_time_zone.is_some() {
            return Some(
                "age_unit (an integer epoch column) and age_time_zone (a timestamp without time zone column) exclude each other: keep the one that fits the column's type".into(),
            );
        }
        if self
            .age_time_zone
            .as_deref()
            .is_some_and(|z| z.trim().is_empty())
        {
            return Some("age_time_zone must name a time zone, e.g. \"UTC\"".into());
        }
        let marks = self.status_column.is_some() || self.sent_at_column.is_some();
        match self.mode {
            CleanupMode::Mark if !marks => Some(
                "mode = \"mark\" needs status_column (set to status_value) or sent_at_column (set to now()), or both".into(),
            ),
            CleanupMode::Delete | CleanupMode::DropPartitions if marks => Some(format!(
                "status_column and sent_at_column are for mode = \"mark\", not \"{}\"",
                self.mode.as_str()
            )),
            CleanupMode::Delete | CleanupMode::Mark if self.create_ahead.is_some() => {
                Some(format!(
                    "create_ahead is for mode = \"drop-partitions\", not \"{}\"",
                    self.mode.as_str()
                ))
            }
            CleanupMode::DropPartitions if self.create_ahead.is_some_and(|d| d.is_zero()) => {
                Some("create_ahead must be positive (or left out)".into())
            }
            CleanupMode::Delete | CleanupMode::DropPartitions if self.delete_after.is_some() => {
                Some(format!(
                    "delete_after is for mode = \"mark\" (mode = \"{}\" removes rows after retain already)",
                    self.mode.as_str()
                ))
            }
            CleanupMode::Mark if self.delete_after.is_some_and(|d| d < self.retain()) => {
                Some("delete_after must be at least retain: rows are kept for retain, then marked, then deleted".into())
            }
            _ => None,
        }
    }

    /// The row cleanups of `schema.table`, in the order a round runs them: `delete`; `mark`, then
    /// with `delete_after` a delete of the rows older than that; none for `drop-partitions`.
    /// `row_filter` is the table's: only rows it keeps (the rows the relay publishes) are
    /// cleaned.
    pub fn row_plans(&self, schema: &str, table: &str, row_filter: Option<&str>) -> Vec<RowPlan> {
        let plan = |action, retain| RowPlan {
            schema: schema.to_owned(),
            table: table.to_owned(),
            row_filter: row_filter.map(str::to_owned),
            action,
            retain,
            age: self.age_spec(),
            batch_size: i64::from(self.batch_size),
            statement_timeout: self.statement_timeout,
            lock_timeout: self.lock_timeout,
        };
        match self.mode {
            CleanupMode::Delete => vec![plan(CleanupAction::Delete, self.retain())],
            CleanupMode::Mark => {
                let mark = CleanupAction::Mark {
                    status: self
                        .status_column
                        .clone()
                        .map(|c| (c, self.status_value.clone())),
                    sent_at: self.sent_at_column.clone(),
                };
                let mut plans = vec![plan(mark, self.retain())];
                plans.extend(
                    self.delete_after
                        .map(|after| plan(CleanupAction::Delete, after)),
                );
                plans
            }
            CleanupMode::DropPartitions => Vec::new(),
        }
    }

    /// The partition cleanup of `schema.table`; `None` unless `drop-partitions`.
    pub fn drop_plan(&self, schema: &str, table: &str) -> Option<DropPlan> {
        (self.mode == CleanupMode::DropPartitions).then(|| DropPlan {
            schema: schema.to_owned(),
            table: table.to_owned(),
            retain: self.retain(),
            statement_timeout: self.statement_timeout,
            lock_timeout: self.lock_timeout,
            create_ahead: self.create_ahead,
            age_unit: self.age_unit,
            age_time_zone: self.age_time_zone.clone(),
        })
    }

    /// `age_column` and how to read it.
    pub fn age_spec(&self) -> AgeSpec {
        AgeSpec {
            column: self.age_column.clone(),
            unit: self.age_unit,
            time_zone: self.age_time_zone.clone(),
        }
    }

    /// Why the time column of this cleanup on `schema.table` cannot be read as a time, if it
    /// cannot: `age_column` (when rows' age counts) or the partition key (`drop-partitions`),
    /// its catalog type against `age_unit`/`age_time_zone`. A column that does not exist is
    /// not judged here (each round says so, and `validate --connect`).
    pub async fn time_column_problem(
        &self,
        client: &tokio_postgres::Client,
        schema: &str,
        table: &str,
    ) -> Result<Option<String>, tokio_postgres::Error> {
        let mut specs = Vec::new();
        if self.uses_age() {
            specs.push((self.age_spec(), false));
        }
        if let Some(drop) = self.drop_plan(schema, table) {
            specs.extend(drop.key_spec(client).await?.map(|spec| (spec, true)));
        }
        for (spec, key) in specs {
            if let Some(Err(problem)) = spec.resolve(client, schema, table).await? {
                return Ok(Some(if key {
                    of_partition_key(&problem)
                } else {
                    problem
                }));
            }
        }
        Ok(None)
    }

    /// Whether a round counts rows' age (`retain` or `delete_after` above zero): only then
    /// must `age_column` be a time column.
    pub fn uses_age(&self) -> bool {
        self.row_plans("", "", None)
            .iter()
            .any(|p| !p.retain.is_zero())
    }
}

impl CleanupMode {
    /// As written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delete => "delete",
            Self::DropPartitions => "drop-partitions",
            Self::Mark => "mark",
        }
    }
}
