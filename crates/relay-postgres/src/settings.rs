//! The `[postgres]` section of the relay's configuration.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::PgError;

/// How the relay reaches PostgreSQL and which slot and publication it uses.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSettings {
    /// Connection URL, `postgres://user[:password]@host:port/database`. The role needs the
    /// REPLICATION attribute. Default `postgres://postgres@127.0.0.1:5432/postgres`.
    #[serde(default = "default_url")]
    pub url: String,
    /// Password, overriding any in `url` (prefer `RELAY_POSTGRES__PASSWORD`).
    #[serde(default)]
    pub password: Option<String>,
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
        f.debug_struct("PostgresSettings")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("create_slot", &self.create_slot)
            .field("create_publication", &self.create_publication)
            .field("status_interval", &self.status_interval)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// `url` with any password replaced, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    format!("{}{user}:<redacted>{}", &url[..scheme_end + 3], &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
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
        self.parts().map(|_| ())
    }

    /// tokio-postgres configuration for plain sessions.
    pub fn client_config(&self) -> Result<tokio_postgres::Config, PgError> {
        let mut config = tokio_postgres::Config::from_str(&self.url)
            .map_err(|e| PgError::BadUrl(format!("{}: {e}", redact_url(&self.url))))?;
        if let Some(password) = &self.password {
            config.password(password);
        }
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
}
