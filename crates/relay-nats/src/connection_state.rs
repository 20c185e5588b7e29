//! What the server said about the traffic of one connection (closes after what it sent, and
//! permission denials), shared by the async-nats connection ([`crate::connection`]) and the
//! lean publish connection made from the same settings ([`crate::wire`]).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use relay_core::route::MessageLimits;

use crate::closes::{ConnectionWatch, DEFAULT_MAX_SERVER_CLOSES};

/// How many permission errors a connection remembers (most recent last).
const DENIED_KEEP: usize = 64;

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
            // `$JS.API.…`, or `$JS.<domain>.API.…` with `[nats] domain`.
            .find(|m| {
                m.split("\"$JS.")
                    .skip(1)
                    .any(|rest| rest.starts_with("API.") || rest.split('.').nth(1) == Some("API"))
            })
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
        two.on_event(&denied("$JS.hub.API.STREAM.INFO.OUTBOX"));
        assert!(
            two.js_api_denied_hint()
                .contains("$JS.hub.API.STREAM.INFO.OUTBOX")
        );
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
