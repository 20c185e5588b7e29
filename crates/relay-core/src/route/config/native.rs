//! The native-header options of one outbox table (`ttl_column`, `schedule_column`,
//! `schedule_subject`, `[outbox.cloudevents]`) and the checks of them that need no database.
//! What they compile to against a table's columns is `route::native`.

use serde::{Deserialize, Serialize};

use super::OutboxTableConfig;

/// `[outbox.cloudevents]`: CloudEvents binary content mode headers on every event of a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudEventsConfig {
    /// `ce-source`: a URI-reference naming the producer, e.g. `/orders`. Required.
    pub source: String,
    /// Column whose value is `ce-type`. Default `type`.
    #[serde(default = "default_type_column")]
    pub type_column: String,
    /// A `timestamptz` column whose value is `ce-time`; default (and for a NULL value): the
    /// transaction's commit time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_column: Option<String>,
    /// Column whose value is `ce-subject`; a NULL value omits it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_column: Option<String>,
}

fn default_type_column() -> String {
    "type".into()
}

/// Checks the native options of `config` that need no database.
pub(super) fn validate(config: &OutboxTableConfig) -> Result<(), String> {
    let empty = |c: &Option<String>| c.as_deref().is_some_and(str::is_empty);
    if empty(&config.ttl_column) || empty(&config.schedule_column) {
        return Err("`ttl_column` and `schedule_column` must name a column".into());
    }
    match (&config.schedule_column, &config.schedule_subject) {
        (Some(_), None) => {
            return Err("`schedule_column` needs `schedule_subject`, the subject prefix JetStream holds each scheduled event under until it is due (e.g. \"outbox_schedules\"; the stream must capture `<schedule_subject>.>`)".into());
        }
        (None, Some(_)) => {
            return Err("`schedule_subject` is set without `schedule_column`".into());
        }
        (Some(_), Some(prefix)) => {
            let bad = prefix.is_empty()
                || prefix.split('.').any(|t| {
                    t.is_empty()
                        || t == "*"
                        || t == ">"
                        || t.chars().any(|c| c.is_whitespace() || c.is_control())
                });
            if bad {
                return Err(format!(
                    "`schedule_subject` `{prefix}` is not a subject of literal tokens"
                ));
            }
        }
        (None, None) => {}
    }
    if let Some(ce) = &config.cloudevents {
        if ce.source.is_empty() || ce.source.chars().any(char::is_control) {
            return Err("`cloudevents.source` must be a non-empty URI-reference".into());
        }
        if ce.type_column.is_empty() {
            return Err("`cloudevents.type_column` must name a column".into());
        }
        if let Some(name) = config.headers.keys().find(|h| {
            h.to_ascii_lowercase()
                .starts_with(outbox_contract::CE_PREFIX)
        }) {
            return Err(format!(
                "header `{name}` is set by `[outbox.cloudevents]`; remove it from `headers`"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> OutboxTableConfig {
        OutboxTableConfig::with_defaults("public.outbox")
    }

    #[test]
    fn options_that_cannot_work_are_refused_before_any_database() {
        let schedule_alone = OutboxTableConfig {
            schedule_column: Some("deliver_at".into()),
            ..config()
        };
        assert!(
            validate(&schedule_alone)
                .unwrap_err()
                .contains("schedule_subject")
        );
        for prefix in ["", "a..b", "a.*", "a.>", "a b"] {
            let c = OutboxTableConfig {
                schedule_subject: Some(prefix.into()),
                ..schedule_alone.clone()
            };
            assert!(validate(&c).is_err(), "{prefix:?}");
        }
        let ce = |source: &str| CloudEventsConfig {
            source: source.into(),
            type_column: "type".into(),
            time_column: None,
            subject_column: None,
        };
        let empty_source = OutboxTableConfig {
            cloudevents: Some(ce("")),
            ..config()
        };
        assert!(validate(&empty_source).is_err());
        let mut mapped_ce = OutboxTableConfig {
            cloudevents: Some(ce("/orders")),
            ..config()
        };
        mapped_ce.headers.insert("CE-Type".into(), "type".into());
        assert!(validate(&mapped_ce).unwrap_err().contains("CE-Type"));
        let fine = OutboxTableConfig {
            ttl_column: Some("ttl".into()),
            schedule_column: Some("deliver_at".into()),
            schedule_subject: Some("outbox_schedules".into()),
            cloudevents: Some(ce("/orders")),
            ..config()
        };
        assert_eq!(validate(&fine), Ok(()));
    }
}
