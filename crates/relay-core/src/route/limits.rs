//! Whether a routed message fits what the NATS server accepts for one publish.
//!
//! A message over a server limit is not a transient failure: nats-server answers it by closing
//! the connection (control line, `max_payload`) or JetStream refuses it (header block), the same
//! way on every re-send. Checked at route time, such a row is a row-level error like any other
//! bad row: fail closed before its transaction, or the dead-letter subject. The publisher runs
//! the same check before sending (for dead letters, and if the server's limits changed).
//!
//! The rules, from nats-server's source:
//! - **control line** (`server/parser.go`, `overMaxControlLineLimit`): the arguments of
//!   `HPUB <subject> <reply> <hdr_len> <total_len>\r\n`, from the subject to before `\r\n`, at
//!   most `max_control_line` bytes (4096 unless the server sets it; not announced in INFO), else
//!   `-ERR 'maximum control line exceeded'` and the connection is closed. The reply subject is
//!   the JetStream ack inbox the client adds; the header block is not part of the line.
//! - **payload** (`server/client.go`, `processHeaderPub`): header block plus payload
//!   (`total_len`) at most `max_payload` (INFO), else `-ERR 'Maximum Payload Violation'` and the
//!   connection is closed. Headers count here, not in the control line.
//! - **JetStream headers** (`server/stream.go`, `processJetStreamMsg`): a header block longer
//!   than `math.MaxUint16` bytes is refused with error 10097, on every re-send.

use std::fmt;
use std::sync::Arc;

use pgoutput::{Insert, TupleValue};

use super::{PayloadPlan, RelationRoute, RouteError, Router, SubjectPart};
use crate::message::{HEADER_MSG_ID, OutboundMessage};

/// `NATS/1.0\r\n` before the header lines and `\r\n` after them.
const HEADER_FRAMING: usize = 10 + 2;
/// An event id longer than this is cut in error texts (it may be the oversized value).
const EVENT_ID_IN_ERRORS: usize = 80;

/// What the server accepts for one publish, and what the publisher adds to every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLimits {
    /// Header block plus payload, at most (the server's INFO `max_payload`).
    pub max_payload: usize,
    /// The `HPUB` arguments, at most (`[nats] max_control_line`; the server does not say).
    pub max_control_line: usize,
    /// The header block, at most (JetStream's limit).
    pub max_header_block: usize,
    /// Length of the reply subject the publisher adds (the ack inbox); 0 for none.
    pub reply_len: usize,
    /// Bytes of header lines the publisher adds to every message (`Nats-Expected-Stream: …`).
    pub extra_header_bytes: usize,
}

impl MessageLimits {
    /// nats-server's default `max_control_line` (`MAX_CONTROL_LINE_SIZE`).
    pub const DEFAULT_MAX_CONTROL_LINE: usize = 4096;
    /// The longest header block JetStream stores (`math.MaxUint16`).
    pub const JETSTREAM_MAX_HEADER_BYTES: usize = super::header_size::JETSTREAM_MAX_HEADER_BYTES;

    /// No limits known: every message fits.
    pub const NONE: Self = Self {
        max_payload: usize::MAX,
        max_control_line: usize::MAX,
        max_header_block: usize::MAX,
        reply_len: 0,
        extra_header_bytes: 0,
    };

    /// The bytes one header line `<name>: <value>\r\n` takes.
    pub fn header_line_len(name: &str, value: &str) -> usize {
        super::header_size::line_len(name, value)
    }

    /// The header block of `msg` as sent: framing, `Nats-Msg-Id`, the message's headers and the
    /// publisher's. (A repeated name would be sent once; counting it twice only errs on the
    /// safe side.)
    pub fn header_block_len(&self, msg: &OutboundMessage) -> usize {
        HEADER_FRAMING
            + self.extra_header_bytes
            + Self::header_line_len(HEADER_MSG_ID, &msg.event_id)
            + msg
                .headers
                .iter()
                .map(|(name, value)| Self::header_line_len(name, value))
                .sum::<usize>()
    }

    /// The `HPUB` arguments the server measures: `<subject> [<reply>] <hdr_len> <total_len>`.
    pub fn control_line_len(
        &self,
        subject_len: usize,
        header_len: usize,
        total_len: usize,
    ) -> usize {
        let reply = if self.reply_len > 0 {
            self.reply_len + 1
        } else {
            0
        };
        subject_len + 1 + reply + digits(header_len) + 1 + digits(total_len)
    }

    /// Whether `msg` fits, and if not the first limit it breaks, in the order the server
    /// checks them.
    pub fn check(&self, msg: &OutboundMessage) -> Result<(), Oversize> {
        let header_len = self.header_block_len(msg);
        let total = header_len + msg.payload.len();
        let line = self.control_line_len(msg.subject.len(), header_len, total);
        if line > self.max_control_line {
            return Err(Oversize {
                part: Part::Subject,
                limit: Limit::ControlLine,
                size: line,
                max: self.max_control_line,
            });
        }
        if header_len > self.max_header_block {
            return Err(Oversize {
                part: largest_header(msg),
                limit: Limit::HeaderBlock,
                size: header_len,
                max: self.max_header_block,
            });
        }
        if total > self.max_payload {
            let part = if msg.payload.len() >= header_len {
                Part::Payload
            } else {
                largest_header(msg)
            };
            return Err(Oversize {
                part,
                limit: Limit::MaxPayload,
                size: total,
                max: self.max_payload,
            });
        }
        Ok(())
    }
}

fn digits(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn largest_header(msg: &OutboundMessage) -> Part {
    let (mut name, mut len): (Arc<str>, usize) = (HEADER_MSG_ID.into(), msg.event_id.len());
    for (n, v) in &msg.headers {
        if v.len() > len {
            (name, len) = (n.clone(), v.len());
        }
    }
    Part::Header(name)
}

/// The part of a message that is too large.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The subject (through the control line).
    Subject,
    /// The header of this name (the largest one).
    Header(Arc<str>),
    /// The payload.
    Payload,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Subject => f.write_str("subject"),
            Self::Header(name) => write!(f, "header `{name}`"),
            Self::Payload => f.write_str("payload"),
        }
    }
}

/// The limit a message breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The server's `max_control_line`.
    ControlLine,
    /// JetStream's header block limit.
    HeaderBlock,
    /// The server's `max_payload`.
    MaxPayload,
}

/// A message over one of the server's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversize {
    /// What is too large.
    pub part: Part,
    /// Which limit it breaks.
    pub limit: Limit,
    /// The size it would have, in bytes.
    pub size: usize,
    /// The limit, in bytes.
    pub max: usize,
}

impl fmt::Display for Oversize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { size, max, .. } = self;
        match self.limit {
            Limit::ControlLine => write!(
                f,
                "the publish control line would be {size} bytes, over the server's max_control_line of {max} ([nats] max_control_line)"
            ),
            Limit::HeaderBlock => write!(
                f,
                "the header block would be {size} bytes, over JetStream's limit of {max} bytes for a message's headers"
            ),
            Limit::MaxPayload => write!(
                f,
                "headers and payload would be {size} bytes, over the server's max_payload of {max}"
            ),
        }
    }
}

impl std::error::Error for Oversize {}

/// An event id for an error text: cut when it is long (it may be the oversized value).
fn short_id(event_id: &str) -> String {
    match event_id.char_indices().nth(EVENT_ID_IN_ERRORS) {
        Some((cut, _)) => format!("{}…", &event_id[..cut]),
        None => event_id.to_owned(),
    }
}

impl Router {
    /// `msg` (routed from `insert`) when it fits `limits`; otherwise a row-level
    /// [`RouteError::TooLarge`] naming the column that made it too large and the limit.
    pub fn check_limits(
        &self,
        insert: &Insert,
        msg: Option<OutboundMessage>,
        limits: &MessageLimits,
    ) -> Result<Option<OutboundMessage>, RouteError> {
        let Some(msg) = msg else {
            return Ok(None);
        };
        let Err(over) = limits.check(&msg) else {
            return Ok(Some(msg));
        };
        Err(RouteError::TooLarge {
            table: msg.table.to_string(),
            event_id: short_id(&msg.event_id),
            origin: self.blame(insert, &over.part),
            part: over.part.to_string(),
            reason: over.to_string(),
        })
    }

    /// What in the mapping produced `part` of the message routed from `insert`.
    fn blame(&self, insert: &Insert, part: &Part) -> String {
        let Some(RelationRoute::Outbox {
            route: Ok(route), ..
        }) = self.relations.get(&insert.relation_id)
        else {
            return "the row".into();
        };
        let column = |index: usize| format!("column `{}`", route.column_name(index));
        match part {
            // The longest value among the subject's columns.
            Part::Subject => route
                .subject
                .iter()
                .filter_map(SubjectPart::column)
                .max_by_key(|index| match insert.new.values.get(*index) {
                    Some(TupleValue::Text(b)) => b.len(),
                    _ => 0,
                })
                .map_or_else(|| "the subject template".into(), column),
            Part::Header(name) if name.eq_ignore_ascii_case(HEADER_MSG_ID) => {
                column(route.event_id)
            }
            Part::Header(name) => match route.headers.iter().find(|(header, _)| header == name) {
                Some((_, index)) => column(*index),
                // Any other header not the relay's own came from the header object.
                None => match &route.header_object {
                    Some(plan)
                        if !(outbox_contract::is_reserved(name)
                            || outbox_contract::is_relay_owned(name)
                            || plan.cloudevents
                                && name.starts_with(outbox_contract::CE_PREFIX)) =>
                    {
                        format!("{} (member `{name}` of headers_json)", column(plan.index))
                    }
                    _ => "the relay's own headers".into(),
                },
            },
            Part::Payload => match &route.payload {
                PayloadPlan::Column { index, .. } => column(*index),
                PayloadPlan::WholeRow => "the whole row (payload = \"*\")".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests;
