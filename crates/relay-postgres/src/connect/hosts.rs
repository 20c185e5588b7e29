//! URL and hosts: the connection URL as tokio-postgres parses it, its host list, binding a
//! session to one host of it (pinning), the plain sessions' [`tokio_postgres::Config`] and the
//! [`ConnectionParts`] the replication session and the login probe need.

use std::str::FromStr;

use relay_core::secret::{read_secret_file, redact_url};

use crate::PgError;
use crate::settings::{PostgresSettings, SslMode, validate_identifier};

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
        if let Some(problem) = self
            .shard
            .as_ref()
            .and_then(crate::shard::ShardSpec::problem)
        {
            return Err(PgError::Settings(problem));
        }
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
        if self.url_config()?.get_target_session_attrs()
            == tokio_postgres::config::TargetSessionAttrs::ReadOnly
        {
            return Err(PgError::Settings(
                "postgres.url asks for target_session_attrs=read-only, but the relay writes its checkpoint and needs the primary: use read-write (or leave it out)".into(),
            ));
        }
        self.parts().map(|_| ())
    }

    /// The URL as tokio-postgres parses it.
    fn url_config(&self) -> Result<tokio_postgres::Config, PgError> {
        tokio_postgres::Config::from_str(&self.url)
            .map_err(|e| PgError::BadUrl(format!("{}: {e}", redact_url(&self.url))))
    }

    /// How many hosts the URL lists (`postgres://h1:p1,h2:p2/db`, or `host=h1,h2`).
    pub(crate) fn host_count(&self) -> Result<usize, PgError> {
        let config = self.url_config()?;
        Ok(config
            .get_hosts()
            .len()
            .max(config.get_hostaddrs().len())
            .max(1))
    }

    /// Whether a session must find the read-write server (the primary) among the URL's hosts:
    /// the URL lists several, or says `target_session_attrs=read-write`. The relay writes its
    /// checkpoint, so with several hosts it always wants the primary, whatever the URL says.
    pub fn wants_primary(&self) -> Result<bool, PgError> {
        Ok(self.host_count()? > 1
            || self.url_config()?.get_target_session_attrs()
                == tokio_postgres::config::TargetSessionAttrs::ReadWrite)
    }

    /// One copy of these settings per host of the URL, in the URL's order, each bound to its
    /// host (and port, and `hostaddr` when given) and asking for a read-write session when the
    /// URL lists several hosts. A single-host URL gives these settings unchanged.
    ///
    /// tokio-postgres tries several hosts itself, but it does not tell which one it connected
    /// to, and every session of the relay must reach the same server: the login probe, the
    /// plain sessions and the replication session (pgwire-replication takes a single host).
    /// So `crate::connect` tries these in turn and hands on the one that answered read-write.
    pub(crate) fn candidates(&self) -> Result<Vec<PostgresSettings>, PgError> {
        let count = self.host_count()?;
        if count == 1 || self.pinned.is_some() {
            return Ok(vec![self.clone()]);
        }
        Ok((0..count)
            .map(|i| PostgresSettings {
                pinned: Some((i, true)),
                ..self.clone()
            })
            .collect())
    }

    /// One copy of these settings per host of a multi-host URL, each bound to its host without
    /// asking for a read-write session: for the preflight, which checks the standbys too. A
    /// single-host URL gives an empty list.
    pub fn each_host(&self) -> Result<Vec<PostgresSettings>, PgError> {
        let count = self.host_count()?;
        if count == 1 || self.pinned.is_some() {
            return Ok(Vec::new());
        }
        Ok((0..count)
            .map(|i| PostgresSettings {
                pinned: Some((i, false)),
                ..self.clone()
            })
            .collect())
    }

    /// Whether these settings are bound to one host of a multi-host URL.
    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// The TLS mode in force: `sslmode`, else the URL's, else `prefer`.
    pub(crate) fn ssl_mode(&self) -> Result<SslMode, PgError> {
        if let Some(mode) = self.sslmode {
            return Ok(mode);
        }
        let config = self.url_config()?;
        Ok(match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        })
    }

    /// tokio-postgres configuration for plain sessions.
    pub(crate) fn client_config(&self) -> Result<tokio_postgres::Config, PgError> {
        let mut config = self.url_config()?;
        if let Some((index, read_write)) = self.pinned {
            config = pin_host(&config, index, read_write);
        }
        if let Some(path) = &self.password_file {
            let password = read_secret_file("postgres.password_file", path)
                .map_err(|e| PgError::Settings(e.to_string()))?;
            config.password(password.expose());
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
            None => config
                .get_hostaddrs()
                .first()
                .map_or_else(|| "localhost".to_owned(), ToString::to_string),
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

    /// `host:port/database`, for messages; `h1:p1,h2:p2/database` for an unbound multi-host URL.
    pub fn display_target(&self) -> String {
        let many = self.pinned.is_none() && self.host_count().is_ok_and(|n| n > 1);
        match (self.parts(), many) {
            (Ok(p), true) => {
                let hosts = self
                    .candidates()
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|c| c.parts().ok())
                    .map(|c| format!("{}:{}", c.host, c.port))
                    .collect::<Vec<_>>()
                    .join(",");
                format!("{hosts}/{}", p.database)
            }
            (Ok(p), false) => format!("{}:{}/{}", p.host, p.port, p.database),
            (Err(_), _) => redact_url(&self.url),
        }
    }
}

/// `config` with only its host number `index` (its `hostaddr` and port too), asking for a
/// read-write session when `read_write`: the host list of a multi-host URL narrowed to the one
/// a session uses. Every other parameter is copied.
fn pin_host(
    config: &tokio_postgres::Config,
    index: usize,
    read_write: bool,
) -> tokio_postgres::Config {
    use tokio_postgres::config::{Host, TargetSessionAttrs};
    let mut pinned = tokio_postgres::Config::new();
    match config.get_hosts().get(index) {
        Some(Host::Tcp(host)) => {
            pinned.host(host);
        }
        #[cfg(unix)]
        Some(Host::Unix(path)) => {
            pinned.host_path(path);
        }
        None => {}
    }
    if let Some(addr) = config.get_hostaddrs().get(index) {
        pinned.hostaddr(*addr);
    }
    // libpq's rule: one port for every host, or one port per host.
    let ports = config.get_ports();
    if let Some(port) = ports.get(index).or_else(|| ports.first()) {
        pinned.port(*port);
    }
    if let Some(user) = config.get_user() {
        pinned.user(user);
    }
    if let Some(password) = config.get_password() {
        pinned.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        pinned.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        pinned.options(options);
    }
    if let Some(name) = config.get_application_name() {
        pinned.application_name(name);
    }
    pinned
        .ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .channel_binding(config.get_channel_binding())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(if read_write {
            TargetSessionAttrs::ReadWrite
        } else {
            TargetSessionAttrs::Any
        });
    if let Some(timeout) = config.get_connect_timeout() {
        pinned.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        pinned.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        pinned.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        pinned.keepalives_retries(retries);
    }
    pinned
}

#[cfg(test)]
mod tests;
