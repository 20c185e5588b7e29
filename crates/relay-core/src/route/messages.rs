//! The table-free outbox: logical decoding messages (`pg_logical_emit_message`) → JetStream
//! messages.
//!
//! An application calls `pg_logical_emit_message(true, '<prefix>', <content>)` in its
//! transaction (or `outbox_relay.emit_event(...)`, `migrations/0005_emit_outbox_message.sql`).
//! A `[[messages]]` entry ([`MessageRouteConfig`]) names the prefix; the content is a JSON
//! envelope:
//!
//! ```json
//! {"id": "9f0c…", "subject": "outbox.order.created",
//!  "headers": {"Outbox-Event-Type": "created"}, "payload": {"order": 7}}
//! ```
//!
//! - `id` (required): a non-empty string or an integer; it becomes `Nats-Msg-Id`.
//! - `subject`: the whole subject, unless the entry has a `subject` template, whose `{field}`
//!   placeholders take top-level fields of the envelope (strings or numbers) under the token
//!   rule. Either way the subject must match one of the entry's `subjects` filters.
//! - `headers` (optional): an object of string values; `Nats-*` and the relay's own headers
//!   cannot be set.
//! - `payload` (optional): a JSON string is sent as its text, any other JSON value as the
//!   value's JSON text exactly as written in the content; absent or `null`: an empty body.
//!
//! Messages whose prefix no entry names are someone else's: skipped (and counted). A message
//! whose envelope is unusable is a bad row like any other: the relay stops before its
//! transaction, or publishes the raw content to the dead-letter subject. The wire form is
//! documented in `docs/message-format.md`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use pgoutput::{Lsn, Message};
use serde::{Deserialize, Serialize};

use super::build::{Origin, relay_headers};
use super::{MessageLimits, RouteError, Router};
use crate::message::{HEADER_COMMIT_LSN, HEADER_TX_INDEX, HEADER_XID, OutboundMessage, TxContext};
use crate::subject::{SubjectTemplate, TemplateError};
use outbox_contract::HEADER_DLQ_REASON;

mod envelope;

use envelope::{Fields, check_filter, check_subject, envelope_id, fill_template, short};

pub use outbox_contract::HEADER_MESSAGE_PREFIX;

/// Default `subjects` filter: the default stream's subjects.
const DEFAULT_SUBJECTS: &str = "outbox.>";

/// How messages with one prefix become JetStream messages (one `[[messages]]` entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageRouteConfig {
    /// The prefix given to `pg_logical_emit_message`, matched exactly.
    pub prefix: String,
    /// Subject template over the envelope's top-level fields (`outbox.{aggregate}.{type}`);
    /// unset: the envelope's `subject` is the subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Subject filters (NATS wildcards) every subject of this prefix must match; the stream
    /// must capture each. Default `["outbox.>"]`.
    #[serde(default = "default_subjects")]
    pub subjects: Vec<String>,
    /// Publish non-transactional messages (`pg_logical_emit_message(false, …)`), which
    /// PostgreSQL delivers even when the emitting transaction rolls back. Default `false`:
    /// such a message is refused (the relay stops, or dead-letters it).
    #[serde(default)]
    pub allow_non_transactional: bool,
}

fn default_subjects() -> Vec<String> {
    vec![DEFAULT_SUBJECTS.to_owned()]
}

impl MessageRouteConfig {
    /// An entry for `prefix` with every default.
    pub fn with_defaults(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            subject: None,
            subjects: default_subjects(),
            allow_non_transactional: false,
        }
    }

    /// Checks everything that can be checked without a server; returns the parsed template.
    pub fn validate(&self) -> Result<Option<SubjectTemplate>, MessageConfigError> {
        if self.prefix.is_empty() || self.prefix.chars().any(char::is_control) {
            return Err(MessageConfigError::Prefix(self.prefix.clone()));
        }
        if self.subjects.is_empty() {
            return Err(MessageConfigError::NoFilters(self.prefix.clone()));
        }
        for filter in &self.subjects {
            if check_filter(filter).is_err() {
                return Err(MessageConfigError::Filter {
                    prefix: self.prefix.clone(),
                    filter: filter.clone(),
                });
            }
        }
        let Some(template) = &self.subject else {
            return Ok(None);
        };
        let template =
            SubjectTemplate::parse(template).map_err(|source| MessageConfigError::Subject {
                prefix: self.prefix.clone(),
                source,
            })?;
        let sample = template.sample("x");
        if !self
            .subjects
            .iter()
            .any(|f| crate::subject::subject_matches(f, &sample))
        {
            return Err(MessageConfigError::TemplateOutside {
                prefix: self.prefix.clone(),
                template: template.to_string(),
                subjects: self.subjects.join(", "),
            });
        }
        Ok(Some(template))
    }

    /// Subjects of every shape this entry can publish to, for the start-up check that the
    /// stream captures them: the template's sample, or each filter with its wildcards
    /// replaced.
    pub fn sample_subjects(&self) -> Vec<String> {
        if let Some(Ok(template)) = self.subject.as_deref().map(SubjectTemplate::parse) {
            return template.samples("x");
        }
        self.subjects
            .iter()
            .map(|f| {
                f.split('.')
                    .map(|t| if t == "*" || t == ">" { "x" } else { t })
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect()
    }
}

/// A `[[messages]]` entry that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageConfigError {
    /// Empty, or holds control characters.
    #[error("prefix `{}` must be non-empty and hold no control characters", .0.escape_debug())]
    Prefix(String),
    /// Two entries for one prefix.
    #[error("prefix `{0}` is configured twice")]
    Duplicate(String),
    /// No `subjects` filter.
    #[error("prefix `{0}`: `subjects` must list at least one subject filter")]
    NoFilters(String),
    /// A filter that is not a NATS subject filter.
    #[error(
        "prefix `{prefix}`: `{filter}` in `subjects` is not a subject filter (non-empty tokens of printable ASCII, `*` and `>` only as whole tokens, `>` last, no `$` prefix)"
    )]
    Filter {
        /// The prefix.
        prefix: String,
        /// The filter.
        filter: String,
    },
    /// The subject template is refused.
    #[error("prefix `{prefix}`: bad subject template")]
    Subject {
        /// The prefix.
        prefix: String,
        /// Why.
        #[source]
        source: TemplateError,
    },
    /// The template makes subjects none of the filters allow.
    #[error(
        "prefix `{prefix}`: subject template `{template}` makes subjects outside `subjects` ({subjects})"
    )]
    TemplateOutside {
        /// The prefix.
        prefix: String,
        /// The template.
        template: String,
        /// The filters.
        subjects: String,
    },
}

/// One configured prefix, validated.
#[derive(Debug)]
struct MessageRoute {
    config: MessageRouteConfig,
    template: Option<SubjectTemplate>,
    /// `message:<prefix>`, the message's "table" in logs and errors.
    origin: Arc<str>,
    prefix: Arc<str>,
}

/// The configured prefixes.
#[derive(Debug, Default)]
pub(super) struct MessageRoutes {
    routes: HashMap<String, MessageRoute>,
}

/// What the relay does with a message of one prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessagePolicy {
    /// No `[[messages]]` entry names the prefix: not ours, skipped.
    Unconfigured,
    /// Configured; non-transactional messages are refused.
    TransactionalOnly,
    /// Configured, non-transactional messages included.
    AnyMessage,
}

impl Router {
    /// This router with the `[[messages]]` entries.
    pub fn with_messages(
        mut self,
        configs: &[MessageRouteConfig],
    ) -> Result<Self, MessageConfigError> {
        let mut routes = HashMap::with_capacity(configs.len());
        for config in configs {
            let template = config.validate()?;
            if routes.contains_key(&config.prefix) {
                return Err(MessageConfigError::Duplicate(config.prefix.clone()));
            }
            routes.insert(
                config.prefix.clone(),
                MessageRoute {
                    config: config.clone(),
                    template,
                    origin: format!("message:{}", config.prefix).into(),
                    prefix: config.prefix.as_str().into(),
                },
            );
        }
        self.messages = MessageRoutes { routes };
        Ok(self)
    }

    /// What to do with messages of `prefix`.
    pub fn message_policy(&self, prefix: &str) -> MessagePolicy {
        match self.messages.routes.get(prefix) {
            None => MessagePolicy::Unconfigured,
            Some(r) if r.config.allow_non_transactional => MessagePolicy::AnyMessage,
            Some(_) => MessagePolicy::TransactionalOnly,
        }
    }

    /// Routes one logical message of the transaction `tx` (for a non-transactional one, the
    /// context [`non_transactional_context`] made for it) as its event number `tx_index`:
    /// `Ok(None)` when its prefix is not configured. The message is checked against `limits`.
    pub fn route_message(
        &self,
        message: &Message,
        tx: &TxContext,
        tx_index: u64,
        limits: &MessageLimits,
    ) -> Result<Option<OutboundMessage>, RouteError> {
        let Some(route) = self.messages.routes.get(&message.prefix) else {
            return Ok(None);
        };
        let refuse = |problem: String| RouteError::Message {
            prefix: message.prefix.clone(),
            lsn: message.lsn,
            problem,
        };
        if !message.transactional && !route.config.allow_non_transactional {
            return Err(RouteError::NonTransactional {
                prefix: message.prefix.clone(),
                lsn: message.lsn,
            });
        }
        let msg = route.build(message, tx, tx_index).map_err(refuse)?;
        match limits.check(&msg) {
            Ok(()) => Ok(Some(msg)),
            Err(over) => Err(refuse(format!(
                "event {}: the {} is too large to publish: {over}",
                short(&msg.event_id),
                over.part
            ))),
        }
    }

    /// The envelope id of a message, when it has a usable one (for error reports).
    pub fn message_event_id(&self, message: &Message) -> Option<String> {
        let fields = Fields::parse(&message.content).ok()?;
        let id = fields.get("id")?;
        envelope_id(id).ok().map(|id| short(&id))
    }

    /// The dead letter for a message that cannot be routed: its raw content, with why, under
    /// an id made of its prefix and its own LSN (a re-read of the same WAL makes the same id).
    pub fn dead_letter_message(
        &self,
        subject: &str,
        message: &Message,
        tx: &TxContext,
        tx_index: u64,
        reason: &dyn fmt::Display,
    ) -> Option<OutboundMessage> {
        let route = self.messages.routes.get(&message.prefix)?;
        Some(OutboundMessage {
            subject: subject.to_owned(),
            event_id: format!("dlq:message:{}:{}", message.prefix, message.lsn),
            headers: vec![
                (
                    HEADER_DLQ_REASON.into(),
                    super::dead_letter::header_value(reason),
                ),
                (HEADER_MESSAGE_PREFIX.into(), route.prefix.clone()),
                (HEADER_COMMIT_LSN.into(), tx.commit_lsn_text.clone()),
                (HEADER_XID.into(), tx.xid_text.clone()),
                (HEADER_TX_INDEX.into(), tx_index.to_string().into()),
            ],
            shared_headers: 0,
            payload: message.content.clone(),
            table: route.origin.clone(),
            commit_lsn: tx.commit_lsn,
            commit_time_micros: tx.commit_time_micros,
        })
    }
}

/// The context of a non-transactional message, which pgoutput sends outside any transaction:
/// xid 0, its own LSN as the commit LSN (it stands in commit order exactly there: every
/// transaction sent before it committed before that LSN, every one after it later), and the
/// time the relay read it (the message carries no time).
pub fn non_transactional_context(message: &Message) -> TxContext {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let pg_micros = i64::try_from(now)
        .unwrap_or(i64::MAX)
        .saturating_sub(pgoutput::PG_EPOCH_UNIX_MICROS);
    TxContext::new(0, message.lsn, pg_micros)
}

/// The position to confirm once a non-transactional message at `lsn` is acknowledged: `lsn`
/// itself. pgoutput reports a logical message at the *end* of its WAL record (`buf->endptr` in
/// PostgreSQL's `logicalmsg_decode`), which is where the next record starts. A restart at `lsn`
/// skips the message (its record starts before it) and still decodes a transaction whose
/// commit record is the very next one; a restart one byte later would skip that transaction
/// too (`SnapBuildXactNeedsSkip` compares the commit record's start), before its events were
/// acknowledged.
pub fn non_transactional_end(lsn: Lsn) -> Lsn {
    lsn
}

impl MessageRoute {
    fn build(
        &self,
        message: &Message,
        tx: &TxContext,
        tx_index: u64,
    ) -> Result<OutboundMessage, String> {
        let fields = Fields::parse(&message.content)?;
        let event_id = match fields.get("id") {
            Some(id) => envelope_id(id)?,
            None => return Err("the envelope has no `id`".into()),
        };
        let bad_id = |what: &str| format!("event {}: {what}", short(&event_id));
        let subject = match &self.template {
            Some(template) => fill_template(template, &fields).map_err(|e| bad_id(&e))?,
            None => {
                let raw = fields.get("subject").ok_or_else(|| {
                    bad_id(
                        "the envelope has no `subject` (and [[messages]] sets no subject template)",
                    )
                })?;
                let subject: String = serde_json::from_str(raw.get())
                    .map_err(|_| bad_id("`subject` is not a string"))?;
                check_subject(&subject).map_err(|why| {
                    bad_id(&format!("subject `{}` {why}", subject.escape_debug()))
                })?;
                subject
            }
        };
        if !self
            .config
            .subjects
            .iter()
            .any(|f| crate::subject::subject_matches(f, &subject))
        {
            return Err(bad_id(&format!(
                "subject `{}` matches none of `subjects` ({}) of this prefix",
                subject.escape_debug(),
                self.config.subjects.join(", ")
            )));
        }

        let mut headers =
            relay_headers(tx, Origin::MessagePrefix(self.prefix.clone()), tx_index, 1);
        if let Some(raw) = fields.get("headers").filter(|r| r.get() != "null") {
            super::json::expand_headers(raw.get(), &mut headers, &|_| false)
                .map_err(|e| bad_id(&format!("`headers`: {e}")))?;
        }

        let payload = match fields.get("payload").map(|r| r.get()) {
            None | Some("null") => Bytes::new(),
            Some(text) if text.starts_with('"') => {
                let s: String =
                    serde_json::from_str(text).map_err(|e| bad_id(&format!("`payload`: {e}")))?;
                Bytes::from(s.into_bytes())
            }
            Some(text) => Bytes::copy_from_slice(text.as_bytes()),
        };

        Ok(OutboundMessage {
            subject,
            event_id,
            headers,
            shared_headers: super::build::SHARED_HEADERS,
            payload,
            table: self.origin.clone(),
            commit_lsn: tx.commit_lsn,
            commit_time_micros: tx.commit_time_micros,
        })
    }
}

#[cfg(test)]
mod tests;
