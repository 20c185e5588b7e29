//! The PostgreSQL binaries: where they are, which OS user runs them, and how they are run.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use nix::unistd::{Gid, Uid, User, chown};

use super::{PASSWORD, PostgresServer, SUPERUSER};
use crate::ENSURE_DEPS_HINT;

impl PostgresServer {
    pub(super) fn command(&self, program: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(self.bin_dir.join(program));
        cmd.current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env("LC_ALL", "C")
            .env("TZ", "UTC");
        for var in [
            "PGDATA",
            "PGPORT",
            "PGHOST",
            "PGUSER",
            "PGOPTIONS",
            "PGDATABASE",
            "PGPASSWORD",
            "PGCTLTIMEOUT",
        ] {
            cmd.env_remove(var);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd
    }

    pub(super) async fn run(
        &self,
        mut cmd: tokio::process::Command,
        what: &str,
    ) -> anyhow::Result<Output> {
        let output = tokio::time::timeout(Duration::from_secs(90), cmd.output())
            .await
            .map_err(|_| anyhow!("{what}: timed out after 90 s"))?
            .with_context(|| format!("{what}: cannot run it"))?;
        Ok(output)
    }

    /// Runs `initdb` into `target` (which must not exist yet), as the server's OS user.
    pub(super) async fn initdb_into(&self, target: &Path) -> anyhow::Result<()> {
        let pwfile = self.dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{PASSWORD}\n")).context("writing the pwfile")?;
        if let Some((uid, gid)) = self.owner {
            chown(&pwfile, Some(uid), Some(gid)).context("chown pwfile")?;
        }
        let mut cmd = self.command("initdb");
        cmd.arg("-D")
            .arg(target)
            .arg("-U")
            .arg(SUPERUSER)
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(INITDB_ARGS);
        let output = self.run(cmd, "initdb").await?;
        let _ = std::fs::remove_file(&pwfile);
        if !output.status.success() {
            bail!(
                "initdb failed ({}) with {}:\n{}{}\n(if it cannot read its own files, the PostgreSQL \
                 binaries must be readable by the `postgres` OS user)",
                output.status,
                self.bin_dir.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }
}

/// The options every test cluster is made with (part of the template's key).
pub(super) const INITDB_ARGS: [&str; 5] = [
    "--auth-local=trust",
    "--auth-host=scram-sha-256",
    "--encoding=UTF8",
    "--locale=C",
    "--no-sync",
];

/// The OS user PostgreSQL must run as: `postgres` when we are root, else
/// ourselves (`None`).
pub(super) fn server_owner() -> anyhow::Result<Option<(Uid, Gid)>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let user = User::from_name("postgres")
        .context("looking up the `postgres` OS user")?
        .ok_or_else(|| {
            anyhow!(
                "running as root, PostgreSQL must run as the `postgres` OS user, which does not \
                 exist: {ENSURE_DEPS_HINT} (it installs the Debian postgresql package, which \
                 creates it), or `useradd --system postgres`"
            )
        })?;
    Ok(Some((user.uid, user.gid)))
}

pub(super) fn resolve_bin_dir(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let (dir, source) = if let Some(dir) = explicit {
        (dir.to_path_buf(), "PgOptions::bin_dir")
    } else if let Some(dir) = std::env::var_os("RELAY_TEST_PG_BIN").filter(|v| !v.is_empty()) {
        (PathBuf::from(dir), "$RELAY_TEST_PG_BIN")
    } else {
        let newest = newest_debian_bin_dir().ok_or_else(|| {
            anyhow!(
                "PostgreSQL server binaries not found: no /usr/lib/postgresql/*/bin with initdb, \
                 pg_ctl and postgres. {ENSURE_DEPS_HINT}, or set RELAY_TEST_PG_BIN to a \
                 directory holding initdb, pg_ctl and postgres (`scripts/ensure-deps.sh \
                 --new-servers` prints one)"
            )
        })?;
        (newest, "/usr/lib/postgresql/*/bin")
    };
    for tool in ["initdb", "pg_ctl", "postgres"] {
        let path = dir.join(tool);
        let executable = std::fs::metadata(&path)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        if !executable {
            bail!(
                "PostgreSQL binary {} (from {source}) is missing or not executable. \
                 {ENSURE_DEPS_HINT}, or point RELAY_TEST_PG_BIN at a directory holding initdb, \
                 pg_ctl and postgres",
                path.display()
            );
        }
    }
    Ok(dir)
}

/// Whether the PostgreSQL build in `bin_dir` has SSL: its `pg_config --configure` names OpenSSL.
/// Without a `pg_config` there (Debian ships it elsewhere), assume a distribution build with SSL.
pub(super) fn supports_ssl(bin_dir: &Path) -> bool {
    match std::process::Command::new(bin_dir.join("pg_config"))
        .arg("--configure")
        .output()
    {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            text.contains("openssl") || text.contains("--with-ssl")
        }
        _ => true,
    }
}

/// The `bin` directory of the highest major version under
/// `/usr/lib/postgresql` that has all three tools.
pub(super) fn newest_debian_bin_dir() -> Option<PathBuf> {
    let entries = std::fs::read_dir("/usr/lib/postgresql").ok()?;
    let mut versions: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().to_str()?.to_owned();
            let version: Vec<u32> = name
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<_>>()?;
            let bin = e.path().join("bin");
            ["initdb", "pg_ctl", "postgres"]
                .iter()
                .all(|t| bin.join(t).is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}
