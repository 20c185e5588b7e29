//! One NATS connection and what the relay knows about it beyond what async-nats exposes.
//!
//! [`crate::connect`] makes a [`NatsConnection`]: the async-nats client plus a
//! [`ConnectionState`] that only this connection's event callback feeds. Everything that reads
//! that state — the publisher's limits and server-close watch, permission errors behind a
//! timed-out publish or JetStream API request — reaches it through the connection it asks
//! about, never through process-wide state: two connections in one process (the relay and a
//! test, `status` and a benchmark) see only their own events.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use async_nats::jetstream;
use async_nats::jetstream::context::{ContextBuilder, ToAssign};
use relay_core::route::MessageLimits;

use crate::NatsError;
use crate::closes::{ConnectionWatch, DEFAULT_MAX_SERVER_CLOSES};
use crate::wire::WireSettings;

/// How many permission errors a connection remembers (most recent last).
const DENIED_KEEP: usize = 64;

/// A connection made by [`crate::connect`]: the client, and the state its events feed.
#[derive(Debug, Clone)]
pub struct NatsConnection {
    client: async_nats::Client,
    state: Arc<ConnectionState>,
    /// How to open the lean publish path's own connection to the same servers
    /// ([`crate::wire`]); `None` for a client made elsewhere.
    lean: Option<Arc<WireSettings>>,
}

impl NatsConnection {
    pub(crate) fn new(
        client: async_nats::Client,
        state: Arc<ConnectionState>,
        lean: Option<Arc<WireSettings>>,
    ) -> Self {
        Self {
            client,
            state,
            lean,
        }
    }

    /// A client made elsewhere: the default limits, and no events followed (its event
    /// callback, if any, is not ours), so no server close or permission error is ever seen.
    /// Publishers on it publish through async-nats (there are no settings to open a lean
    /// connection from).
    pub(crate) fn unwatched(client: async_nats::Client) -> Self {
        Self::new(
            client,
            Arc::new(ConnectionState::with_default_limits()),
            None,
        )
    }

    /// The settings of the lean publish connection, if this connection was made from
    /// [`crate::NatsSettings`].
    pub(crate) fn lean_settings(&self) -> Option<Arc<WireSettings>> {
        self.lean.clone()
    }

    pub(crate) fn state(&self) -> &Arc<ConnectionState> {
        &self.state
    }

    /// The async-nats client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// A JetStream context with async-nats' defaults (5 s per API request) on this
    /// connection.
    pub fn jetstream(&self) -> JetStream {
        self.jetstream_with(jetstream::ContextBuilder::new())
    }

    /// A JetStream context built by `builder` on this connection.
    pub(crate) fn jetstream_with<P: ToAssign>(&self, builder: ContextBuilder<P>) -> JetStream {
        JetStream {
            context: builder.build(self.client.clone()),
            state: self.state.clone(),
        }
    }
}

/// A JetStream context together with the state of the connection it runs on, so errors of its
/// API requests can name a permission the server refused.
#[derive(Debug, Clone)]
pub struct JetStream {
    context: jetstream::Context,
    state: Arc<ConnectionState>,
}

impl JetStream {
    /// The async-nats context.
    pub fn context(&self) -> &jetstream::Context {
        &self.context
    }

    pub(crate) fn state(&self) -> &Arc<ConnectionState> {
        &self.state
    }

    /// [`NatsError::Stream`] for `stream`, with the JetStream API permission this connection
    /// was refused, if any, as its hint.
    pub(crate) fn stream_error(&self, stream: &str, reason: impl std::fmt::Display) -> NatsError {
        NatsError::Stream {
            stream: stream.to_owned(),
            reason: reason.to_string(),
            hint: self.state.js_api_denied_hint(),
        }
    }
}

/// The `[nats]` limits a connection was made with, and what its event callback saw.
#[derive(Debug)]
pub(crate) struct ConnectionState {
    /// `[nats] max_control_line`.
    pub(crate) max_control_line: usize,
    /// `[nats] max_server_closes`.
    pub(crate) max_server_closes: u32,
    /// Connection closes the server caused over what was sent.
    pub(crate) closes: ConnectionWatch,
    /// Server errors "Permissions Violation for Publish to ..." (most recent last, bounded).
    /// The server answers a denied publish with such an asynchronous `-ERR` and no reply, so
    /// the publisher would only see PubAck timeouts; it looks here to turn them into a clear,
    /// fatal rejection.
    denied: Mutex<VecDeque<String>>,
}

impl ConnectionState {
    pub(crate) fn new(max_control_line: usize, max_server_closes: u32) -> Self {
        Self {
            max_control_line,
            max_server_closes,
            closes: ConnectionWatch::new(),
            denied: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn with_default_limits() -> Self {
        Self::new(
            MessageLimits::DEFAULT_MAX_CONTROL_LINE,
            DEFAULT_MAX_SERVER_CLOSES,
        )
    }

    /// Follows one event of the connection (called in order by its event callback).
    pub(crate) fn on_event(&self, event: &async_nats::Event) {
        self.closes.on_event(event);
        if let async_nats::Event::ServerError(async_nats::ServerError::Other(message)) = event {
            self.record_server_error(message);
        }
    }

    /// Records a server `-ERR` (of this connection, or of the lean publish connection made
    /// from the same settings).
    pub(crate) fn record_server_error(&self, message: &str) {
        if !message.contains("Permissions Violation for Publish") {
            tracing::warn!(error = %message, "NATS server error");
            return;
        }
        if message.contains("Publish to \"$SYS.") {
            // The durability probe's system-account request, optional in the permissions: the
            // probe reports the setting as unknown and says why.
            tracing::debug!(error = %message, "NATS refused a system-account request");
        } else {
            tracing::error!(error = %message, "NATS refused a publish: the relay's user lacks publish permission");
        }
        let mut denied = self.denied.lock().unwrap_or_else(PoisonError::into_inner);
        if denied.len() >= DENIED_KEEP {
            denied.pop_front();
        }
        denied.push_back(message.to_owned());
    }

    /// The server's permission-violation message for a publish to `subject`, if one was seen.
    pub(crate) fn publish_denied(&self, subject: &str) -> Option<String> {
        let needle = format!("Publish to \"{subject}\"");
        self.denied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .rev()
            .find(|m| m.contains(&needle))
            .cloned()
    }

    /// A hint naming a JetStream API subject the server refused to let this connection publish
    /// to, or nothing: such a refusal otherwise only shows up as a timed-out API request.
    pub(crate) fn js_api_denied_hint(&self) -> String {
        self.denied
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .rev()
            .find(|m| m.contains("\"$JS.API."))
            .map(|m| {
                format!(
                    " (NATS said: {m}; allow that subject in the relay user's publish permissions, see docs/security.md)"
                )
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use async_nats::{Event, ServerError};

    use super::*;

    fn denied(subject: &str) -> Event {
        Event::ServerError(ServerError::Other(format!(
            "Permissions Violation for Publish to \"{subject}\""
        )))
    }

    #[test]
    fn two_connections_see_only_their_own_events() {
        let (one, two) = (
            ConnectionState::with_default_limits(),
            ConnectionState::new(100, 1),
        );
        one.on_event(&denied("outbox.a"));
        one.on_event(&denied("$JS.API.CONSUMER.CREATE.OUTBOX"));
        assert!(one.publish_denied("outbox.a").is_some());
        assert!(
            one.js_api_denied_hint()
                .contains("CONSUMER.CREATE.OUTBOX\"; allow")
        );
        assert_eq!(
            two.publish_denied("outbox.a"),
            None,
            "not seen by the other"
        );
        assert_eq!(two.js_api_denied_hint(), "");
        // Server closes too.
        let (closes_one, closes_two) = (one.closes.subscribe(), two.closes.subscribe());
        one.on_event(&Event::ServerError(ServerError::Other(
            "maximum control line exceeded".into(),
        )));
        one.on_event(&Event::Disconnected);
        assert!(closes_one.has_changed().expect("open"), "a close of one");
        assert!(
            !closes_two.has_changed().expect("open"),
            "not a close of two"
        );
        // And the limits each was made with.
        assert_eq!(
            (one.max_control_line, one.max_server_closes),
            (4096, DEFAULT_MAX_SERVER_CLOSES)
        );
        assert_eq!((two.max_control_line, two.max_server_closes), (100, 1));
    }

    #[test]
    fn denials_are_matched_by_subject_and_bounded() {
        let state = ConnectionState::with_default_limits();
        state.on_event(&denied("$SYS.REQ.SERVER.PING.JSZ"));
        assert!(state.publish_denied("$SYS.REQ.SERVER.PING.JSZ").is_some());
        assert_eq!(state.publish_denied("$SYS.REQ.SERVER.PING"), None);
        assert_eq!(
            state.js_api_denied_hint(),
            "",
            "not a JetStream API subject"
        );
        for i in 0..DENIED_KEEP + 1 {
            state.on_event(&denied(&format!("outbox.{i}")));
        }
        assert_eq!(
            state.publish_denied("outbox.0"),
            None,
            "the oldest is dropped"
        );
        assert!(
            state
                .publish_denied(&format!("outbox.{DENIED_KEEP}"))
                .is_some()
        );
    }
}
