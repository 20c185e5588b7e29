//! The NATS JetStream side of outbox-relay.
//!
//! - [`connect`]: a [`NatsConnection`], which carries the `[nats]` limits and follows its own
//!   events (server closes, permission errors); nothing here is process-wide.
//! - [`JetStreamPublisher`]: the pipeline's [`relay_core::stage::Publisher`]. Every message
//!   carries `Nats-Msg-Id` = event id, so a re-send inside the stream's `duplicate_window` is
//!   dropped by the server, and `Nats-Expected-Stream`, so a subject captured by some other
//!   stream is refused instead of silently stored elsewhere.
//! - [`prepare_stream`]: at start-up, the stream must exist (or be created when the config
//!   asks), capture every subject the mappings can produce, and not be configured in a way that
//!   loses acknowledged events.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

mod backfill;
mod client_auth;
mod closes;
mod connection;
mod connection_state;
mod consumer_recreate;
mod consumer_reset;
mod contracts;
mod domain;
mod durability;
mod error;
mod error_codes;
mod header_entries;
mod native;
mod published;
mod publisher;
mod restore;
mod server_features;
mod settings;
mod stream;
mod wire;

use std::sync::Arc;

use client_auth::ClientAuth;
use connection_state::ConnectionState;

pub use backfill::{StreamIds, stream_ids, watch_live};
pub use client_auth::check_files;
pub use connection::{JetStream, NatsConnection};
pub use consumer_recreate::{RecreateError, recreate_consumer, set_filters, skips_unacked};
pub use consumer_reset::{
    ConsumerReset, ConsumerResetError, reset_consumer, supports_consumer_reset,
};
pub use contracts::{ContractsStored, StoredMessage, last_messages, store_contracts};
pub use domain::{DomainMismatch, api_prefix, domain_problem};
pub use durability::{
    Aspect, Durability, DurabilityCheck, DurabilityReport, LazyServer, SYNC_PROBE_SUBJECT,
    ServerSync, Storage, assess_durability,
};
pub use error::NatsError;
pub use native::check_broker_needs;
pub use published::{StreamState, published_between, published_since, scan_headers};
pub use publisher::{ChoiceNote, Framing, JetStreamPublisher, StreamTakes};
pub use restore::RestoreCheck;
pub use settings::{NatsSettings, PublishMode, PublishPath, SHARED_INBOX_PREFIX};
pub use stream::{
    MSG_ID_CONDITION_FAILS_REPLICAS, StreamReport, order_by_sequence, prepare_stream,
    subject_matches,
};

/// Selects rustls' process-wide crypto provider (ring) unless one is already set. async-nats
/// builds its TLS configuration from the process default, and with both ring (through
/// pgwire-replication) and aws-lc-rs (through async-nats) linked in, rustls cannot pick one
/// by itself and panics on the first TLS connection. Idempotent.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread installing one is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Connects to NATS with the settings' credentials. Fails fast (no endless retry) so a wrong URL
/// is reported at start-up; once connected, async-nats reconnects by itself. The connection
/// carries the `[nats]` limits and follows its own events (server closes, permission errors).
pub async fn connect(settings: &NatsSettings) -> Result<NatsConnection, NatsError> {
    install_crypto_provider();
    if settings.max_control_line == 0 || settings.max_server_closes == 0 {
        return Err(NatsError::Settings(
            "nats.max_control_line and nats.max_server_closes must be at least 1".into(),
        ));
    }
    if let Some(problem) = settings.domain.as_deref().and_then(domain_problem) {
        return Err(NatsError::Settings(problem));
    }
    if let Some(problem) = settings.inbox_prefix_problem() {
        return Err(NatsError::Settings(problem));
    }
    let state = Arc::new(ConnectionState::new(
        settings.max_control_line,
        settings.max_server_closes,
    ));
    let events = state.clone();
    let mut options = async_nats::ConnectOptions::new()
        .name("outbox-relay")
        .connection_timeout(settings.connect_timeout)
        // Unbounded reconnects: a broker outage is waited out, never turned into data loss.
        .max_reconnects(None)
        // Every answer (PubAcks, API replies) comes on this prefix: private when the account's
        // permissions make it so (docs/security.md).
        .custom_inbox_prefix(settings.inbox_prefix())
        .event_callback(move |event| {
            let events = events.clone();
            async move { events.on_event(&event) }
        });
    // A file that cannot be read or parsed is a configuration error (78), not an outage; the
    // message names the file, never its contents. Both connections use what is read here.
    let auth = Arc::new(ClientAuth::from_settings(settings)?);
    options = auth.configure(options);
    if settings.tls_required {
        options = options.require_tls(true);
    }
    // `url` may list several servers of a cluster, comma-separated.
    let addrs = settings
        .url
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| NatsError::Connect {
            url: settings.display_url(),
            source: async_nats::ConnectError::with_source(
                async_nats::ConnectErrorKind::ServerParse,
                source,
            ),
        })?;
    let client = options
        .connect(addrs)
        .await
        .map_err(|source| NatsError::Connect {
            url: settings.display_url(),
            source,
        })?;
    // The lean publish path opens its own connection from the same settings, on first use.
    let lean = match wire::options(settings, auth, state.clone()) {
        _ if settings.publish_path == PublishPath::AsyncNats => {
            tracing::info!("publishing through async-nats ([nats] publish_path = \"async-nats\")");
            None
        }
        Ok(lean) => Some(Arc::new(lean)),
        Err(e) => {
            tracing::info!(error = %e, "publishing through async-nats: the lean publish path cannot use these settings");
            None
        }
    };
    Ok(NatsConnection::new(client, state, lean).in_domain(settings.domain.as_deref()))
}
