//! The headers the publisher puts on each message: the transaction's shared part prepared once
//! (see [`HeaderTemplate`]), the event's own part added per message.

use std::sync::{Arc, Mutex};

use async_nats::HeaderMap;
use async_nats::header::HeaderName;
use relay_core::message::{HEADER_MSG_ID, OutboundMessage};

use crate::header_entries::{own_entries, same_values, shared_entries, split};

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

/// What [`headers`] keeps between events, behind one lock.
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

/// The headers of `msg` published into `stream`: its shared headers from the transaction's
/// template in `template`, then its own ([`super::JetStreamPublisher::headers`]).
pub(super) fn headers(
    template: &Mutex<HeaderState>,
    stream: &str,
    msg: &OutboundMessage,
) -> HeaderMap {
    let (shared, own) = split(msg);
    // A poisoned lock only means a panic elsewhere mid-update: rebuild the template.
    let mut state = template
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
            let map = shared_headers(stream, state, shared);
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
            shared_headers(stream, state, shared),
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
    stream: &str,
    state: &mut HeaderState,
    shared: &[(Arc<str>, Arc<str>)],
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in shared_entries(stream, shared) {
        state.insert(&mut headers, name, value);
    }
    headers
}
