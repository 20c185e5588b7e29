//! The `[nats]` section of the relay's configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default JetStream stream name.
pub const DEFAULT_STREAM: &str = "OUTBOX";
/// Default duplicate window for streams the relay creates.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How the relay reaches JetStream and which stream it publishes into.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSettings {
    /// Server URL(s), comma-separated. Default `nats://127.0.0.1:4222`.
    #[serde(default = "default_url")]
    pub url: String,
    /// The stream every message must land in (`Nats-Expected-Stream`). Default `OUTBOX`.
    #[serde(default = "default_stream")]
    pub stream: String,
    /// Create the stream at start-up when it is missing (file storage, `stream_subjects`,
    /// `duplicate_window`). Default `false`: production streams are provisioned deliberately.
    #[serde(default)]
    pub create_stream: bool,
    /// Subjects of a stream the relay creates. Default `["outbox.>"]`.
    #[serde(default = "default_stream_subjects")]
    pub stream_subjects: Vec<String>,
    /// Duplicate window of a stream the relay creates: re-sends within it are dropped by
    /// `Nats-Msg-Id`. Default `2m`.
    #[serde(default = "default_duplicate_window", with = "humantime_serde")]
    pub duplicate_window: Duration,
    /// How long to wait for one PubAck before the outcome counts as unknown and the message is
    /// re-published. Default `10s`.
    #[serde(default = "default_ack_timeout", with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// Connection timeout at start-up. Default `5s`.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// NATS `.creds` file (JWT + NKey seed).
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// User name (with `password`).
    #[serde(default)]
    pub user: Option<String>,
    /// Password (prefer the `RELAY_NATS__PASSWORD` environment variable).
    #[serde(default)]
    pub password: Option<String>,
    /// Token (prefer `RELAY_NATS__TOKEN`).
    #[serde(default)]
    pub token: Option<String>,
}

impl std::fmt::Debug for NatsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        f.debug_struct("NatsSettings")
            .field("url", &self.url)
            .field("stream", &self.stream)
            .field("create_stream", &self.create_stream)
            .field("stream_subjects", &self.stream_subjects)
            .field("duplicate_window", &self.duplicate_window)
            .field("ack_timeout", &self.ack_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("credentials_file", &self.credentials_file)
            .field("user", &self.user)
            .field("password", &redacted(&self.password))
            .field("token", &redacted(&self.token))
            .finish()
    }
}

fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}
fn default_stream() -> String {
    DEFAULT_STREAM.into()
}
fn default_stream_subjects() -> Vec<String> {
    vec!["outbox.>".into()]
}
fn default_duplicate_window() -> Duration {
    DEFAULT_DUPLICATE_WINDOW
}
fn default_ack_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Default for NatsSettings {
    fn default() -> Self {
        Self {
            url: default_url(),
            stream: default_stream(),
            create_stream: false,
            stream_subjects: default_stream_subjects(),
            duplicate_window: default_duplicate_window(),
            ack_timeout: default_ack_timeout(),
            connect_timeout: default_connect_timeout(),
            credentials_file: None,
            user: None,
            password: None,
            token: None,
        }
    }
}
