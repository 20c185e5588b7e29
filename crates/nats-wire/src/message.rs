//! What the connection publishes: any message type, read through a [`Framing`]; and the one
//! order of header lines every JetStream publish of the relay carries.

use std::sync::Arc;

use bytes::Bytes;
use outbox_contract::{HEADER_EXPECTED_STREAM, HEADER_MSG_ID};

/// One header: name and value. Runs of messages share the `Arc`s of their common headers, which
/// lets the connection serialise those lines once per run.
pub type Header = (Arc<str>, Arc<str>);

/// How the connection reads a message of type [`Framing::Message`]: a type of the caller's, so
/// the connection keeps the caller's own `Arc` of each outstanding message and copies nothing.
pub trait Framing: Send + Sync + 'static {
    type Message: Send + Sync + 'static;

    fn subject(msg: &Self::Message) -> &str;
    /// The `Nats-Msg-Id`: JetStream drops a re-send of the same id within its duplicate window.
    fn msg_id(msg: &Self::Message) -> &str;
    /// The headers this message shares with the ones around it (a transaction's), compared by
    /// pointer: while they are the same `Arc`s their lines are not serialised again.
    fn shared_headers(msg: &Self::Message) -> &[Header];
    /// Its own headers, after the shared ones.
    fn own_headers(msg: &Self::Message) -> &[Header];
    fn payload(msg: &Self::Message) -> &[u8];
}

/// A message owned by the connection's caller in the simplest form, with its [`Framing`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlainMessage {
    pub subject: String,
    pub msg_id: String,
    /// The first `shared` of `headers` are shared with the messages around it.
    pub headers: Vec<Header>,
    pub shared: usize,
    pub payload: Bytes,
}

impl PlainMessage {
    /// A message with no header but its id.
    pub fn new(subject: &str, msg_id: &str, payload: Bytes) -> Self {
        Self {
            subject: subject.into(),
            msg_id: msg_id.into(),
            headers: Vec::new(),
            shared: 0,
            payload,
        }
    }
}

/// The [`Framing`] of [`PlainMessage`].
#[derive(Debug)]
pub struct Plain;

impl Framing for Plain {
    type Message = PlainMessage;

    fn subject(msg: &PlainMessage) -> &str {
        &msg.subject
    }

    fn msg_id(msg: &PlainMessage) -> &str {
        &msg.msg_id
    }

    fn shared_headers(msg: &PlainMessage) -> &[Header] {
        &msg.headers[..msg.shared.min(msg.headers.len())]
    }

    fn own_headers(msg: &PlainMessage) -> &[Header] {
        &msg.headers[msg.shared.min(msg.headers.len())..]
    }

    fn payload(msg: &PlainMessage) -> &[u8] {
        &msg.payload
    }
}

/// The header lines a run of messages into `stream` share, in the order they are set:
/// `Nats-Expected-Stream`, then `shared`. With [`own_lines`], the one list every publish path
/// sends; a later line replaces an earlier one of the same name.
#[inline]
pub fn shared_lines<'a>(
    stream: &'a str,
    shared: &'a [Header],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    std::iter::once((HEADER_EXPECTED_STREAM, stream))
        .chain(shared.iter().map(|(name, value)| (&**name, &**value)))
}

/// The header lines of one message after the shared ones: `Nats-Msg-Id`, then `own`.
#[inline]
pub fn own_lines<'a>(
    msg_id: &'a str,
    own: &'a [Header],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    std::iter::once((HEADER_MSG_ID, msg_id))
        .chain(own.iter().map(|(name, value)| (&**name, &**value)))
}

/// Whether `values` are, by pointer, the values of `shared` (the same run of messages).
#[inline]
pub fn same_values(values: &[Arc<str>], shared: &[Header]) -> bool {
    values.len() == shared.len()
        && values
            .iter()
            .zip(shared)
            .all(|(value, (_, next))| Arc::ptr_eq(value, next))
}
