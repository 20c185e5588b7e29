//! The NATS JetStream side of outbox-relay.
//!
//! - [`JetStreamPublisher`]: the pipeline's [`relay_core::stage::Publisher`]. Every message
//!   carries `Nats-Msg-Id` = event id, so a re-send inside the stream's `duplicate_window` is
//!   dropped by the server, and `Nats-Expected-Stream`, so a subject captured by some other
//!   stream is refused instead of silently stored elsewhere.
//! - [`prepare_stream`]: at start-up, the stream must exist (or be created when the config
//!   asks), capture every subject the mappings can produce, and not be configured in a way that
//!   loses acknowledged events.

mod published;
mod publisher;
mod settings;
mod stream;

pub use published::published_since;
pub use publisher::JetStreamPublisher;
pub use settings::NatsSettings;
pub use stream::{StreamReport, prepare_stream, subject_matches};

/// Failures talking to NATS outside the publish path.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to NATS at {url} (is nats-server running and reachable?)")]
    Connect {
        /// The configured URL.
        url: String,
        /// Why.
        #[source]
        source: async_nats::ConnectError,
    },
    /// JetStream did not answer (disabled on the server, or no permission for its API).
    #[error(
        "JetStream is not available on {url} ({reason}): start nats-server with -js (or `jetstream {{}}` in its config) and allow the $JS.API.> subjects"
    )]
    JetStreamUnavailable {
        /// The configured URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The configured stream does not exist and creating it is not allowed.
    #[error(
        "JetStream stream `{stream}` does not exist: create it (e.g. `nats stream add {stream} --subjects '{subjects}' --storage file`) or set nats.create_stream = true"
    )]
    StreamMissing {
        /// The stream.
        stream: String,
        /// Subjects it should capture.
        subjects: String,
    },
    /// Looking up or creating the stream failed.
    #[error("cannot look up or create JetStream stream `{stream}`: {reason}")]
    Stream {
        /// The stream.
        stream: String,
        /// Why.
        reason: String,
    },
    /// A subject the mappings produce is not captured by the stream.
    #[error(
        "subject `{subject}` (from outbox table `{table}`) is not captured by stream `{stream}`, whose subjects are [{stream_subjects}]: add it to the stream or change the subject template"
    )]
    SubjectNotCaptured {
        /// A sample subject.
        subject: String,
        /// The table whose mapping produces it.
        table: String,
        /// The stream.
        stream: String,
        /// The stream's subjects.
        stream_subjects: String,
    },
}

/// Connects to NATS with the settings' credentials. Fails fast (no endless retry) so a wrong URL
/// is reported at start-up; once connected, async-nats reconnects by itself.
pub async fn connect(settings: &NatsSettings) -> Result<async_nats::Client, NatsError> {
    let mut options = async_nats::ConnectOptions::new()
        .name("outbox-relay")
        .connection_timeout(settings.connect_timeout)
        // Unbounded reconnects: a broker outage is waited out, never turned into data loss.
        .max_reconnects(None);
    if let Some(path) = &settings.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|source| NatsError::Connect {
                url: settings.url.clone(),
                source: async_nats::ConnectError::with_source(
                    async_nats::ConnectErrorKind::Authentication,
                    source,
                ),
            })?;
    }
    if let (Some(user), Some(password)) = (&settings.user, &settings.password) {
        options = options.user_and_password(user.clone(), password.clone());
    }
    if let Some(token) = &settings.token {
        options = options.token(token.clone());
    }
    // `url` may list several servers of a cluster, comma-separated.
    let addrs = settings
        .url
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| NatsError::Connect {
            url: settings.url.clone(),
            source: async_nats::ConnectError::with_source(
                async_nats::ConnectErrorKind::ServerParse,
                source,
            ),
        })?;
    options
        .connect(addrs)
        .await
        .map_err(|source| NatsError::Connect {
            url: settings.url.clone(),
            source,
        })
}
