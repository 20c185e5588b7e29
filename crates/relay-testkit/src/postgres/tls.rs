//! TLS for a test server: the test CA, the server certificate and client certificates.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use anyhow::{Context as _, anyhow};
use nix::unistd::chown;

use super::PostgresServer;
use crate::HOST;

impl PostgresServer {
    /// The test CA that issued the server certificate (when [`PgSecurity::tls`]).
    ///
    /// [`PgSecurity::tls`]: super::PgSecurity::tls
    pub fn ca(&self) -> Option<&crate::TestCa> {
        self.ca.as_ref()
    }

    /// The CA certificate (PEM) to give clients as `sslrootcert` (when [`PgSecurity::tls`]).
    ///
    /// [`PgSecurity::tls`]: super::PgSecurity::tls
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.ca.as_ref().map(crate::TestCa::cert_path)
    }

    /// Issues a client certificate with common name `cn` (the role, for pg_hba `cert`) from
    /// the test CA, into [`Self::work_dir`] as `<cn>.crt` and `<cn>.key` (when
    /// [`PgSecurity::tls`]).
    ///
    /// [`PgSecurity::tls`]: super::PgSecurity::tls
    pub fn issue_client_cert(&self, cn: &str) -> anyhow::Result<crate::IssuedCert> {
        let ca = self
            .ca
            .as_ref()
            .ok_or_else(|| anyhow!("issue_client_cert: this server was started without TLS"))?;
        ca.issue_client(self.dir.path(), &format!("client-{cn}"), cn)
    }

    pub(super) fn write_tls(&mut self, names: &[String]) -> anyhow::Result<()> {
        let dir = self.dir.path();
        let ca = crate::TestCa::new(dir, "postgres")?;
        let names: Vec<&str> = if names.is_empty() {
            vec!["localhost", HOST]
        } else {
            names.iter().map(String::as_str).collect()
        };
        let issued = ca.issue_server(dir, "server", &names)?;
        // PostgreSQL insists on a private key only its owner can read.
        std::fs::set_permissions(&issued.key_path, std::fs::Permissions::from_mode(0o600))
            .context("chmod 600 server.key")?;
        if let Some((uid, gid)) = self.owner {
            for path in [&issued.cert_path, &issued.key_path] {
                chown(path, Some(uid), Some(gid))
                    .with_context(|| format!("chown {}", path.display()))?;
            }
        }
        let settings = [
            ("ssl".to_owned(), "on".to_owned()),
            (
                "ssl_cert_file".to_owned(),
                issued.cert_path.to_string_lossy().into_owned(),
            ),
            (
                "ssl_key_file".to_owned(),
                issued.key_path.to_string_lossy().into_owned(),
            ),
            // Client certificates issued by the same CA are accepted (pg_hba `cert`); without
            // a `cert` line the server asks for one but does not insist.
            (
                "ssl_ca_file".to_owned(),
                ca.cert_path().to_string_lossy().into_owned(),
            ),
        ];
        self.write_settings_only(&settings)?;
        self.ca = Some(ca);
        Ok(())
    }
}
