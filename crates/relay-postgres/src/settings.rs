//! The `[postgres]` section of the relay's configuration.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

pub use relay_core::secret::redact_url;
use relay_core::secret::{Secret, serialize_url};
use serde::{Deserialize, Serialize};

use crate::PgError;

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

/// Reads a secret file: its contents, trimmed. Errors name the file, never the contents.
pub(crate) fn read_secret_file(what: &str, path: &std::path::Path) -> Result<Secret, PgError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PgError::Settings(format!("cannot read {what} {}: {e}", path.display())))?;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(PgError::Settings(format!(
            "{what} {} is empty",
            path.display()
        )));
    }
    Ok(Secret::from(trimmed))
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
        }
    }
}

/// Checks a slot or publication name: PostgreSQL's rule for slot names (lower-case letters,
/// digits, underscore, at most 63 bytes). pgwire-replication interpolates names into
/// `START_REPLICATION` unquoted, so nothing else may pass.
pub fn validate_identifier(what: &'static str, name: &str) -> Result<(), PgError> {
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

/// The pieces of the URL the replication client needs.
#[derive(Clone)]
pub struct ConnectionParts {
    /// Host name, IP address, or Unix socket directory.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Role.
    pub user: String,
    /// Password (may be empty).
    pub password: String,
    /// Database.
    pub database: String,
}

impl std::fmt::Debug for ConnectionParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionParts")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl PostgresSettings {
    /// Checks names and the URL without connecting.
    pub fn validate(&self) -> Result<(), PgError> {
        validate_identifier("slot", &self.slot)?;
        validate_identifier("publication", &self.publication)?;
        let mode = self.ssl_mode()?;
        if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && self.sslrootcert.is_none() {
            return Err(PgError::Settings(format!(
                "postgres.sslmode = {} needs postgres.sslrootcert (the CA certificate that signed the server's certificate, PEM)",
                mode.as_str()
            )));
        }
        if self.sslcert.is_some() != self.sslkey.is_some() {
            return Err(PgError::Settings(
                "postgres.sslcert and postgres.sslkey must be set together".into(),
            ));
        }
        self.parts().map(|_| ())
    }

    /// The TLS mode in force: `sslmode`, else the URL's, else `prefer`.
    pub fn ssl_mode(&self) -> Result<SslMode, PgError> {
        if let Some(mode) = self.sslmode {
            return Ok(mode);
        }
        let config = tokio_postgres::Config::from_str(&self.url)
            .map_err(|e| PgError::BadUrl(format!("{}: {e}", redact_url(&self.url))))?;
        Ok(match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        })
    }

    /// tokio-postgres configuration for plain sessions.
    pub fn client_config(&self) -> Result<tokio_postgres::Config, PgError> {
        let mut config = tokio_postgres::Config::from_str(&self.url)
            .map_err(|e| PgError::BadUrl(format!("{}: {e}", redact_url(&self.url))))?;
        if let Some(path) = &self.password_file {
            config.password(read_secret_file("postgres.password_file", path)?.expose());
        } else if let Some(password) = &self.password {
            config.password(password.expose());
        }
        config.ssl_mode(match self.ssl_mode()? {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        config.application_name("outbox-relay");
        config.connect_timeout(self.connect_timeout);
        Ok(config)
    }

    /// Host, port, user, password and database for the replication session.
    pub fn parts(&self) -> Result<ConnectionParts, PgError> {
        let config = self.client_config()?;
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            #[cfg(unix)]
            Some(tokio_postgres::config::Host::Unix(p)) => p.to_string_lossy().into_owned(),
            None => "localhost".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let user = config
            .get_user()
            .map(str::to_owned)
            .ok_or_else(|| PgError::BadUrl("postgres.url names no user".into()))?;
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let database = config.get_dbname().unwrap_or(&user).to_owned();
        Ok(ConnectionParts {
            host,
            port,
            user,
            password,
            database,
        })
    }

    /// `host:port/database`, for messages.
    pub fn display_target(&self) -> String {
        match self.parts() {
            Ok(p) => format!("{}:{}/{}", p.host, p.port, p.database),
            Err(_) => redact_url(&self.url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_slot_name_rule() {
        assert!(validate_identifier("slot", "outbox_relay_1").is_ok());
        for bad in [
            "",
            "Outbox",
            "a-b",
            "a b",
            "x'; DROP TABLE t; --",
            &"a".repeat(64),
        ] {
            assert!(validate_identifier("slot", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_are_parsed_and_redacted() {
        let s = PostgresSettings {
            url: "postgres://relay:s3cret@db.example:6543/app".into(),
            ..Default::default()
        };
        let p = s.parts().unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.user.as_str()),
            ("db.example", 6543, "relay")
        );
        assert_eq!(
            (p.password.as_str(), p.database.as_str()),
            ("s3cret", "app")
        );
        assert_eq!(
            redact_url(&s.url),
            "postgres://relay:<redacted>@db.example:6543/app"
        );
        assert!(!format!("{s:?}").contains("s3cret"));
        let with_env_password = PostgresSettings {
            password: Some("fromenv".into()),
            ..s
        };
        assert_eq!(with_env_password.parts().unwrap().password, "fromenv");
        let bad = PostgresSettings {
            url: "not a url".into(),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn secrets_come_from_files_and_are_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "  filesecret\n").unwrap();
        let s = PostgresSettings {
            url: "postgres://relay:urlsecret@db.example/app".into(),
            password: Some("envsecret".into()),
            password_file: Some(file),
            ..Default::default()
        };
        assert_eq!(s.parts().unwrap().password, "filesecret");
        let printed = format!(
            "{s:?} {s:#?} {} {}",
            serde_json::to_string(&s).unwrap(),
            s.display_target()
        );
        for secret in ["filesecret", "urlsecret", "envsecret"] {
            assert!(!printed.contains(secret), "{printed}");
        }
        assert!(
            printed.contains("\"postgres://relay:<redacted>@db.example/app\""),
            "{printed}"
        );
        let missing = PostgresSettings {
            password_file: Some(dir.path().join("nope")),
            ..Default::default()
        };
        assert!(
            missing
                .validate()
                .unwrap_err()
                .to_string()
                .contains("password_file")
        );
        let no_ca = PostgresSettings {
            sslmode: Some(SslMode::VerifyFull),
            ..Default::default()
        };
        assert!(
            no_ca
                .validate()
                .unwrap_err()
                .to_string()
                .contains("sslrootcert")
        );
        let from_url = PostgresSettings {
            url: "postgres://u@h/db?sslmode=require".into(),
            ..Default::default()
        };
        assert_eq!(from_url.ssl_mode().unwrap(), SslMode::Require);
    }
}
