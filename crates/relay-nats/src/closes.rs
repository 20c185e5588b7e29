//! Connection closes the server causes on purpose, told apart from outages.
//!
//! nats-server closes a client's connection right after an `-ERR` when what the client sent
//! breaks the protocol: `maximum control line exceeded` (server/parser.go,
//! `overMaxControlLineLimit`), `Maximum Payload Violation` (server/client.go,
//! `maxPayloadViolation`, e.g. an account limit below the `max_payload` INFO announced),
//! `Unknown Protocol Operation` (a parse error). Sent again, the same message is closed on
//! again: async-nats reconnects, the PubAck never comes, the relay re-publishes, forever. A
//! broker outage (stop, crash, network) never comes with such an `-ERR`, so the `-ERR` is what
//! tells "the server refuses this" from "the server is away"; a timing heuristic ("the
//! connection dropped soon after the send") could not, since an outage also drops it then.
//!
//! async-nats reports the `-ERR` and then the disconnect to the connection's event callback, in
//! order ([`crate::connect`]). [`ConnectionWatch::on_event`] turns "protocol `-ERR`, then
//! disconnect" into a *server close* that every publish pending at that moment sees: its outcome
//! is unknown, reported at once as `closed_by_server` instead of after the ack timeout.
//!
//! The server does not say which message it refused, and all messages pending on the closed
//! connection see the close. So a message whose last attempt saw one is a *suspect* and is
//! re-sent alone among suspects ([`Quarantine`]): an innocent one goes through, the culprit
//! meets the close again, and after `[nats] max_server_closes` closes in a row the delivery
//! gives up on it (relay-core `pipeline::deliver`).
//!
//! Each connection has its own watch, fed by its own event callback
//! ([`crate::connection_state::ConnectionState`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedMutexGuard, watch};

/// The one list of the `-ERR`s after which nats-server closes the connection, for both
/// connections.
pub(crate) use nats_wire::is_closing_protocol_error;

/// Default of `[nats] max_server_closes`.
pub(crate) const DEFAULT_MAX_SERVER_CLOSES: u32 = 5;

/// Server closes on one connection.
#[derive(Debug)]
pub(crate) struct ConnectionWatch {
    /// A closing protocol `-ERR` the server sent, until the disconnect that follows it.
    pending: Mutex<Option<Arc<str>>>,
    /// The `-ERR` of the latest server close; every close bumps the version.
    closes: watch::Sender<Arc<str>>,
}

impl ConnectionWatch {
    pub(crate) fn new() -> Self {
        Self {
            pending: Mutex::new(None),
            closes: watch::Sender::new(Arc::from("")),
        }
    }

    /// Follows the connection's events (called in order by the event callback).
    pub(crate) fn on_event(&self, event: &async_nats::Event) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            async_nats::Event::ServerError(async_nats::ServerError::Other(text))
                if is_closing_protocol_error(text) =>
            {
                *pending = Some(text.as_str().into());
            }
            // A reconnect also proves the disconnect, should that event have been dropped.
            async_nats::Event::Disconnected | async_nats::Event::Connected => {
                if let Some(reason) = pending.take() {
                    tracing::warn!(error = %reason, "NATS closed the connection over what the relay sent");
                    self.closes.send_replace(reason);
                }
            }
            _ => {}
        }
    }

    /// A view of server closes from now on (taken before a message is sent).
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<str>> {
        self.closes.subscribe()
    }
}

/// The `-ERR` of the next server close `closes` sees.
pub(crate) async fn next_close(closes: &mut watch::Receiver<Arc<str>>) -> Arc<str> {
    match closes.changed().await {
        Ok(()) => closes.borrow_and_update().clone(),
        // The connection's state is gone: no close can come any more.
        Err(_) => std::future::pending().await,
    }
}

/// Messages whose last attempt saw a server close; one re-send of them at a time.
#[derive(Debug, Default)]
pub(crate) struct Quarantine {
    suspects: Mutex<HashSet<Box<str>>>,
    /// `suspects.len()`, read without the lock on every send.
    count: AtomicUsize,
    probe: Arc<tokio::sync::Mutex<()>>,
}

impl Quarantine {
    /// Whether the last attempt of `event_id` saw a server close.
    pub(crate) fn is_suspect(&self, event_id: &str) -> bool {
        self.count.load(Ordering::Relaxed) > 0 && self.lock().contains(event_id)
    }

    /// Waits for the suspects' turn; hold the guard until the attempt's outcome is known.
    pub(crate) async fn probe(&self) -> OwnedMutexGuard<()> {
        self.probe.clone().lock_owned().await
    }

    /// Records an attempt's outcome: a server close makes `event_id` a suspect, anything else
    /// clears it.
    pub(crate) fn outcome(&self, event_id: &str, closed_by_server: bool) {
        if !closed_by_server && self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut suspects = self.lock();
        if closed_by_server {
            suspects.insert(event_id.into());
        } else {
            suspects.remove(event_id);
        }
        self.count.store(suspects.len(), Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Box<str>>> {
        self.suspects.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_nats::{Event, ServerError};

    use super::*;

    fn server_error(text: &str) -> Event {
        Event::ServerError(ServerError::Other(text.into()))
    }

    #[tokio::test]
    async fn a_protocol_error_then_a_disconnect_is_a_server_close() {
        let watch = ConnectionWatch::new();
        let mut closes = watch.subscribe();
        watch.on_event(&server_error("maximum control line exceeded"));
        assert!(
            !closes.has_changed().expect("open"),
            "not before the disconnect"
        );
        watch.on_event(&Event::Disconnected);
        assert_eq!(
            &*next_close(&mut closes).await,
            "maximum control line exceeded"
        );
        // The reconnect after it is the same close, not a second one.
        watch.on_event(&Event::Connected);
        assert!(!closes.has_changed().expect("open"));
        // A dropped Disconnected event: the reconnect proves it.
        watch.on_event(&server_error("Maximum Payload Violation"));
        watch.on_event(&Event::Connected);
        assert_eq!(&*next_close(&mut closes).await, "Maximum Payload Violation");
    }

    #[tokio::test]
    async fn outages_and_other_errors_are_not_server_closes() {
        let watch = ConnectionWatch::new();
        let mut closes = watch.subscribe();
        // A stopped or unreachable server: disconnects without a protocol -ERR.
        for event in [
            Event::Disconnected,
            Event::Connected,
            server_error("Stale Connection"),
            Event::Disconnected,
            server_error("Permissions Violation for Publish to \"x\""),
            Event::Disconnected,
            Event::ServerError(ServerError::SlowConsumer(1)),
            Event::Connected,
        ] {
            watch.on_event(&event);
        }
        let waited = tokio::time::timeout(Duration::from_millis(50), next_close(&mut closes));
        assert!(waited.await.is_err(), "no server close");
    }

    #[tokio::test]
    async fn suspects_are_re_sent_one_at_a_time() {
        let quarantine = Quarantine::default();
        assert!(!quarantine.is_suspect("a"));
        quarantine.outcome("a", true);
        quarantine.outcome("b", true);
        assert!(quarantine.is_suspect("a") && quarantine.is_suspect("b"));
        assert!(!quarantine.is_suspect("c"), "others are sent at once");
        let first = quarantine.probe().await;
        let second = tokio::time::timeout(Duration::from_millis(50), quarantine.probe());
        assert!(second.await.is_err(), "b waits while a is re-sent");
        quarantine.outcome("a", false);
        drop(first);
        let _second = quarantine.probe().await;
        quarantine.outcome("b", false);
        assert!(!quarantine.is_suspect("a") && !quarantine.is_suspect("b"));
        assert_eq!(quarantine.count.load(Ordering::Relaxed), 0);
    }
}
