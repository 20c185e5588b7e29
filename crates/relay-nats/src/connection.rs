//! One NATS connection and what the relay knows about it beyond what async-nats exposes.
//!
//! [`crate::connect`] makes a [`NatsConnection`]: the async-nats client plus a
//! [`ConnectionState`] that only this connection's event callback feeds. Everything that reads
//! that state — the publisher's limits and server-close watch, permission errors behind a
//! timed-out publish or JetStream API request — reaches it through the connection it asks
//! about, never through process-wide state: two connections in one process (the relay and a
//! test, `status` and a benchmark) see only their own events.

use std::sync::Arc;

use async_nats::jetstream;
use async_nats::jetstream::context::{ContextBuilder, Yes};

use nats_wire::ConnectOptions;

use crate::connection_state::ConnectionState;
use crate::error::NatsError;

/// A connection made by [`crate::connect`]: the client, and the state its events feed.
#[derive(Debug, Clone)]
pub struct NatsConnection {
    client: async_nats::Client,
    state: Arc<ConnectionState>,
    /// How to open the lean publish path's own connection to the same servers
    /// ([`crate::wire`]); `None` for a client made elsewhere.
    lean: Option<Arc<ConnectOptions>>,
    /// `[nats] domain`: the JetStream domain of the stream, which every context made here
    /// addresses (`$JS.<domain>.API`) and every PubAck must name.
    domain: Option<Arc<str>>,
}

impl NatsConnection {
    pub(crate) fn new(
        client: async_nats::Client,
        state: Arc<ConnectionState>,
        lean: Option<Arc<ConnectOptions>>,
    ) -> Self {
        Self {
            client,
            state,
            lean,
            domain: None,
        }
    }

    /// This connection addressing JetStream domain `domain` (`None`: the servers' own).
    #[must_use]
    pub(crate) fn in_domain(mut self, domain: Option<&str>) -> Self {
        self.domain = domain.map(Arc::from);
        self
    }

    /// The JetStream domain its contexts address (`[nats] domain`), if any.
    pub fn domain(&self) -> Option<&Arc<str>> {
        self.domain.as_ref()
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
    pub(crate) fn lean_settings(&self) -> Option<Arc<ConnectOptions>> {
        self.lean.clone()
    }

    /// The async-nats client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// A JetStream context with async-nats' defaults (5 s per API request) on this
    /// connection, in its JetStream domain. Every JetStream request of the relay goes through a
    /// context made here, so none misses `[nats] domain`.
    pub fn jetstream(&self) -> JetStream {
        self.jetstream_with(jetstream::ContextBuilder::new())
    }

    /// A JetStream context built by `builder` on this connection, in its JetStream domain.
    pub(crate) fn jetstream_with(&self, builder: ContextBuilder<Yes>) -> JetStream {
        let client = self.client.clone();
        let context = match &self.domain {
            Some(domain) => builder.domain(domain.as_ref()).build(client),
            None => builder.build(client),
        };
        JetStream {
            context,
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
