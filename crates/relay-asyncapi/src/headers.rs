//! The headers of each kind of message the relay publishes, as JSON Schema objects: the
//! relay's own (`outbox_contract`), a mapping's, the broker-native and CloudEvents ones, and the
//! dead letters'. What each means is docs/message-format.md; here it is said in a line.

use outbox_contract::{
    CE_SPECVERSION, HEADER_BACKFILL, HEADER_CE_ID, HEADER_CE_SOURCE, HEADER_CE_SPECVERSION,
    HEADER_CE_SUBJECT, HEADER_CE_TIME, HEADER_CE_TYPE, HEADER_COMMIT_LSN, HEADER_COMMIT_TIME,
    HEADER_DLQ_REASON, HEADER_EVENT_ID, HEADER_EXPECTED_LAST_MSG_ID, HEADER_EXPECTED_STREAM,
    HEADER_MESSAGE_PREFIX, HEADER_MSG_ID, HEADER_NATS_TTL, HEADER_SCHEDULE, HEADER_SCHEDULE_TARGET,
    HEADER_SCHEDULE_TTL, HEADER_SCHEMA, HEADER_TABLE, HEADER_TX_INDEX, HEADER_XID, RELAY_HEADERS,
};
use relay_core::route::{CloudEventsConfig, OutboxTableConfig};
use serde_json::{Map, Value, json};

/// Suffix on a `headers` column that makes the column optional (relay-core's rule).
const OPTIONAL_COLUMN: char = '?';

/// The headers of one kind of message: each header's schema, and which are always there.
#[derive(Debug, Default, Clone)]
pub(crate) struct Headers {
    properties: Map<String, Value>,
    required: Vec<String>,
    /// Headers of names not known in advance (a `headers_json` column, an envelope's
    /// `headers`): what they are.
    others: Option<String>,
}

impl Headers {
    /// A header every message of the kind carries.
    fn always(&mut self, name: &str, schema: Value) {
        self.required.push(name.to_owned());
        self.properties.insert(name.to_owned(), schema);
    }

    /// A header some messages of the kind carry.
    fn sometimes(&mut self, name: &str, schema: Value) {
        self.properties.insert(name.to_owned(), schema);
    }

    /// Header `name`, always there until now, is absent on some messages: `note` says which.
    fn relax(&mut self, name: &str, note: &str) {
        self.required.retain(|r| r != name);
        if let Some(Value::String(description)) = self
            .properties
            .get_mut(name)
            .and_then(|schema| schema.get_mut("description"))
        {
            description.push(' ');
            description.push_str(note);
        }
    }

    /// `Outbox-Schema` naming contract `key`, on every message of the kind.
    pub(crate) fn with_contract(mut self, key: &str, bucket: &str) -> Self {
        self.always(
            HEADER_SCHEMA,
            json!({
                "type": "string",
                "const": key,
                "description": format!("The contract the payload was checked against before it was published: its key in the NATS KV bucket `{bucket}`, `<name>.<version>` (the version is the first 12 hex digits of the SHA-256 of the stored schema)."),
            }),
        );
        self
    }

    /// The JSON Schema of the header block: an object of string values.
    pub(crate) fn schema(&self) -> Value {
        let mut schema = Map::new();
        schema.insert("type".into(), "object".into());
        schema.insert(
            "description".into(),
            "NATS message headers, each a string.".into(),
        );
        schema.insert("properties".into(), Value::Object(self.properties.clone()));
        if !self.required.is_empty() {
            schema.insert("required".into(), json!(self.required));
        }
        if let Some(others) = &self.others {
            schema.insert(
                "additionalProperties".into(),
                json!({ "type": "string", "description": others }),
            );
        }
        Value::Object(schema)
    }
}

fn text(description: impl Into<String>) -> Value {
    json!({ "type": "string", "description": description.into() })
}

fn constant(value: &str, description: impl Into<String>) -> Value {
    json!({ "type": "string", "const": value, "description": description.into() })
}

fn digits(description: &str) -> Value {
    json!({ "type": "string", "pattern": "^[0-9]+$", "description": description })
}

/// Where an event came from: the header that names it, and the name.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin<'a> {
    /// An outbox table (`Outbox-Table`), as the configuration writes it.
    Table(&'a str),
    /// A `[[messages]]` prefix (`Outbox-Message-Prefix`).
    MessagePrefix(&'a str),
}

/// The headers the relay sets on every event it publishes ([`RELAY_HEADERS`], with
/// `Outbox-Message-Prefix` in `Outbox-Table`'s place for a logical decoding message), and the
/// ones it sets on some.
fn relay_headers(stream: &str, origin: Origin<'_>) -> Headers {
    let mut headers = Headers::default();
    for name in RELAY_HEADERS {
        let schema = match name {
            HEADER_MSG_ID => text(
                "The event id: JetStream deduplicates on it, and consumers use it as the idempotency key.",
            ),
            HEADER_EXPECTED_STREAM => constant(
                stream,
                "The stream the event must land in; JetStream refuses it when another stream captures the subject.",
            ),
            HEADER_COMMIT_LSN => json!({
                "type": "string",
                "pattern": "^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
                "description": "LSN of the commit record of the transaction that wrote the event (`0/16B3748`); `0/0` on a backfilled row.",
            }),
            HEADER_XID => {
                digits("PostgreSQL transaction id of that transaction; `0` on a backfilled row.")
            }
            HEADER_COMMIT_TIME => json!({
                "type": "string",
                "format": "date-time",
                "description": "Commit time of that transaction, RFC 3339 UTC with microseconds.",
            }),
            HEADER_TX_INDEX => digits(
                "0-based position of the event among the events of its transaction: with Outbox-Commit-Lsn, the commit order.",
            ),
            HEADER_TABLE => match origin {
                Origin::Table(table) => {
                    constant(table, "The outbox table the row was inserted into.")
                }
                // A logical decoding message names its prefix instead.
                Origin::MessagePrefix(_) => continue,
            },
            _ => text("Set by the relay."),
        };
        headers.always(name, schema);
    }
    if let Origin::MessagePrefix(prefix) = origin {
        headers.always(
            HEADER_MESSAGE_PREFIX,
            constant(
                prefix,
                "The `pg_logical_emit_message` prefix the event was emitted with.",
            ),
        );
    }
    headers.sometimes(
        HEADER_EXPECTED_LAST_MSG_ID,
        text("The id of the event committed before this one, while that one was not yet acknowledged: JetStream stores this event only right after it. Present or not depending on timing; consumers ignore it."),
    );
    headers
}

/// The headers of an event of outbox table `table` on its subject: published there by the
/// relay or, for an event with a delivery time, delivered there by JetStream.
pub(crate) fn table_event(stream: &str, table: &OutboxTableConfig) -> Headers {
    let mut headers = table_base(stream, table);
    if let Some(column) = &table.ttl_column {
        headers.sometimes(
            HEADER_NATS_TTL,
            digits(&format!(
                "Column `{column}`: whole seconds after which JetStream removes the message; absent when NULL."
            )),
        );
    }
    if let Some(column) = &table.schedule_column {
        let delivered = format!(
            "a scheduled event (column `{column}` not NULL), which JetStream delivers here from its schedule"
        );
        for stripped in [HEADER_MSG_ID, HEADER_EXPECTED_STREAM] {
            headers.relax(stripped, &format!("Absent on {delivered}."));
        }
        headers.sometimes(
            HEADER_EVENT_ID,
            text(format!(
                "On {delivered}: the event id, as Nats-Msg-Id is stripped."
            )),
        );
        headers.sometimes(
            // Set by nats-server on the copy it delivers (ADR-51); no constant of ours names it.
            "Nats-Scheduler",
            text(format!("On {delivered}: the schedule's subject.")),
        );
    }
    headers
}

/// The headers of an event of `table` with a delivery time, on its schedule subject.
pub(crate) fn scheduled_event(stream: &str, table: &OutboxTableConfig) -> Headers {
    let mut headers = table_base(stream, table);
    headers.always(
        HEADER_SCHEDULE,
        json!({
            "type": "string",
            "pattern": "^@at ",
            "description": "When JetStream delivers the event: `@at <RFC 3339 UTC>`.",
        }),
    );
    headers.always(
        HEADER_SCHEDULE_TARGET,
        text("The event's subject, where JetStream delivers it."),
    );
    headers.always(
        HEADER_EVENT_ID,
        text("The event id, which the delivered copy keeps (JetStream strips Nats-Msg-Id)."),
    );
    if let Some(column) = &table.ttl_column {
        headers.sometimes(
            HEADER_SCHEDULE_TTL,
            digits(&format!(
                "Column `{column}`: the delivered copy's Nats-TTL, whole seconds; absent when NULL."
            )),
        );
    }
    headers
}

/// The headers every event of `table` carries wherever it is stored: the relay's own, the
/// mapped ones, CloudEvents' and those of a `headers_json` column.
fn table_base(stream: &str, table: &OutboxTableConfig) -> Headers {
    let display = table.display_name();
    let mut headers = relay_headers(stream, Origin::Table(&display));
    headers.sometimes(
        HEADER_BACKFILL,
        constant(
            "true",
            "On an event `outbox-relay backfill` published from a row read from the table, not from the WAL; absent otherwise.",
        ),
    );
    for (name, column) in &table.headers {
        let description = match column.strip_suffix(OPTIONAL_COLUMN) {
            Some(column) => format!(
                "Column `{column}` (optional: absent when the table has no such column); omitted when the value is NULL."
            ),
            None => format!("Column `{column}`; omitted when the value is NULL."),
        };
        headers.sometimes(name, text(description));
    }
    if let Some(ce) = &table.cloudevents {
        cloudevents(&mut headers, ce);
    }
    if let Some(column) = &table.headers_json {
        let at = table
            .headers_json_pointer
            .as_deref()
            .map_or_else(String::new, |pointer| format!(" at `{pointer}`"));
        headers.others = Some(format!(
            "A member of the JSON object in column `{column}`{at}: strings as their text, other values as their JSON text."
        ));
    }
    headers
}

/// The CloudEvents binary content mode headers of `[outbox.cloudevents]`.
fn cloudevents(headers: &mut Headers, ce: &CloudEventsConfig) {
    let binary = "CloudEvents binary content mode";
    headers.always(
        HEADER_CE_SPECVERSION,
        constant(
            CE_SPECVERSION,
            format!("{binary}: the specification version."),
        ),
    );
    headers.always(
        HEADER_CE_ID,
        text(format!("{binary}: the event id (also Nats-Msg-Id).")),
    );
    headers.always(
        HEADER_CE_SOURCE,
        constant(&ce.source, format!("{binary}: the producer.")),
    );
    headers.always(
        HEADER_CE_TYPE,
        text(format!("{binary}: column `{}`.", ce.type_column)),
    );
    let time = ce.time_column.as_deref().map_or_else(
        || "the commit time".to_owned(),
        |c| format!("column `{c}`, or the commit time when NULL"),
    );
    headers.always(
        HEADER_CE_TIME,
        json!({ "type": "string", "format": "date-time", "description": format!("{binary}: {time}, RFC 3339 UTC.") }),
    );
    if let Some(column) = &ce.subject_column {
        headers.sometimes(
            HEADER_CE_SUBJECT,
            text(format!(
                "{binary}: column `{column}`; omitted when the value is NULL."
            )),
        );
    }
}

/// The headers of an event of a `[[messages]]` prefix.
pub(crate) fn prefix_event(stream: &str, prefix: &str) -> Headers {
    let mut headers = relay_headers(stream, Origin::MessagePrefix(prefix));
    headers.others = Some(
        "A member of the envelope's `headers` object: strings as their text, other values as their JSON text."
            .into(),
    );
    headers
}

/// The headers of a dead letter.
pub(crate) fn dead_letter(stream: &str) -> Headers {
    let mut headers = Headers::default();
    headers.always(
        HEADER_MSG_ID,
        text("`dlq:<table>:<commit LSN>:<tx index>` for a row (`dlq:<table>:row:<hash>` for a backfilled one), `dlq:message:<prefix>:<LSN>` for a logical decoding message, `dlq:collision:<event id>:<commit LSN>` for an event id collision: the same on every re-read."),
    );
    headers.always(
        HEADER_EXPECTED_STREAM,
        constant(stream, "The stream the dead letter must land in."),
    );
    headers.always(
        HEADER_DLQ_REASON,
        text("Why the event could not be published (control characters replaced by spaces)."),
    );
    headers.sometimes(
        HEADER_TABLE,
        text("The outbox table of a row that could not be routed."),
    );
    headers.sometimes(
        HEADER_MESSAGE_PREFIX,
        text("The prefix of a logical decoding message that could not be published."),
    );
    headers.always(
        HEADER_COMMIT_LSN,
        text("As on the event: the commit LSN of its transaction."),
    );
    headers.always(HEADER_XID, digits("As on the event: its transaction id."));
    headers.always(
        HEADER_TX_INDEX,
        digits("As on the event: its position in its transaction."),
    );
    headers.others =
        Some("On an event id collision: the event's own headers, as it was routed.".into());
    headers
}
