//! The mapping of one outbox table (the `[[outbox]]` configuration) and its validation.

use std::collections::BTreeMap;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::ident::{TableName, TableNameError};
use crate::subject::{SubjectTemplate, TemplateError};

mod contracts;
mod native;

pub use contracts::{ContractFile, ContractsConfig, TypeSource};
pub use native::CloudEventsConfig;

/// `payload` value that publishes the whole row as a JSON object.
pub const PAYLOAD_WHOLE_ROW: &str = "*";
/// Suffix on a header column name that makes the column optional.
pub(super) const OPTIONAL_SUFFIX: char = '?';

/// How one outbox table maps to messages. Defaults follow Debezium's outbox event router shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxTableConfig {
    /// The table, `schema.table` (or `table` for `public`); each part bare (exactly as the
    /// catalog stores it, no case folding) or double-quoted (dots, spaces, `""`): see
    /// [`crate::ident`].
    pub table: String,
    /// Column whose value is the event id, sent as `Nats-Msg-Id`. Default `id`.
    #[serde(default = "default_event_id")]
    pub event_id: String,
    /// Subject template; `{column}` is replaced by the column's value under the token rule,
    /// `{levels:column}` by its dot-separated levels under the levels rule (`crate::subject`).
    /// Default `outbox.{aggregatetype}.{type}`.
    #[serde(default = "default_subject")]
    pub subject: String,
    /// Payload column, forwarded byte-exact (json, jsonb, text) or decoded (bytea); `"*"` sends
    /// the whole row as a JSON object. Default `payload`.
    #[serde(default = "default_payload")]
    pub payload: String,
    /// Header name → column. A trailing `?` on the column makes it optional (absent column: no
    /// header); a NULL value omits the header.
    #[serde(default = "default_headers")]
    pub headers: BTreeMap<String, String>,
    /// What the payload column must hold: `raw` (default, forwarded as is) or `json` (must be
    /// valid UTF-8 JSON, else the row fails closed or goes to the dead-letter subject).
    #[serde(default, skip_serializing_if = "PayloadFormat::is_raw")]
    pub payload_format: PayloadFormat,
    /// Column holding a per-message TTL (`smallint`/`integer`/`bigint` seconds, or `interval`),
    /// sent as `Nats-TTL` (nats-server 2.11+, a stream with `allow_msg_ttl`); NULL: no TTL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_column: Option<String>,
    /// A `timestamptz` column: the event is delivered at that time (`Nats-Schedule: @at …`,
    /// nats-server 2.12+, a stream with `allow_msg_schedules`); NULL: delivered now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_column: Option<String>,
    /// Subject prefix a scheduled event is held under until due, as
    /// `<schedule_subject>.<event id>` (required with `schedule_column`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_subject: Option<String>,
    /// CloudEvents binary-mode headers (`ce-*`) on every event of the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloudevents: Option<CloudEventsConfig>,
    /// A column holding a JSON object whose members become headers (strings as their text,
    /// numbers, booleans, objects and arrays as their JSON text, `null` skipped); a NULL value
    /// adds none. A member naming a header the relay or the mapping sets is a bad row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_json: Option<String>,
    /// JSON Pointer (RFC 6901, e.g. `/Headers`) to the header object inside `headers_json`'s
    /// value, for envelope columns (CAP's `Content`); unset: the whole value is the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_json_pointer: Option<String>,
    /// JSON Pointer (RFC 6901, e.g. `/Value`) to the payload inside the payload column's JSON
    /// value: the member's JSON text, sliced byte-exact from the value; a missing member is a
    /// bad row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_pointer: Option<String>,
    /// A publication row filter (PostgreSQL 15+): only rows it keeps are relayed. The SQL
    /// condition of `CREATE PUBLICATION … WHERE (…)`, checked against the publication at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_filter: Option<String>,
    /// `[outbox.contracts]`: the JSON Schema each event type's payload must satisfy before it
    /// is published (docs/contracts.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contracts: Option<ContractsConfig>,
}

/// Validation applied to the payload column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    /// Forwarded as PostgreSQL renders it, unchecked.
    #[default]
    Raw,
    /// Must be valid UTF-8 and valid JSON.
    Json,
}

impl PayloadFormat {
    fn is_raw(&self) -> bool {
        *self == Self::Raw
    }
}

fn default_event_id() -> String {
    "id".into()
}
fn default_subject() -> String {
    "outbox.{aggregatetype}.{type}".into()
}
fn default_payload() -> String {
    "payload".into()
}
fn default_headers() -> BTreeMap<String, String> {
    [
        ("Outbox-Aggregate-Type", "aggregatetype"),
        ("Outbox-Aggregate-Id", "aggregateid"),
        ("Outbox-Event-Type", "type"),
        ("traceparent", "tracingspancontext?"),
    ]
    .into_iter()
    .map(|(h, c)| (h.to_owned(), c.to_owned()))
    .collect()
}

impl OutboxTableConfig {
    /// A mapping with every default for `table`.
    pub fn with_defaults(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            event_id: default_event_id(),
            subject: default_subject(),
            payload: default_payload(),
            headers: default_headers(),
            payload_format: PayloadFormat::Raw,
            ttl_column: None,
            schedule_column: None,
            schedule_subject: None,
            cloudevents: None,
            headers_json: None,
            headers_json_pointer: None,
            payload_pointer: None,
            row_filter: None,
            contracts: None,
        }
    }

    /// `(schema, table)` as the catalog stores them (see [`crate::ident`]); a name that does not
    /// parse ([`Self::validate`] refuses it) as `public` and the text.
    pub fn qualified_name(&self) -> (Cow<'_, str>, Cow<'_, str>) {
        match TableName::parse(&self.table) {
            Ok(name) => (name.schema, name.table),
            Err(_) => (
                Cow::Borrowed(crate::ident::DEFAULT_SCHEMA),
                Cow::Borrowed(&self.table),
            ),
        }
    }

    /// Whether this maps the catalog's `schema.table`.
    pub fn is_table(&self, schema: &str, table: &str) -> bool {
        let (s, t) = self.qualified_name();
        s == schema && t == table
    }

    /// The table as the configuration writes it, quoted only where needed
    /// ([`crate::ident::display_relation`]): its name in messages, headers and metrics.
    pub fn display_name(&self) -> String {
        let (schema, table) = self.qualified_name();
        crate::ident::display_relation(&schema, &table)
    }

    /// The columns the mapping reads, each with the key that names it (`event_id`, `payload`,
    /// `subject`, `headers.<name>`, `headers_json`, …), for checking a table's shape before the
    /// relay starts; optional header columns (`column?`) are left out.
    pub fn mapped_columns(&self) -> Vec<(String, String)> {
        let mut out = vec![("event_id".to_owned(), self.event_id.clone())];
        if self.payload != PAYLOAD_WHOLE_ROW {
            out.push(("payload".into(), self.payload.clone()));
        }
        if let Ok(template) = SubjectTemplate::parse(&self.subject) {
            out.extend(
                template
                    .columns()
                    .map(|c| ("subject".to_owned(), c.to_owned())),
            );
        }
        for (header, column) in &self.headers {
            if !column.ends_with(OPTIONAL_SUFFIX) {
                out.push((format!("headers.{header}"), column.clone()));
            }
        }
        for (key, column) in [
            ("headers_json", &self.headers_json),
            ("ttl_column", &self.ttl_column),
            ("schedule_column", &self.schedule_column),
        ] {
            if let Some(column) = column {
                out.push((key.to_owned(), column.clone()));
            }
        }
        if let Some(TypeSource::Column(column)) = self.contracts.as_ref().map(|c| c.type_source()) {
            out.push(("contracts.type_column".to_owned(), column));
        }
        out
    }

    /// Checks everything that can be checked without the database.
    pub fn validate(&self) -> Result<SubjectTemplate, ConfigError> {
        TableName::parse(&self.table).map_err(ConfigError::TableName)?;
        if let Some(filter) = &self.row_filter
            && filter.trim().is_empty()
        {
            return Err(ConfigError::EmptyRowFilter(self.table.clone()));
        }
        if self.event_id.is_empty() || self.payload.is_empty() {
            return Err(ConfigError::EmptyColumn(self.table.clone()));
        }
        for name in self.headers.keys() {
            let bad_char = |c: char| !c.is_ascii_graphic() || c == ':';
            if name.is_empty() || name.contains(bad_char) {
                return Err(ConfigError::HeaderName(name.clone()));
            }
            if outbox_contract::is_relay_owned(name) {
                return Err(ConfigError::ReservedHeader(name.clone()));
            }
        }
        native::validate(self).map_err(|reason| ConfigError::Native {
            table: self.table.clone(),
            reason,
        })?;
        self.pointers()?;
        if let Some(contracts) = &self.contracts {
            contracts
                .validate()
                .map_err(|reason| ConfigError::Contracts {
                    table: self.table.clone(),
                    reason,
                })?;
        }
        SubjectTemplate::parse(&self.subject).map_err(|source| ConfigError::Subject {
            table: self.table.clone(),
            source,
        })
    }
}

/// A mapping that cannot work whatever the database holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not `schema.table` or `table`, each part bare or double-quoted.
    #[error(transparent)]
    TableName(TableNameError),
    /// `event_id` or `payload` is empty.
    #[error("outbox table `{0}`: `event_id` and `payload` must name a column")]
    EmptyColumn(String),
    /// Header names are ASCII without spaces or `:`.
    #[error("header name `{0}` is not a valid NATS header name (printable ASCII, no `:`)")]
    HeaderName(String),
    /// Header set by the relay itself.
    #[error("header `{0}` is set by the relay itself and cannot be mapped from a column")]
    ReservedHeader(String),
    /// Subject template refused.
    #[error("outbox table `{table}`: bad subject template")]
    Subject {
        /// The table.
        table: String,
        /// Why.
        #[source]
        source: TemplateError,
    },
    /// `ttl_column`, `schedule_column`/`schedule_subject` or `[outbox.cloudevents]` refused.
    #[error("outbox table `{table}`: {reason}")]
    Native {
        /// The table.
        table: String,
        /// Why.
        reason: String,
    },
    /// Two mappings for one table.
    #[error("outbox table `{0}` is configured twice")]
    DuplicateTable(String),
    /// `headers_json`, `headers_json_pointer` or `payload_pointer` refused.
    #[error("outbox table `{table}`: {reason}")]
    Json {
        /// The table.
        table: String,
        /// Why.
        reason: String,
    },
    /// `[outbox.contracts]` refused, or a contract file that cannot be used.
    #[error("outbox table `{table}`: {reason}")]
    Contracts {
        /// The table.
        table: String,
        /// Why, naming the key or file and keyword.
        reason: String,
    },
    /// `row_filter = ""`.
    #[error("outbox table `{0}`: row_filter is empty: leave it out to relay every row")]
    EmptyRowFilter(String),
}
