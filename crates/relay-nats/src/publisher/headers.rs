//! The headers the publisher puts on each message: the transaction's shared part prepared once
//! (see [`HeaderTemplate`]), the event's own part added per message.

use std::sync::Arc;

use async_nats::HeaderMap;
use async_nats::header::HeaderName;
use bytes::BytesMut;
use relay_core::message::{HEADER_EXPECTED_STREAM, HEADER_MSG_ID, OutboundMessage};

use super::JetStreamPublisher;
use crate::wire::proto;

/// The headers a transaction's events share, in the order they are set:
/// `Nats-Expected-Stream`, then `shared` (a message's first `shared_headers`). With
/// [`own_entries`], the one list both [`JetStreamPublisher::headers`] and the lean path's
/// frames come from; a later entry replaces an earlier one of the same name.
pub(crate) fn shared_entries<'a>(
    stream: &'a str,
    shared: &'a [(Arc<str>, Arc<str>)],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    std::iter::once((HEADER_EXPECTED_STREAM, stream))
        .chain(shared.iter().map(|(name, value)| (&**name, &**value)))
}

/// The headers of one event after the shared ones: `Nats-Msg-Id`, then `own` (the rest of
/// its headers).
pub(crate) fn own_entries<'a>(
    msg: &'a OutboundMessage,
    own: &'a [(Arc<str>, Arc<str>)],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    std::iter::once((HEADER_MSG_ID, msg.event_id.as_str()))
        .chain(own.iter().map(|(name, value)| (&**name, &**value)))
}

/// One header of an [`OutboundMessage`].
type Header = (Arc<str>, Arc<str>);

/// `msg`'s headers split into the shared part and its own.
fn split(msg: &OutboundMessage) -> (&[Header], &[Header]) {
    msg.headers
        .split_at(msg.shared_headers.min(msg.headers.len()))
}

/// Whether `values` are, by pointer, the values of `shared` (the same transaction and table).
fn same_values(values: &[Arc<str>], shared: &[(Arc<str>, Arc<str>)]) -> bool {
    values.len() == shared.len()
        && values
            .iter()
            .zip(shared)
            .all(|(value, (_, next))| Arc::ptr_eq(value, next))
}

/// The lean path's header block start for the current transaction: the version line and the
/// [`shared_entries`] lines, serialised once and copied into each `HPUB`.
#[derive(Default)]
pub(crate) struct WireHeaders {
    values: Vec<Arc<str>>,
    stream: Option<Arc<str>>,
    head: BytesMut,
}

impl WireHeaders {
    /// Appends the `HPUB` of `msg` (into `stream`, replying to `reply`) to `out`.
    pub(crate) fn write_hpub(
        &mut self,
        out: &mut BytesMut,
        stream: &str,
        msg: &OutboundMessage,
        reply: (&str, u64),
    ) {
        let (shared, own) = split(msg);
        if !self.matches(stream, shared) {
            self.values = shared.iter().map(|(_, v)| v.clone()).collect();
            self.stream = Some(stream.into());
            self.head.clear();
            self.head.extend_from_slice(proto::HEADER_VERSION_LINE);
            for (name, value) in shared_entries(stream, shared) {
                proto::put_header_line(&mut self.head, name, value);
            }
        }
        let repeats = own_entries(msg, own).enumerate().any(|(i, (name, _))| {
            shared_entries(stream, shared).any(|(n, _)| n == name)
                || own_entries(msg, own).take(i).any(|(n, _)| n == name)
        });
        if repeats {
            // A name set twice: the later value replaces the earlier, as in a HeaderMap.
            let mut lines: Vec<(&str, &str)> = Vec::new();
            for (name, value) in shared_entries(stream, shared).chain(own_entries(msg, own)) {
                match lines.iter_mut().find(|(n, _)| *n == name) {
                    Some(line) => line.1 = value,
                    None => lines.push((name, value)),
                }
            }
            let len = lines
                .iter()
                .map(|(n, v)| proto::header_line_len(n, v))
                .sum();
            let write = |out: &mut BytesMut| {
                for (name, value) in &lines {
                    proto::put_header_line(out, name, value);
                }
            };
            proto::write_hpub(
                out,
                &msg.subject,
                reply,
                proto::HEADER_VERSION_LINE,
                len,
                write,
                &msg.payload,
            );
            return;
        }
        let len = own_entries(msg, own)
            .map(|(n, v)| proto::header_line_len(n, v))
            .sum();
        let write = |out: &mut BytesMut| {
            for (name, value) in own_entries(msg, own) {
                proto::put_header_line(out, name, value);
            }
        };
        proto::write_hpub(
            out,
            &msg.subject,
            reply,
            &self.head,
            len,
            write,
            &msg.payload,
        );
    }

    fn matches(&self, stream: &str, shared: &[(Arc<str>, Arc<str>)]) -> bool {
        self.stream.as_deref() == Some(stream) && same_values(&self.values, shared)
    }
}

/// `Nats-Expected-Stream` plus a message's shared headers (`OutboundMessage::shared_headers`)
/// as a ready `HeaderMap`: cloning it skips hashing and growing the map for every event, which
/// was a tenth of the relay's CPU. Valid while the next message shares the same `Arc`s.
pub(super) struct HeaderTemplate {
    values: Vec<Arc<str>>,
    /// Made on the transaction's second event: a 1-row transaction builds its map once instead
    /// of building it and cloning it (building headers was ~11 % of the relay's CPU at 1,000
    /// 1-row transactions/s, docs/benchmarks.md).
    headers: Option<HeaderMap>,
}

impl HeaderTemplate {
    pub(super) fn matches(&self, shared: &[(Arc<str>, Arc<str>)]) -> bool {
        same_values(&self.values, shared)
    }
}

/// Header names already checked and converted to async-nats' [`HeaderName`]: `insert(&str, …)`
/// validates and copies the name for every header of every event.
const NAME_CACHE: usize = 32;

/// `Nats-Msg-Id`, converted once.
const MSG_ID: HeaderName = HeaderName::from_static(HEADER_MSG_ID);

/// What [`JetStreamPublisher::headers`] keeps between events, behind one lock.
#[derive(Default)]
pub(super) struct HeaderState {
    pub(super) template: Option<HeaderTemplate>,
    /// At most [`NAME_CACHE`] names (names from `[[messages]]` envelopes can be anything).
    pub(super) names: Vec<(Arc<str>, HeaderName)>,
}

impl HeaderState {
    /// `name` as a `HeaderName`, from the cache when it was seen before; `None` for a name
    /// async-nats refuses (the caller then inserts it as text, as before, to keep its errors).
    fn name(&mut self, name: &str) -> Option<HeaderName> {
        if let Some((_, known)) = self.names.iter().find(|(n, _)| **n == *name) {
            return Some(known.clone());
        }
        let parsed: HeaderName = name.parse().ok()?;
        if self.names.len() < NAME_CACHE {
            self.names.push((name.into(), parsed.clone()));
        }
        Some(parsed)
    }

    /// Inserts `name: value` into `headers` with a cached name.
    fn insert(&mut self, headers: &mut HeaderMap, name: &str, value: &str) {
        if name == HEADER_MSG_ID {
            headers.insert(MSG_ID, value);
            return;
        }
        match self.name(name) {
            Some(name) => headers.insert(name, value),
            None => headers.insert(name, value),
        }
    }
}

impl JetStreamPublisher {
    /// The headers of `msg`: its shared headers from the transaction's template, then its own.
    /// Exactly what [`relay_core::stage::Publisher::send`] puts on the wire; public so consumer
    /// tests publish (and compare against) the relay's real header set instead of a
    /// hand-written copy.
    pub fn headers(&self, msg: &OutboundMessage) -> HeaderMap {
        let (shared, own) = split(msg);
        // A poisoned lock only means a panic elsewhere mid-update: rebuild the template.
        let mut state = self
            .template
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let state = &mut *state;
        let prepared = match state.template.take() {
            Some(t) if t.matches(shared) => Some(t),
            _ => None,
        };
        let (mut headers, template) = match prepared {
            Some(HeaderTemplate {
                values,
                headers: Some(map),
            }) => (
                map.clone(),
                HeaderTemplate {
                    values,
                    headers: Some(map),
                },
            ),
            // The transaction's second event: keep its shared headers for the rest.
            Some(HeaderTemplate {
                values,
                headers: None,
            }) => {
                let map = self.shared_headers(state, shared);
                (
                    map.clone(),
                    HeaderTemplate {
                        values,
                        headers: Some(map),
                    },
                )
            }
            // A new transaction (or table): built once, cached from its second event on.
            None => (
                self.shared_headers(state, shared),
                HeaderTemplate {
                    values: shared.iter().map(|(_, v)| v.clone()).collect(),
                    headers: None,
                },
            ),
        };
        state.template = Some(template);
        for (name, value) in own_entries(msg, own) {
            state.insert(&mut headers, name, value);
        }
        headers
    }

    /// `Nats-Expected-Stream` and `shared`, the headers a transaction's events share.
    fn shared_headers(
        &self,
        state: &mut HeaderState,
        shared: &[(Arc<str>, Arc<str>)],
    ) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in shared_entries(&self.stream, shared) {
            state.insert(&mut headers, name, value);
        }
        headers
    }
}
