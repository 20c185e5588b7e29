//! The time a row's age counts from (`age_column`, or a partition key), read by the column's
//! catalog type, so that `retain` means the same whatever type the framework chose:
//!
//! - `timestamp with time zone`: an instant, compared as it is;
//! - `timestamp without time zone` (CAP's `Added`): a wall-clock time of some zone, which only the
//!   configuration can know (`age_time_zone`). PostgreSQL would read it in the session's
//!   `TimeZone`, which is not the application's and can make a row look up to a day older;
//! - `bigint`/`integer` (Eventuate's `creation_time`, epoch milliseconds): a count since the
//!   Unix epoch in the unit `age_unit` says; compared against `now() - retain` as a number, never
//!   cast to a time.
//!
//! Any other type, or a setting that does not fit the type, is refused: nothing is cleaned by a
//! guess. Every cutoff is rounded so that a row is kept rather than taken early.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sql::quote_literal;

/// The unit of an epoch time column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EpochUnit {
    /// Seconds since 1970-01-01 00:00 UTC.
    #[serde(rename = "s")]
    Seconds,
    /// Milliseconds (Eventuate's `creation_time`, Java's `System.currentTimeMillis()`).
    #[serde(rename = "ms")]
    Milliseconds,
    /// Microseconds.
    #[serde(rename = "us")]
    Microseconds,
}

impl EpochUnit {
    fn per_second(self) -> u32 {
        match self {
            Self::Seconds => 1,
            Self::Milliseconds => 1_000,
            Self::Microseconds => 1_000_000,
        }
    }

    /// As written in the configuration.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Seconds => "s",
            Self::Milliseconds => "ms",
            Self::Microseconds => "us",
        }
    }
}

/// What the configuration says about a time column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgeSpec {
    /// The column.
    pub column: String,
    /// `age_unit`: for an integer column, its epoch unit.
    pub unit: Option<EpochUnit>,
    /// `age_time_zone`: for a `timestamp without time zone` column, the zone its values are in.
    pub time_zone: Option<String>,
}

/// How a column's values are read as instants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgeKind {
    /// `timestamptz`.
    Instant,
    /// `timestamp` in this zone.
    WallClock {
        /// An IANA zone name (or any zone PostgreSQL accepts).
        time_zone: String,
    },
    /// An integer count since the epoch.
    Epoch {
        /// Its unit.
        unit: EpochUnit,
    },
}

/// A time column whose type was read and fits the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgeColumn {
    /// The column.
    pub column: String,
    /// How its values are read.
    pub kind: AgeKind,
    /// Its (base) type as `format_type` prints it, for casting a partition bound to it.
    pub type_sql: String,
}

/// Type OIDs of the types a time column may have.
const TIMESTAMPTZ: u32 = 1184;
const TIMESTAMP: u32 = 1114;
const INT8: u32 = 20;
const INT4: u32 = 23;

impl AgeSpec {
    /// Judges a column of `table` (`schema.table`) whose base type is `type_oid`, printed as
    /// `type_sql`: how to read it, or why it cannot be used, with the fix.
    pub fn judge(&self, table: &str, type_oid: u32, type_sql: &str) -> Result<AgeColumn, String> {
        let column = &self.column;
        let what = format!("[outbox.cleanup] of {table}: age_column `{column}` is {type_sql}");
        let kind = match (type_oid, &self.unit, &self.time_zone) {
            (TIMESTAMPTZ, None, None) => AgeKind::Instant,
            (TIMESTAMPTZ, _, _) => {
                return Err(format!(
                    "{what}, which holds instants: remove age_unit and age_time_zone (they are for integer and timestamp without time zone columns)"
                ));
            }
            (TIMESTAMP, None, Some(time_zone)) => AgeKind::WallClock {
                time_zone: time_zone.clone(),
            },
            (TIMESTAMP, None, None) => {
                return Err(format!(
                    "{what}: its values are wall-clock times of a zone only the application knows, and PostgreSQL would read them in the session's TimeZone, which can delete rows hours early. Set age_time_zone to the zone the application writes them in (e.g. age_time_zone = \"UTC\" for DateTime.UtcNow or a UTC host; CAP writes DateTime.Now, the local time of the application's host), or name a timestamptz column in age_column"
                ));
            }
            (TIMESTAMP, Some(_), _) => {
                return Err(format!(
                    "{what}: age_unit is for integer epoch columns; remove it and set age_time_zone"
                ));
            }
            (INT8 | INT4, Some(unit), None) => AgeKind::Epoch { unit: *unit },
            (INT8 | INT4, None, None) => {
                return Err(format!(
                    "{what}, a number, not a time: set age_unit to its epoch unit (\"ms\" for milliseconds since 1970, as Eventuate's creation_time; \"s\"; \"us\"), or name a timestamptz column in age_column"
                ));
            }
            (INT8 | INT4, _, Some(_)) => {
                return Err(format!(
                    "{what}: age_time_zone is for timestamp without time zone columns (an epoch count is UTC); remove it and set age_unit"
                ));
            }
            _ => {
                return Err(format!(
                    "{what}, which is not a time: retain counts from a timestamptz column, a timestamp without time zone column (with age_time_zone) or a bigint/integer epoch column (with age_unit). Fix age_column"
                ));
            }
        };
        Ok(AgeColumn {
            column: column.clone(),
            kind,
            type_sql: type_sql.to_owned(),
        })
    }
}

/// A [`AgeSpec::judge`] problem said of a partition key (`drop-partitions`) instead.
#[must_use]
pub fn of_partition_key(problem: &str) -> String {
    problem.replacen("age_column `", "partition key `", 1)
}

impl AgeColumn {
    /// SQL: the instant (`timestamptz`) of `value`, an expression of the column's type (the
    /// column itself, or a partition bound cast with [`Self::typed`]).
    #[must_use]
    pub fn instant(&self, value: &str) -> String {
        match &self.kind {
            AgeKind::Instant => value.to_owned(),
            AgeKind::WallClock { time_zone } => {
                format!("({value} AT TIME ZONE {})", quote_literal(time_zone))
            }
            AgeKind::Epoch { unit } => {
                format!("to_timestamp(({value})::float8 / {})", unit.per_second())
            }
        }
    }

    /// SQL: `literal` (a partition bound as PostgreSQL prints it) cast to the column's type.
    #[must_use]
    pub fn typed(&self, literal: &str) -> String {
        format!("({literal})::{}", self.type_sql)
    }

    /// SQL: `value` is older than `retain`. An epoch column is compared as a number against
    /// the cutoff rounded down (an index on it still serves); a wall-clock column through its
    /// instant in its zone (an hour that repeats when clocks go back is read as the later of its
    /// two instants, so a row is kept rather than taken early).
    #[must_use]
    pub fn older_than(&self, value: &str, retain: Duration) -> String {
        let cutoff = format!("now() - make_interval(secs => {})", retain.as_secs_f64());
        match &self.kind {
            AgeKind::Instant | AgeKind::WallClock { .. } => {
                format!("{} < {cutoff}", self.instant(value))
            }
            AgeKind::Epoch { unit } => format!(
                "{value} < floor(extract(epoch FROM {cutoff}) * {})::bigint",
                unit.per_second()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(unit: Option<EpochUnit>, time_zone: Option<&str>) -> AgeSpec {
        AgeSpec {
            column: "created".into(),
            unit,
            time_zone: time_zone.map(str::to_owned),
        }
    }

    #[test]
    fn each_type_needs_its_setting_and_nothing_else() {
        let table = "public.outbox";
        let ok = |s: AgeSpec, oid, ty| s.judge(table, oid, ty).map(|c| c.kind);
        assert_eq!(
            ok(spec(None, None), TIMESTAMPTZ, "timestamp with time zone"),
            Ok(AgeKind::Instant)
        );
        assert_eq!(
            ok(
                spec(None, Some("UTC")),
                TIMESTAMP,
                "timestamp without time zone"
            ),
            Ok(AgeKind::WallClock {
                time_zone: "UTC".into()
            })
        );
        assert_eq!(
            ok(spec(Some(EpochUnit::Milliseconds), None), INT8, "bigint"),
            Ok(AgeKind::Epoch {
                unit: EpochUnit::Milliseconds
            })
        );
        for (s, oid, ty, fix) in [
            (
                spec(None, None),
                TIMESTAMP,
                "timestamp without time zone",
                "age_time_zone",
            ),
            (spec(None, None), INT8, "bigint", "set age_unit"),
            (spec(None, None), INT4, "integer", "set age_unit"),
            (
                spec(Some(EpochUnit::Seconds), None),
                TIMESTAMPTZ,
                "timestamp with time zone",
                "remove age_unit",
            ),
            (
                spec(None, Some("UTC")),
                INT8,
                "bigint",
                "remove it and set age_unit",
            ),
            (
                spec(Some(EpochUnit::Seconds), Some("UTC")),
                TIMESTAMP,
                "timestamp without time zone",
                "remove it and set age_time_zone",
            ),
            (spec(None, None), 25, "text", "not a time"),
            (spec(None, None), 1082, "date", "not a time"),
        ] {
            let problem = s.judge(table, oid, ty).expect_err(ty);
            assert!(problem.contains("public.outbox"), "{problem}");
            assert!(problem.contains("`created`"), "{problem}");
            assert!(problem.contains(ty), "{problem}");
            assert!(problem.contains(fix), "{ty}: {problem}");
        }
    }

    #[test]
    fn conditions_compare_in_the_columns_own_terms() {
        let retain = Duration::from_secs(90);
        let judged = |s: AgeSpec, oid, ty| s.judge("public.t", oid, ty).unwrap();
        let instant = judged(spec(None, None), TIMESTAMPTZ, "timestamp with time zone");
        assert_eq!(
            instant.older_than("\"created\"", retain),
            "\"created\" < now() - make_interval(secs => 90)"
        );
        let epoch = judged(spec(Some(EpochUnit::Milliseconds), None), INT8, "bigint");
        assert_eq!(
            epoch.older_than("\"created\"", retain),
            "\"created\" < floor(extract(epoch FROM now() - make_interval(secs => 90)) * 1000)::bigint"
        );
        assert_eq!(epoch.typed("1700000000000"), "(1700000000000)::bigint");
        let wall = judged(
            spec(None, Some("Europe/Berlin")),
            TIMESTAMP,
            "timestamp without time zone",
        );
        assert_eq!(
            wall.older_than("\"created\"", retain),
            "(\"created\" AT TIME ZONE E'Europe/Berlin') < now() - make_interval(secs => 90)"
        );
    }
}
