//! The `[nats]` section of the relay's configuration.

use std::path::PathBuf;
use std::time::Duration;

use relay_core::secret::{Secret, serialize_url};
use serde::{Deserialize, Serialize};

/// Default JetStream stream name.
pub(crate) const DEFAULT_STREAM: &str = "OUTBOX";
/// Default duplicate window for streams the relay creates.
pub(crate) const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How the relay reaches JetStream and which stream it publishes into. Printed and serialized
/// without secrets: passwords, tokens and seeds as `<redacted>`, a URL's password replaced.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSettings {
    /// Server URL(s), comma-separated. Default `nats://127.0.0.1:4222`.
    #[serde(default = "default_url", serialize_with = "serialize_url")]
    pub url: String,
    /// The stream every message must land in (`Nats-Expected-Stream`). Default `OUTBOX`.
    #[serde(default = "default_stream")]
    pub stream: String,
    /// The JetStream domain that holds `stream` (the `domain` of its servers' `jetstream { }`
    /// block), for a relay connected to a leaf node whose stream lives in the hub's (or
    /// another) domain: management requests go to `$JS.<domain>.API`, and a PubAck from any
    /// other domain is refused. Default: none (the JetStream of the servers at `url`).
    #[serde(default)]
    pub domain: Option<String>,
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
    /// The server's `max_control_line` in bytes: the longest `HPUB <subject> <reply> <sizes>`
    /// line it accepts. The server does not announce it, so set it when the server's differs
    /// from nats-server's default `4096`. A row whose subject would not fit fails closed (or goes
    /// to the dead-letter subject) instead of having the connection closed on every re-send.
    #[serde(default = "default_max_control_line")]
    pub max_control_line: usize,
    /// How many times in a row the server may close the connection right after a message was
    /// sent, each time with a protocol error about it (`-ERR 'maximum control line exceeded'`,
    /// `'Maximum Payload Violation'`), before the message counts as refused for good (exit 65).
    /// Outages never count. Default `5`.
    #[serde(default = "default_max_server_closes")]
    pub max_server_closes: u32,
    /// `per-message` (default): every message on its own. `atomic-batch`: each transaction as
    /// one JetStream atomic batch (nats-server 2.12.1+, a stream with `allow_atomic`), falling
    /// back to per-message with one warning where the server or stream cannot. `fast-batch`:
    /// JetStream fast batches, one flow ack for many messages (nats-server 2.14+, a stream with
    /// `allow_batched`), with the same fallback.
    #[serde(default)]
    pub publish_mode: PublishMode,
    /// `lean` (default): every message of every mode, and every answer, on the relay's own
    /// publishing connection. `async-nats`: publish through the async-nats client alone (the
    /// same connection management uses), for a server or feature the lean path does not handle;
    /// slower, the same guarantees.
    #[serde(default)]
    pub publish_path: PublishPath,
    /// The first tokens of the subjects JetStream answers the relay's publishes and requests on
    /// (`<inbox_prefix>.<unique>.…`). Default `_INBOX`, shared by every client of the account:
    /// any user that may subscribe to the outbox subjects and publish to `_INBOX.>` could answer
    /// for JetStream. A prefix of the relay's own, which only the relay's user may subscribe to
    /// and no user may publish to, makes the answers private (docs/security.md).
    #[serde(default)]
    pub inbox_prefix: Option<String>,
    /// The KV bucket the relay stores each `[outbox.contracts]` schema in (created when
    /// missing), under the key its events' `Outbox-Schema` header names. Default
    /// `outbox-contracts`.
    #[serde(default = "default_contracts_bucket")]
    pub contracts_bucket: String,
    /// NATS `.creds` file (JWT + NKey seed).
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    /// User name (with `password`).
    #[serde(default)]
    pub user: Option<String>,
    /// Password (prefer `password_file` or the `RELAY_NATS__PASSWORD` environment variable).
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding the password (trimmed); overrides `password`.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Token (prefer `token_file` or `RELAY_NATS__TOKEN`).
    #[serde(default)]
    pub token: Option<Secret>,
    /// File holding the token (trimmed); overrides `token`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// NKey seed (`SU...`) to sign the server's nonce with (prefer `nkey_seed_file`).
    #[serde(default)]
    pub nkey_seed: Option<Secret>,
    /// File holding the NKey seed (trimmed); overrides `nkey_seed`.
    #[serde(default)]
    pub nkey_seed_file: Option<PathBuf>,
    /// PEM file of the CA(s) that signed the server certificate (instead of the system's).
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate for TLS client authentication (with `tls_key_file`).
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// Refuse to connect without TLS (also when the server does not ask for it). Default
    /// `false`; TLS is used whenever the server requires it or the URL is `tls://`.
    #[serde(default)]
    pub tls_required: bool,
}

impl NatsSettings {
    /// `url` with any password replaced, for messages.
    pub fn display_url(&self) -> String {
        relay_core::secret::redact_url(&self.url)
    }

    /// `inbox_prefix`, or the shared default `_INBOX`.
    pub fn inbox_prefix(&self) -> &str {
        self.inbox_prefix.as_deref().unwrap_or(SHARED_INBOX_PREFIX)
    }

    /// Why `inbox_prefix` cannot be a subject prefix (with the fix), if it cannot.
    pub fn inbox_prefix_problem(&self) -> Option<String> {
        let prefix = self.inbox_prefix.as_deref()?;
        let bad_token = prefix.split('.').find(|token| {
            token.is_empty()
                || token
                    .chars()
                    .any(|c| c == '*' || c == '>' || c.is_whitespace() || c.is_control())
        });
        bad_token.map(|token| {
            format!(
                "nats.inbox_prefix `{prefix}` is not a subject prefix (token `{token}`): give dot-separated tokens without wildcards or spaces, e.g. `_RELAY_INBOX.orders`"
            )
        })
    }
}

/// The reply-subject prefix every NATS client uses unless told otherwise.
pub const SHARED_INBOX_PREFIX: &str = "_INBOX";

impl std::fmt::Debug for NatsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        relay_core::secret::debug_serialized("NatsSettings", self, f)
    }
}

fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}
fn default_contracts_bucket() -> String {
    outbox_contract::CONTRACTS_BUCKET.into()
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
fn default_max_control_line() -> usize {
    relay_core::route::MessageLimits::DEFAULT_MAX_CONTROL_LINE
}
fn default_max_server_closes() -> u32 {
    crate::closes::DEFAULT_MAX_SERVER_CLOSES
}

/// How messages are published (`[nats] publish_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishMode {
    /// Every message on its own, deduplicated by `Nats-Msg-Id`.
    #[default]
    PerMessage,
    /// Each PostgreSQL transaction as one JetStream atomic batch (ADR-50).
    AtomicBatch,
    /// JetStream fast batches: non-atomic, flow-controlled, acknowledged many messages at a
    /// time (ADR-50 fast ingest).
    FastBatch,
}

impl PublishMode {
    /// Whether each message's answer says whether JetStream dropped it as a duplicate: fast
    /// batches' flow acks cover many messages and do not.
    pub fn reports_duplicates(self) -> bool {
        self != Self::FastBatch
    }

    /// The smallest `[relay] max_in_flight` the mode can work with: a fast batch's first
    /// message waits for a second one before it is sent.
    pub fn min_in_flight(self) -> usize {
        match self {
            Self::FastBatch => 2,
            Self::PerMessage | Self::AtomicBatch => 1,
        }
    }

    /// This mode where every message's duplicate flag must be known (restore counts which
    /// messages the stream had already): per message instead of fast batches.
    pub fn reporting_duplicates(self) -> Self {
        if self.reports_duplicates() {
            self
        } else {
            Self::PerMessage
        }
    }
}

/// Which client publishes (`[nats] publish_path`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PublishPath {
    /// The relay's own publishing connection (`wire`).
    #[default]
    Lean,
    /// The async-nats client.
    AsyncNats,
}

impl Default for NatsSettings {
    fn default() -> Self {
        Self {
            url: default_url(),
            stream: default_stream(),
            domain: None,
            create_stream: false,
            stream_subjects: default_stream_subjects(),
            duplicate_window: default_duplicate_window(),
            ack_timeout: default_ack_timeout(),
            connect_timeout: default_connect_timeout(),
            max_control_line: default_max_control_line(),
            max_server_closes: default_max_server_closes(),
            publish_mode: PublishMode::default(),
            publish_path: PublishPath::default(),
            contracts_bucket: default_contracts_bucket(),
            inbox_prefix: None,
            credentials_file: None,
            user: None,
            password: None,
            password_file: None,
            token: None,
            token_file: None,
            nkey_seed: None,
            nkey_seed_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_required: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inbox_prefix_is_dot_separated_tokens_without_wildcards() {
        let with = |prefix: &str| NatsSettings {
            inbox_prefix: Some(prefix.into()),
            ..NatsSettings::default()
        };
        assert_eq!(NatsSettings::default().inbox_prefix(), "_INBOX");
        assert!(NatsSettings::default().inbox_prefix_problem().is_none());
        for good in ["_RELAY_INBOX", "_INBOX_orders.relay", "a.b.c"] {
            assert!(with(good).inbox_prefix_problem().is_none(), "{good}");
            assert_eq!(with(good).inbox_prefix(), good);
        }
        for bad in ["", "a..b", "a.", ".a", "a.*", "a.>", "has space", "tab\tx"] {
            let problem = with(bad).inbox_prefix_problem();
            assert!(
                problem
                    .as_deref()
                    .is_some_and(|p| p.contains("nats.inbox_prefix")),
                "{bad:?}: {problem:?}"
            );
        }
    }
    use crate::client_auth::{resolved_nkey_seed, resolved_password, resolved_token};

    #[test]
    fn secrets_come_from_files_and_are_never_printed() {
        let dir = std::env::temp_dir().join(format!("relay-nats-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "\n tok-from-file \n").unwrap();
        let s = NatsSettings {
            url: "nats://relay:url-pw@a:4222,nats://relay:url-pw2@b:4222".into(),
            token: Some("tok-inline".into()),
            token_file: Some(file),
            password: Some("pw-inline".into()),
            nkey_seed: Some("SUAseed".into()),
            ..Default::default()
        };
        let exposed = |s: Option<Secret>| s.map(|s| s.expose().to_owned());
        assert_eq!(
            exposed(resolved_token(&s).unwrap()).as_deref(),
            Some("tok-from-file")
        );
        assert_eq!(
            exposed(resolved_password(&s).unwrap()).as_deref(),
            Some("pw-inline")
        );
        let printed = format!(
            "{s:?} {s:#?} {} {:?} {}",
            serde_json::to_string(&s).unwrap(),
            resolved_token(&s).unwrap(),
            s.display_url()
        );
        for secret in [
            "tok-from-file",
            "tok-inline",
            "pw-inline",
            "SUAseed",
            "url-pw",
        ] {
            assert!(!printed.contains(secret), "{printed}");
        }
        assert!(
            printed.contains("\"nkey_seed\":\"<redacted>\""),
            "{printed}"
        );
        let missing = NatsSettings {
            nkey_seed_file: Some(dir.join("nope")),
            ..Default::default()
        };
        let err = resolved_nkey_seed(&missing).unwrap_err().to_string();
        assert!(err.contains("nats.nkey_seed_file"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
