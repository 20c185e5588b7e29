//! The channels of the document: one per outbox table, one per `[[messages]]` prefix and the
//! dead-letter subject, each with the messages published there.

use std::collections::BTreeMap;

use relay_core::route::{LoadedContract, MessageRouteConfig, OutboxTableConfig, TypeSource};
use relay_core::subject::{MAX_SUBJECT_LEVELS, Segment, SubjectTemplate};
use serde_json::{Map, Value, json};

use relay_runtime::config::RelayConfig;

use crate::error::AsyncApiError;
use crate::headers::{self, Headers};

/// One channel before it gets its id in the document.
#[derive(Debug)]
pub(crate) struct Channel {
    /// The id wanted (made unique and safe by the document).
    pub(crate) id: String,
    /// The subject, with `{parameter}`s; `None` when only filters are known.
    pub(crate) address: Option<String>,
    pub(crate) title: String,
    pub(crate) description: String,
    /// Parameter name → Parameter Object.
    pub(crate) parameters: Map<String, Value>,
    /// Message key in the channel → Message Object.
    pub(crate) messages: Vec<(String, Value)>,
}

/// Where a placeholder's value comes from, for its description.
#[derive(Debug, Clone, Copy)]
enum Source {
    Column,
    EnvelopeField,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Self::Column => "Column",
            Self::EnvelopeField => "Envelope field",
        }
    }
}

/// The channel address of `template` (each placeholder as `{parameter}`) and its parameters.
fn template_address(template: &SubjectTemplate, source: Source) -> (String, Map<String, Value>) {
    let mut address = String::new();
    let mut parameters = Map::new();
    // (placeholder, rule) → parameter name: one parameter per placeholder, named by its column.
    let mut names: BTreeMap<(&str, bool), String> = BTreeMap::new();
    for segment in template.segments() {
        let (field, levels) = match segment {
            Segment::Literal(text) => {
                address.push_str(text);
                continue;
            }
            Segment::Column(field) => (field.as_str(), false),
            Segment::Levels(field) => (field.as_str(), true),
        };
        let name = match names.get(&(field, levels)) {
            Some(name) => name.clone(),
            None => {
                let name =
                    crate::ids::unique(&parameter_name(field), |n| parameters.contains_key(n));
                parameters.insert(
                    name.clone(),
                    json!({ "description": parameter_description(source, field, levels) }),
                );
                names.insert((field, levels), name.clone());
                name
            }
        };
        address.push('{');
        address.push_str(&name);
        address.push('}');
    }
    (address, parameters)
}

/// `field` as a parameter name: AsyncAPI allows `[A-Za-z0-9_-]+`, a column name need not be.
fn parameter_name(field: &str) -> String {
    field
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn parameter_description(source: Source, field: &str, levels: bool) -> String {
    let source = source.name();
    if levels {
        format!(
            "{source} `{field}` as subject levels (`{{levels:{field}}}`): its dot-separated parts, 1 to {MAX_SUBJECT_LEVELS}, each escaped as one token is (`$`, `%` and every non-ASCII byte become `%XX`); an empty level, `*`, `>`, whitespace, a control character or a NULL or empty value makes the event a bad row."
        )
    } else {
        format!(
            "{source} `{field}` as one subject token: every byte outside printable ASCII, whitespace, `.`, `*`, `>`, `$` and `%` becomes `%XX` (`a.b` → `a%2Eb`); a NULL or empty value makes the event a bad row."
        )
    }
}

/// A Message Object.
fn message(
    title: String,
    description: String,
    content_type: Option<&str>,
    headers: &Headers,
    payload: Value,
) -> Value {
    let mut message = Map::new();
    message.insert("title".into(), title.into());
    message.insert("description".into(), description.into());
    if let Some(content_type) = content_type {
        message.insert("contentType".into(), content_type.into());
    }
    message.insert("headers".into(), headers.schema());
    message.insert("payload".into(), payload);
    Value::Object(message)
}

/// The channels of outbox table `table`: its subject's, and its schedule subject's when it
/// has a `schedule_column`; each with one message per contract of its `contracts` (compiled)
/// and one for events without a contract where those are published.
pub(crate) fn table(
    config: &RelayConfig,
    table: &OutboxTableConfig,
    contracts: &[&LoadedContract],
) -> Result<Vec<Channel>, AsyncApiError> {
    let name = table.display_name();
    let template = table.validate().map_err(|source| AsyncApiError::Mapping {
        table: table.table.clone(),
        source,
    })?;
    let (address, parameters) = template_address(&template, Source::Column);
    let mut description = format!(
        "Events of outbox table `{name}`: one message per inserted row, on the subject of template `{}`.",
        table.subject
    );
    if let Some(filter) = &table.row_filter {
        description.push_str(&format!(
            " Only rows the publication's row filter `{filter}` keeps."
        ));
    }
    let stream = &config.nats.stream;
    let mut channels = vec![Channel {
        id: format!("table.{name}"),
        address: Some(address),
        title: format!("Outbox table {name}"),
        description,
        parameters,
        messages: table_messages(
            config,
            table,
            &headers::table_event(stream, table),
            contracts,
        ),
    }];
    if let (Some(column), Some(prefix)) = (&table.schedule_column, &table.schedule_subject) {
        channels[0].description.push_str(&format!(
            " An event with a delivery time (column `{column}` not NULL) is published on `{prefix}.<event id>` instead, and JetStream delivers a copy here at that time."
        ));
        let parameter = parameter_name(&table.event_id);
        let mut parameters = Map::new();
        parameters.insert(
            parameter.clone(),
            json!({ "description": parameter_description(Source::Column, &table.event_id, false) }),
        );
        channels.push(Channel {
            id: format!("table.{name}.schedules"),
            address: Some(format!("{prefix}.{{{parameter}}}")),
            title: format!("Schedules of outbox table {name}"),
            description: format!(
                "Events of outbox table `{name}` with a delivery time (column `{column}` not NULL), one schedule subject per event (its id): at that time JetStream stores a copy on the event's subject (Nats-Schedule-Target) and removes the schedule."
            ),
            parameters,
            messages: table_messages(
                config,
                table,
                &headers::scheduled_event(stream, table),
                contracts,
            ),
        });
    }
    Ok(channels)
}

/// The messages of `table` with `headers`: one per contract, and one for events without a
/// contract unless `[outbox.contracts]` requires one.
fn table_messages(
    config: &RelayConfig,
    table: &OutboxTableConfig,
    headers: &Headers,
    contracts: &[&LoadedContract],
) -> Vec<(String, Value)> {
    let name = table.display_name();
    let mut messages: Vec<(String, Value)> = contracts
        .iter()
        .map(|contract| contract_message(config, table, headers, contract))
        .collect();
    if table.contracts.as_ref().is_none_or(|c| !c.required) {
        let (payload, content_type) = table_payload(table);
        let (title, description) = if contracts.is_empty() {
            (
                format!("Event of {name}"),
                format!("An event of outbox table `{name}`."),
            )
        } else {
            (
                format!("Event of {name} without a contract"),
                format!(
                    "An event of outbox table `{name}` that no contract of its [outbox.contracts] matches: published unchecked, without Outbox-Schema."
                ),
            )
        };
        messages.push((
            "event".to_owned(),
            message(title, description, content_type, headers, payload),
        ));
    }
    messages
}

/// The payload of an event of `table` that has no contract, and its content type when known.
fn table_payload(table: &OutboxTableConfig) -> (Value, Option<&'static str>) {
    let column = &table.payload;
    let json = Some("application/json");
    let (description, content_type) = if table.payload == relay_core::route::PAYLOAD_WHOLE_ROW {
        (
            "The whole row as a JSON object, one member per column: integers and floats as numbers, numeric as a string, booleans, json/jsonb embedded, NULL as null, anything else as its PostgreSQL text.".to_owned(),
            json,
        )
    } else if let Some(pointer) = &table.payload_pointer {
        (
            format!(
                "The member `{pointer}` of the JSON value in column `{column}`, its JSON text sliced byte for byte (a string member with its quotes); a null member: an empty body."
            ),
            json,
        )
    } else if table.payload_format == relay_core::route::PayloadFormat::Json {
        (
            format!("Column `{column}`, byte for byte: valid UTF-8 JSON (payload_format = json)."),
            json,
        )
    } else {
        (
            format!(
                "Column `{column}`, byte for byte as PostgreSQL renders it (bytea decoded to its bytes; NULL: an empty body); JSON when payload_format = json."
            ),
            None,
        )
    };
    (json!({ "description": description }), content_type)
}

/// The message of the events of `table` that contract `loaded` checked.
fn contract_message(
    config: &RelayConfig,
    table: &OutboxTableConfig,
    headers: &Headers,
    loaded: &LoadedContract,
) -> (String, Value) {
    let contract = loaded.contract();
    let mut matched_by: Vec<String> = Vec::new();
    let mut type_from = String::new();
    if let Some(contracts) = &table.contracts {
        matched_by = contracts
            .files()
            .filter(|(_, file)| {
                file.path().display().to_string() == loaded.file()
                    && file.name().is_none_or(|n| n == contract.name())
            })
            .map(|(key, _)| format!("`{key}`"))
            .collect();
        type_from = match contracts.type_source() {
            TypeSource::Column(column) => format!("column `{column}`"),
            TypeSource::Header(header) => format!("header `{header}`"),
        };
    }
    let description = format!(
        "An event of outbox table `{}` matched by {} of its [outbox.contracts] (the event type is read from {type_from}): its payload satisfied contract `{}` (file {}) before it was published, and Outbox-Schema names that contract.",
        table.display_name(),
        matched_by.join(", "),
        contract.key(),
        loaded.file(),
    );
    let schema = contract.schema();
    let draft_7 = schema
        .get("$schema")
        .and_then(Value::as_str)
        .is_some_and(|s| s.contains("draft-07"));
    let schema_format = if draft_7 {
        "application/schema+json;version=draft-07"
    } else {
        "application/schema+json;version=draft-2020-12"
    };
    let headers = headers
        .clone()
        .with_contract(contract.key(), &config.nats.contracts_bucket);
    let mut message = message(
        format!("{} ({})", contract.name(), table.display_name()),
        description,
        Some("application/json"),
        &headers,
        json!({ "schemaFormat": schema_format, "schema": schema }),
    );
    if let Value::Object(map) = &mut message {
        map.insert("name".into(), contract.name().into());
    }
    (format!("contract.{}", contract.name()), message)
}

/// The channel of a `[[messages]]` prefix.
pub(crate) fn message_prefix(
    config: &RelayConfig,
    route: &MessageRouteConfig,
) -> Result<Channel, AsyncApiError> {
    let prefix = &route.prefix;
    let template = route.validate().map_err(|source| AsyncApiError::Messages {
        prefix: prefix.clone(),
        source,
    })?;
    let filters = route
        .subjects
        .iter()
        .map(|f| format!("`{f}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let transactional = if route.allow_non_transactional {
        "`pg_logical_emit_message(true or false, …)`"
    } else {
        "`pg_logical_emit_message(true, …)` in a transaction that committed"
    };
    let mut description = format!(
        "Logical decoding messages with prefix `{prefix}`, emitted with {transactional}: one message per JSON envelope, "
    );
    let (address, parameters) = match &template {
        Some(template) => {
            description.push_str(&format!(
                "on the subject that template `{template}` makes from the envelope's fields, within {filters}."
            ));
            let (address, parameters) = template_address(template, Source::EnvelopeField);
            (Some(address), parameters)
        }
        None => {
            description.push_str(&format!(
                "on the envelope's `subject`, which must match one of {filters}."
            ));
            // Only a filter without wildcards is one subject; otherwise the address is unknown
            // and the filters say where.
            let literal = match route.subjects.as_slice() {
                [one] if !one.split('.').any(|t| t == "*" || t == ">") => Some(one.clone()),
                _ => None,
            };
            (literal, Map::new())
        }
    };
    let headers = headers::prefix_event(&config.nats.stream, prefix);
    let payload = json!({
        "description": "The envelope's `payload`: a JSON string as its text (UTF-8, unquoted), any other JSON value as its JSON text exactly as written; absent or null: an empty body."
    });
    Ok(Channel {
        id: format!("messages.{prefix}"),
        address,
        title: format!("Logical decoding messages with prefix {prefix}"),
        description,
        parameters,
        messages: vec![(
            "event".to_owned(),
            message(
                format!("Event of prefix {prefix}"),
                format!("An event emitted as a logical decoding message with prefix `{prefix}`."),
                None,
                &headers,
                payload,
            ),
        )],
    })
}

/// The channel of `[relay] dead_letter_subject`.
pub(crate) fn dead_letters(config: &RelayConfig, subject: &str) -> Channel {
    let payload = json!({
        "description": "A row that could not be routed: the raw row as a JSON object (column name → PostgreSQL text or null). A logical decoding message that could not be published: its raw content. An event id collision: the event's payload."
    });
    Channel {
        id: "dead-letters".to_owned(),
        address: Some(subject.to_owned()),
        title: "Dead letters".to_owned(),
        description: "Events the relay could not publish where they belong ([relay] dead_letter_subject): published here with the reason, and the relay goes on.".to_owned(),
        parameters: Map::new(),
        messages: vec![(
            "dead-letter".to_owned(),
            message(
                "Dead letter".to_owned(),
                "An event the relay could not publish, with Outbox-Dlq-Reason.".to_owned(),
                None,
                &headers::dead_letter(&config.nats.stream),
                payload,
            ),
        )],
    }
}
