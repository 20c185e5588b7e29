//! The `[postgres]` section of the relay's configuration: what it holds and its defaults. What
//! the URL says (hosts, TLS mode, the session's configuration) is read in [`crate::connect`].

use std::path::PathBuf;
use std::time::Duration;

pub use relay_core::secret::redact_url;
use relay_core::secret::{Secret, serialize_url};
use serde::{Deserialize, Serialize};

use crate::PgError;

mod failover;
pub(crate) use failover::FAILOVER_SLOTS_SINCE;
pub use failover::FailoverSetting;

/// How the relay reaches PostgreSQL and which slot and publication it uses. Printed and
/// serialized without secrets: the password as `<redacted>`, the URL with its password
/// replaced.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSettings {
    /// Connection URL, `postgres://user[:password]@host:port/database`. The role needs the
    /// REPLICATION attribute. Default `postgres://postgres@127.0.0.1:5432/postgres`.
    #[serde(default = "default_url", serialize_with = "serialize_url")]
    pub url: String,
    /// Password, overriding any in `url` (prefer `RELAY_POSTGRES__PASSWORD` or `password_file`).
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding the password (trimmed); overrides `password` and the URL's.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// TLS mode, as libpq's `sslmode`: `disable`, `prefer`, `require`, `verify-ca`,
    /// `verify-full`. Default: the URL's `sslmode`, else `prefer`.
    #[serde(default)]
    pub sslmode: Option<SslMode>,
    /// PEM file of the CA(s) that signed the server certificate; required for `verify-ca` and
    /// `verify-full`.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// PEM client certificate (chain) for certificate authentication (with `sslkey`).
    #[serde(default)]
    pub sslcert: Option<PathBuf>,
    /// PEM private key of `sslcert`.
    #[serde(default)]
    pub sslkey: Option<PathBuf>,
    /// Allow answering a server that asks for a cleartext (`password`) or MD5 password.
    /// Default `false`: the relay refuses and exits, since such a password can be captured or
    /// replayed; use SCRAM (`password_encryption = scram-sha-256`).
    #[serde(default)]
    pub allow_insecure_password: bool,
    /// Logical replication slot (pgoutput). Default `outbox_relay`.
    #[serde(default = "default_name")]
    pub slot: String,
    /// Publication the slot reads through. Default `outbox_relay`.
    #[serde(default = "default_name")]
    pub publication: String,
    /// Create the slot when missing (never when a checkpoint for it exists). Default `true`.
    #[serde(default = "default_true")]
    pub create_slot: bool,
    /// Create the publication (`FOR TABLE <outbox tables> WITH (publish = 'insert')`) when
    /// missing. Default `true`.
    #[serde(default = "default_true")]
    pub create_publication: bool,
    /// Longest gap between standby status updates to the server. Default `10s`.
    #[serde(default = "default_status_interval", with = "humantime_serde")]
    pub status_interval: Duration,
    /// Connection timeout. Default `10s`.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Create the slot as a failover slot (PostgreSQL 17+), so that a standby synchronizes it
    /// and the relay continues on the standby after a promotion: `auto` (the default: on where
    /// the server supports it), `true` (refused below PostgreSQL 17), `false`.
    #[serde(default)]
    pub failover: FailoverSetting,
    /// This relay's shard when N relays share one outbox (PostgreSQL 15+): its publication
    /// keeps, by a row filter, the rows whose `key` hashes to `index` of `count`
    /// ([`crate::shard`], docs/scaling.md). Off unless set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::ShardSpec>,
    /// The host of `url` this session is bound to (an index into its host list, and whether a
    /// read-write session is required there), once the read-write server among several was
    /// found (`candidates`, in `crate::connect`). Never configured.
    #[serde(skip)]
    pub(crate) pinned: Option<(usize, bool)>,
}

impl std::fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        relay_core::secret::debug_serialized("PostgresSettings", self, f)
    }
}

/// TLS modes, with libpq's names and meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, without verifying the certificate; else plain.
    Prefer,
    /// TLS, certificate not verified.
    Require,
    /// TLS, certificate chain verified against `sslrootcert`, host name not checked.
    VerifyCa,
    /// TLS, chain verified and the certificate must name the host in the URL.
    VerifyFull,
}

impl SslMode {
    /// The libpq name.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a plain connection is refused.
    pub fn requires_tls(self) -> bool {
        !matches!(self, SslMode::Disable | SslMode::Prefer)
    }
}

fn default_url() -> String {
    "postgres://postgres@127.0.0.1:5432/postgres".into()
}
fn default_name() -> String {
    "outbox_relay".into()
}
fn default_true() -> bool {
    true
}
fn default_status_interval() -> Duration {
    Duration::from_secs(10)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}

impl Default for PostgresSettings {
    fn default() -> Self {
        Self {
            url: default_url(),
            password: None,
            password_file: None,
            sslmode: None,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            allow_insecure_password: false,
            slot: default_name(),
            publication: default_name(),
            create_slot: true,
            create_publication: true,
            status_interval: default_status_interval(),
            connect_timeout: default_connect_timeout(),
            failover: FailoverSetting::Auto,
            shard: None,
            pinned: None,
        }
    }
}

/// Checks a slot or publication name: PostgreSQL's rule for slot names (lower-case letters,
/// digits, underscore, at most 63 bytes). pgwire-replication interpolates names into
/// `START_REPLICATION` unquoted, so nothing else may pass.
pub(crate) fn validate_identifier(what: &'static str, name: &str) -> Result<(), PgError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(PgError::InvalidName {
            what,
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests;
