//! Broker-native headers (`Nats-TTL`, `Nats-Schedule`) and CloudEvents binary-mode headers
//! mapped from optional outbox columns (`ttl_column`, `schedule_column`, `[outbox.cloudevents]`).
//!
//! A table without these options compiles to no plan at all, so routing its rows costs nothing
//! more. Values arrive as text in the replication session's formats (`DateStyle=ISO`,
//! `TimeZone=UTC`, `IntervalStyle=postgres`, set by relay-postgres): a value that does not
//! parse is a bad row (fail closed or dead-lettered), never a message without the header.

use std::sync::Arc;

use outbox_contract::{
    CE_SPECVERSION, HEADER_CE_ID, HEADER_CE_SOURCE, HEADER_CE_SPECVERSION, HEADER_CE_SUBJECT,
    HEADER_CE_TIME, HEADER_CE_TYPE, HEADER_EVENT_ID, HEADER_NATS_TTL, HEADER_SCHEDULE,
    HEADER_SCHEDULE_TARGET, HEADER_SCHEDULE_TTL,
};
use pgoutput::Relation;

use super::RouteError;
use super::config::OutboxTableConfig;
use crate::subject::push_escaped_token;
use crate::value::oid;

mod parse;

pub(super) use parse::{interval_micros, timestamptz_rfc3339, ttl_seconds};

/// What a table needs from the broker for its native headers (checked against the server's
/// version and the stream's settings at start and by `validate --connect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerNeed {
    /// The configured table.
    pub table: String,
    /// The column the header comes from.
    pub column: String,
    /// What it needs.
    pub feature: BrokerFeature,
}

/// A JetStream feature a mapping relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerFeature {
    /// Per-message TTL (`Nats-TTL`, or `Nats-Schedule-TTL` on a scheduled event).
    MessageTtl,
    /// Message schedules (`Nats-Schedule: @at …`).
    MessageSchedules,
}

impl OutboxTableConfig {
    /// What the broker must support for this mapping's native headers.
    pub fn broker_needs(&self) -> Vec<BrokerNeed> {
        let need = |column: &str, feature| BrokerNeed {
            table: self.table.clone(),
            column: column.to_owned(),
            feature,
        };
        let mut needs = Vec::new();
        if let Some(c) = &self.ttl_column {
            needs.push(need(c, BrokerFeature::MessageTtl));
        }
        if let Some(c) = &self.schedule_column {
            needs.push(need(c, BrokerFeature::MessageSchedules));
        }
        needs
    }

    /// A subject under `schedule_subject` (for the stream's capture check).
    pub fn schedule_sample(&self) -> Option<String> {
        self.schedule_column.as_ref()?;
        self.schedule_subject.as_ref().map(|p| format!("{p}.x"))
    }
}

/// How a TTL column's value reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TtlKind {
    /// `int2`/`int4`/`int8`: seconds.
    Seconds,
    /// `interval`.
    Interval,
}

/// The compiled native and CloudEvents headers of one table.
#[derive(Debug, Clone)]
pub(super) struct NativePlan {
    ttl: Option<(usize, TtlKind)>,
    /// Schedule column and the subject prefix schedules are stored under.
    schedule: Option<(usize, Arc<str>)>,
    cloudevents: Option<CloudEventsPlan>,
}

#[derive(Debug, Clone)]
struct CloudEventsPlan {
    source: Arc<str>,
    type_column: usize,
    time_column: Option<usize>,
    subject_column: Option<usize>,
}

/// The header names, allocated once.
struct Names {
    ttl: Arc<str>,
    schedule: Arc<str>,
    schedule_target: Arc<str>,
    schedule_ttl: Arc<str>,
    event_id: Arc<str>,
    ce_id: Arc<str>,
    ce_source: Arc<str>,
    ce_type: Arc<str>,
    ce_time: Arc<str>,
    ce_specversion: Arc<str>,
    ce_subject: Arc<str>,
    specversion: Arc<str>,
}

static NAMES: std::sync::LazyLock<Names> = std::sync::LazyLock::new(|| Names {
    ttl: HEADER_NATS_TTL.into(),
    schedule: HEADER_SCHEDULE.into(),
    schedule_target: HEADER_SCHEDULE_TARGET.into(),
    schedule_ttl: HEADER_SCHEDULE_TTL.into(),
    event_id: HEADER_EVENT_ID.into(),
    ce_id: HEADER_CE_ID.into(),
    ce_source: HEADER_CE_SOURCE.into(),
    ce_type: HEADER_CE_TYPE.into(),
    ce_time: HEADER_CE_TIME.into(),
    ce_specversion: HEADER_CE_SPECVERSION.into(),
    ce_subject: HEADER_CE_SUBJECT.into(),
    specversion: CE_SPECVERSION.into(),
});

/// Compiles the table's native options against `relation`: `None` when it has none.
// Long: every native option looks its column up with one shared `find` closure over the relation;
// each option is a few lines
pub(super) fn compile(
    config: &OutboxTableConfig,
    table: &str,
    relation: &Relation,
) -> Result<Option<NativePlan>, RouteError> {
    if config.ttl_column.is_none()
        && config.schedule_column.is_none()
        && config.cloudevents.is_none()
    {
        return Ok(None);
    }
    // The column's index, with its type checked against `expected` (`None`: any type).
    let find = |column: &str,
                role: &'static str,
                expected: Option<(&[u32], &'static str)>|
     -> Result<usize, RouteError> {
        let (index, c) = relation
            .columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == column)
            .ok_or_else(|| RouteError::MissingColumn {
                table: table.to_owned(),
                column: column.to_owned(),
                role,
            })?;
        match expected {
            Some((oids, types)) if !oids.contains(&c.type_oid) => Err(RouteError::ColumnType {
                table: table.to_owned(),
                column: column.to_owned(),
                role,
                type_oid: c.type_oid,
                expected: types,
            }),
            _ => Ok(index),
        }
    };
    let ttl = match &config.ttl_column {
        None => None,
        Some(c) => {
            let index = find(
                c,
                "ttl_column",
                Some((
                    &[oid::INT2, oid::INT4, oid::INT8, oid::INTERVAL],
                    "smallint, integer, bigint (seconds) or interval",
                )),
            )?;
            let kind = match relation.columns.get(index).map(|c| c.type_oid) {
                Some(oid::INTERVAL) => TtlKind::Interval,
                _ => TtlKind::Seconds,
            };
            Some((index, kind))
        }
    };
    let timestamptz = Some((&[oid::TIMESTAMPTZ][..], "timestamp with time zone"));
    let schedule = match (&config.schedule_column, &config.schedule_subject) {
        (Some(c), Some(prefix)) => Some((
            find(c, "schedule_column", timestamptz)?,
            Arc::from(prefix.as_str()),
        )),
        _ => None,
    };
    let cloudevents = match &config.cloudevents {
        None => None,
        Some(ce) => Some(CloudEventsPlan {
            source: ce.source.as_str().into(),
            type_column: find(&ce.type_column, "cloudevents.type_column", None)?,
            time_column: ce
                .time_column
                .as_deref()
                .map(|c| find(c, "cloudevents.time_column", timestamptz))
                .transpose()?,
            subject_column: ce
                .subject_column
                .as_deref()
                .map(|c| find(c, "cloudevents.subject_column", None))
                .transpose()?,
        }),
    };
    Ok(Some(NativePlan {
        ttl,
        schedule,
        cloudevents,
    }))
}

/// The row's values, as [`NativePlan::apply`] reads them: text, `None` for NULL.
pub(super) type Text<'a> = &'a dyn Fn(usize) -> Result<Option<&'a [u8]>, RouteError>;
/// The bad-row error for a value of column `index` that cannot be header `header`.
pub(super) type Bad<'a> = &'a dyn Fn(usize, &'static str, String) -> RouteError;

impl NativePlan {
    /// Every mapped column with its role (for the type-change check).
    pub(super) fn columns(&self) -> Vec<(usize, &'static str)> {
        let mut out = Vec::new();
        if let Some((i, _)) = self.ttl {
            out.push((i, "ttl_column"));
        }
        if let Some((i, _)) = self.schedule {
            out.push((i, "schedule_column"));
        }
        if let Some(ce) = &self.cloudevents {
            out.push((ce.type_column, "cloudevents.type_column"));
            out.extend(ce.time_column.map(|i| (i, "cloudevents.time_column")));
            out.extend(ce.subject_column.map(|i| (i, "cloudevents.subject_column")));
        }
        out
    }

    /// Appends the row's native and CloudEvents headers; a scheduled row's `subject` becomes
    /// its schedule subject (`<schedule_subject>.<event id>`), its target the old subject.
    // Long: the per-row native and CloudEvents headers on the hot path; the columns share one UTF-8
    // check closure
    pub(super) fn apply(
        &self,
        text: Text<'_>,
        bad: Bad<'_>,
        event_id: &str,
        commit_time: &Arc<str>,
        subject: &mut String,
        headers: &mut Vec<(Arc<str>, Arc<str>)>,
    ) -> Result<(), RouteError> {
        let names = &*NAMES;
        let utf8 = |column: usize, header: &'static str, raw: &[u8]| match std::str::from_utf8(raw)
        {
            Err(_) => Err(bad(column, header, "not valid UTF-8".into())),
            Ok(v) if v.chars().any(char::is_control) => Err(bad(
                column,
                header,
                "holds a control character (CR, LF, ...)".into(),
            )),
            Ok(v) => Ok(v.to_owned()),
        };
        let mut scheduled = false;
        if let Some((column, prefix)) = &self.schedule
            && let Some(raw) = text(*column)?
        {
            let at = timestamptz_rfc3339(&utf8(*column, HEADER_SCHEDULE, raw)?)
                .map_err(|reason| bad(*column, HEADER_SCHEDULE, reason))?;
            let mut schedule_subject = String::with_capacity(prefix.len() + 1 + event_id.len());
            schedule_subject.push_str(prefix);
            schedule_subject.push('.');
            push_escaped_token(&mut schedule_subject, event_id);
            let target = std::mem::replace(subject, schedule_subject);
            headers.push((names.schedule.clone(), format!("@at {at}").into()));
            headers.push((names.schedule_target.clone(), target.into()));
            // JetStream strips `Nats-Msg-Id` from the copy it delivers.
            headers.push((names.event_id.clone(), event_id.into()));
            scheduled = true;
        }
        if let Some((column, kind)) = self.ttl
            && let Some(raw) = text(column)?
        {
            // `Nats-TTL` on a schedule would expire the schedule, not the delivered event.
            let (header, name) = if scheduled {
                (HEADER_SCHEDULE_TTL, &names.schedule_ttl)
            } else {
                (HEADER_NATS_TTL, &names.ttl)
            };
            let value = utf8(column, header, raw)?;
            let seconds = match kind {
                TtlKind::Seconds => value
                    .parse::<i64>()
                    .map_err(|e| format!("`{value}` is not an integer: {e}")),
                TtlKind::Interval => interval_micros(&value).map(ttl_seconds),
            }
            .and_then(|s| {
                if s >= 1 {
                    Ok(s)
                } else {
                    Err(format!(
                        "a TTL must be at least 1 second, `{value}` is not (NULL sends no TTL)"
                    ))
                }
            })
            .map_err(|reason| bad(column, header, reason))?;
            headers.push((name.clone(), seconds.to_string().into()));
        }
        if let Some(ce) = &self.cloudevents {
            let ce_type = match text(ce.type_column)? {
                Some(raw) if !raw.is_empty() => utf8(ce.type_column, HEADER_CE_TYPE, raw)?,
                _ => {
                    return Err(bad(
                        ce.type_column,
                        HEADER_CE_TYPE,
                        "NULL or empty: CloudEvents requires a type".into(),
                    ));
                }
            };
            let time: Arc<str> = match ce.time_column.map(|c| text(c).map(|v| (c, v))) {
                None | Some(Ok((_, None))) => commit_time.clone(),
                Some(Err(e)) => return Err(e),
                Some(Ok((column, Some(raw)))) => {
                    timestamptz_rfc3339(&utf8(column, HEADER_CE_TIME, raw)?)
                        .map_err(|reason| bad(column, HEADER_CE_TIME, reason))?
                        .into()
                }
            };
            headers.push((names.ce_specversion.clone(), names.specversion.clone()));
            headers.push((names.ce_id.clone(), event_id.into()));
            headers.push((names.ce_source.clone(), ce.source.clone()));
            headers.push((names.ce_type.clone(), ce_type.into()));
            headers.push((names.ce_time.clone(), time));
            if let Some(column) = ce.subject_column
                && let Some(raw) = text(column)?
            {
                let value = utf8(column, HEADER_CE_SUBJECT, raw)?;
                headers.push((names.ce_subject.clone(), value.into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
