//! The options of a test server, and how they are written into `postgresql.conf` and `pg_hba.conf`.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};

use super::PostgresServer;
use crate::HOST;

/// Options for [`PostgresServer::start_with`].
#[derive(Debug, Clone, Default)]
pub struct PgOptions {
    /// Extra settings, written to `postgresql.conf` after the defaults (so
    /// they override them), e.g. `("wal_sender_timeout", "2s")`. They stay in
    /// force across [`PostgresServer::start_again`].
    pub settings: Vec<(String, String)>,
    /// Directory holding `initdb`, `pg_ctl` and `postgres`. Default:
    /// `$RELAY_TEST_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`.
    pub bin_dir: Option<PathBuf>,
}

/// TLS and authentication set-up for [`PostgresServer::start_secured`].
#[derive(Debug, Clone, Default)]
pub struct PgSecurity {
    /// Turn on TLS (`ssl = on`) with a server certificate issued by a test CA that the kit
    /// makes ([`PostgresServer::ca`]); the certificate names [`Self::tls_server_names`].
    pub tls: bool,
    /// Names in the server certificate. Default (empty): `localhost` and `127.0.0.1`.
    pub tls_server_names: Vec<String>,
    /// Replaces `pg_hba.conf` (e.g. `hostssl all all 127.0.0.1/32 scram-sha-256`). A
    /// `local all all trust` line is always put first, and the kit's own connections
    /// ([`PostgresServer::connect`]) then use the unix socket.
    pub hba: Option<String>,
}

impl PostgresServer {
    pub(super) fn write_settings_only(&self, settings: &[(String, String)]) -> anyhow::Result<()> {
        self.append_settings("", settings.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    pub(super) fn write_settings(&self, extra: &[(String, String)]) -> anyhow::Result<()> {
        let socket_dir = self.dir.path().to_string_lossy().into_owned();
        let defaults: [(&str, &str); 14] = [
            ("listen_addresses", HOST),
            ("unix_socket_directories", &socket_dir),
            ("wal_level", "logical"),
            ("max_wal_senders", "10"),
            ("max_replication_slots", "10"),
            ("wal_sender_timeout", "10s"),
            ("fsync", "off"),
            ("shared_buffers", "32MB"),
            ("dynamic_shared_memory_type", "mmap"),
            ("log_min_messages", "warning"),
            ("log_line_prefix", "%m [%p] "),
            ("lc_messages", "C"),
            ("TimeZone", "UTC"),
            ("logging_collector", "off"),
        ];
        let all = defaults
            .iter()
            .map(|(k, v)| (*k, *v))
            .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        self.append_settings("\n# ---- relay-testkit ----\n", all)
    }

    /// Appends `key = 'value'` lines (names checked, values quoted) after `header` to
    /// postgresql.conf.
    fn append_settings<'a>(
        &self,
        header: &str,
        settings: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> anyhow::Result<()> {
        let mut text = String::from(header);
        for (key, value) in settings {
            if key.is_empty()
                || !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            {
                bail!("invalid PostgreSQL setting name {key:?}");
            }
            let value = value.replace('\\', "\\\\").replace('\'', "''");
            text.push_str(&format!("{key} = '{value}'\n"));
        }
        let conf = self.data_dir.join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .with_context(|| format!("opening {}", conf.display()))?;
        file.write_all(text.as_bytes())
            .with_context(|| format!("writing {}", conf.display()))
    }

    pub(super) fn write_hba(&self, hba: &str) -> anyhow::Result<()> {
        let path = self.data_dir.join("pg_hba.conf");
        std::fs::write(&path, format!("local all all trust\n{hba}\n"))
            .with_context(|| format!("writing {}", path.display()))
    }
}
