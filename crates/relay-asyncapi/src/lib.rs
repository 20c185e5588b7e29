//! An AsyncAPI 3.0.0 document of what the relay publishes, built from its configuration: the
//! NATS server, one channel per `[[outbox]]` table (its subject template as the address, one
//! parameter per placeholder), one per `[[messages]]` prefix and the dead-letter subject, each
//! message's headers as a JSON Schema and, where `[outbox.contracts]` names one, its contract's
//! bundled schema as the payload. A `send` operation per channel says the relay publishes
//! there.
//!
//! A bundled contract's `$ref`s name the files embedded in it by their `$id`s
//! (`shared/money.json`); AsyncAPI tools resolve `$ref`s without `$id`s, so in the document
//! each is a JSON Pointer to where the payload embeds its target
//! (`#/components/messages/<id>/payload/schema/$defs/file:~1~1~1shared~1money.json`). The
//! stored contract, and its version, stay as they are.
//!
//! Messages live in `components/messages` and channels refer to them, so a tool sees each
//! message once. Ids are made of the configuration's names, reduced to the characters AsyncAPI
//! allows in component keys (`[A-Za-z0-9._-]`) and made unique.
//!
//! It only reads the configuration (`relay_runtime::config::RelayConfig`) and the contract
//! files it names: `outbox-relay asyncapi` prints what [`document`] returns.

use std::sync::Arc;

use relay_core::route::LoadedContract;
use relay_nats::NatsSettings;
use relay_runtime::config::RelayConfig;
use serde_json::{Map, Value, json};

mod channels;
mod error;
mod headers;
mod ids;

use channels::Channel;
use ids::{component_key, unique};

pub use error::AsyncApiError;

/// The AsyncAPI version of the documents [`document`] builds.
pub const ASYNCAPI_VERSION: &str = "3.0.0";

/// Id of the one server in the document.
const SERVER_ID: &str = "nats";

/// The AsyncAPI 3.0.0 document of what a relay with `config` publishes.
pub fn document(config: &RelayConfig) -> Result<Value, AsyncApiError> {
    let contracts = config.contracts().map_err(AsyncApiError::Contracts)?;
    let mut document = Document::default();
    for table in config.outbox.iter() {
        let name = table.display_name();
        let of_table: Vec<&LoadedContract> = contracts
            .iter()
            .filter(|(t, _)| *t == name)
            .map(|(_, c)| Arc::as_ref(c))
            .collect();
        for channel in channels::table(config, table, &of_table)? {
            document.add(channel);
        }
    }
    for route in &config.messages {
        document.add(channels::message_prefix(config, route)?);
    }
    if let Some(subject) = &config.relay.dead_letter_subject {
        document.add(channels::dead_letters(config, subject));
    }
    let mut servers = Map::new();
    servers.insert(SERVER_ID.into(), server(&config.nats)?);
    Ok(json!({
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": format!("outbox-relay: {}", config.nats.stream),
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "What outbox-relay publishes into JetStream stream `{}`: the events its outbox tables and logical decoding messages hold, in commit order, each once per Nats-Msg-Id. Built from the relay's configuration.",
                config.nats.stream
            ),
        },
        "servers": servers,
        "channels": document.channels,
        "operations": document.operations,
        "components": { "messages": document.messages },
    }))
}

/// The channels, operations and messages added so far.
#[derive(Debug, Default)]
struct Document {
    channels: Map<String, Value>,
    operations: Map<String, Value>,
    messages: Map<String, Value>,
}

impl Document {
    /// Adds `channel` under a unique id, its messages to the components, and the operation
    /// that sends to it.
    fn add(&mut self, channel: Channel) {
        let id = unique(&component_key(&channel.id), |id| {
            self.channels.contains_key(id)
        });
        let mut messages = Map::new();
        let mut operation_messages = Vec::new();
        for (key, message) in channel.messages {
            let key = component_key(&key);
            let component = unique(&format!("{id}.{key}"), |c| self.messages.contains_key(c));
            self.messages
                .insert(component.clone(), payload_refs(message, &component));
            messages.insert(
                key.clone(),
                json!({ "$ref": format!("#/components/messages/{component}") }),
            );
            operation_messages.push(json!({ "$ref": format!("#/channels/{id}/messages/{key}") }));
        }
        let mut object = Map::new();
        if let Some(address) = channel.address {
            object.insert("address".into(), address.into());
        }
        object.insert("title".into(), channel.title.clone().into());
        object.insert("description".into(), channel.description.into());
        if !channel.parameters.is_empty() {
            object.insert("parameters".into(), Value::Object(channel.parameters));
        }
        object.insert("messages".into(), Value::Object(messages));
        self.channels.insert(id.clone(), Value::Object(object));
        self.operations.insert(
            format!("send.{id}"),
            json!({
                "action": "send",
                "title": format!("Publish: {}", channel.title),
                "channel": { "$ref": format!("#/channels/{id}") },
                "messages": operation_messages,
            }),
        );
    }
}

/// `message` (the Message Object of component `component`) with each `$ref` of its payload's
/// schema that the schema resolves through its own `$id`s (a contract's bundled files) made a
/// pointer into this document: AsyncAPI tools resolve a `$ref` as a JSON Reference, relative to
/// the document, and do not read `$id`s.
fn payload_refs(mut message: Value, component: &str) -> Value {
    if let Some(schema) = message.pointer_mut("/payload/schema") {
        let at = format!("/components/messages/{component}/payload/schema");
        *schema = outbox_schema::document_refs(schema, &at);
    }
    message
}

/// The Server Object of the first `[nats] url`, without user or password.
fn server(nats: &NatsSettings) -> Result<Value, AsyncApiError> {
    let (scheme, host, pathname) = first_server(&nats.url)
        .ok_or_else(|| AsyncApiError::ServerUrl(relay_core::secret::redact_url(&nats.url)))?;
    let mut description = format!(
        "The NATS server the relay publishes to (the first of [nats] url), JetStream stream `{}`",
        nats.stream
    );
    if let Some(domain) = &nats.domain {
        description.push_str(&format!(" in JetStream domain `{domain}`"));
    }
    if let Some(scheme) = scheme.filter(|s| !s.eq_ignore_ascii_case("nats")) {
        description.push_str(&format!(", reached as `{scheme}://`"));
    }
    description.push('.');
    let mut server = Map::new();
    server.insert("host".into(), host.into());
    if let Some(pathname) = pathname {
        server.insert("pathname".into(), pathname.into());
    }
    server.insert("protocol".into(), "nats".into());
    server.insert("description".into(), description.into());
    Ok(Value::Object(server))
}

/// The scheme, `host[:port]` and path of the first server of a `[nats] url` list, with any
/// `user:password@` left out; `None` when it names no host.
fn first_server(url: &str) -> Option<(Option<&str>, &str, Option<&str>)> {
    let url = url.trim_start();
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) if !scheme.is_empty() && !scheme.contains([',', '@', '/']) => {
            (Some(scheme), rest)
        }
        _ => (None, url),
    };
    // The user part ends at the last `@` of the first URL: a password may hold `,`, `/` or `@`
    // itself, and no part of it may end up in the host. The first URL ends where the next
    // `scheme://` starts.
    let first = match rest.find("://") {
        Some(next) => rest[..next].rfind(',').map_or(rest, |comma| &rest[..comma]),
        None => rest,
    };
    let after_user = first.rfind('@').map_or(first, |at| &first[at + 1..]);
    let end = after_user
        .find([',', '/', '?', '#'])
        .unwrap_or(after_user.len());
    let host = after_user[..end].trim();
    let path = after_user[end..]
        .split([',', '?', '#'])
        .next()
        .filter(|p| p.starts_with('/') && *p != "/");
    (!host.is_empty()).then_some((scheme, host, path))
}

#[cfg(test)]
mod tests;
