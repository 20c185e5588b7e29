//! A throw-away nats-server.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use nix::sys::signal::Signal;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::procs::{self, Proc, Watchdog};
use crate::{ENSURE_DEPS_HINT, HOST, free_port};

const LOG_TAIL_LINES: usize = 40;
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Options for [`NatsServer::start_with`].
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// Enable JetStream with a file store in [`NatsServer::store_dir`]
    /// (default `true`).
    pub jetstream: bool,
    /// Extra configuration file text (nats-server config syntax), e.g.
    /// `"max_payload: 65536"` or an `accounts { ... }` block. It is written
    /// to a file passed with `-c`; the command-line flags for address, port
    /// and JetStream store directory take precedence over it, so it may also
    /// hold a `jetstream { max_memory_store: ... }` block.
    pub config: Option<String>,
    /// The nats-server binary. Default: `$RELAY_TEST_NATS_SERVER`, else
    /// `nats-server` on `PATH`.
    pub binary: Option<PathBuf>,
    /// Turn on TLS with a server certificate (for `localhost` and `127.0.0.1`) issued by a test
    /// CA the kit makes ([`NatsServer::ca_cert_path`]), and issue a client certificate
    /// ([`NatsServer::client_cert`]).
    pub tls: bool,
    /// With `tls`: require and verify client certificates (`verify: true`).
    pub tls_verify_clients: bool,
}

impl Default for NatsOptions {
    fn default() -> Self {
        Self {
            jetstream: true,
            config: None,
            binary: None,
            tls: false,
            tls_verify_clients: false,
        }
    }
}

/// A new NKey user: `(seed, public key)`, for `authorization { users = [{ nkey: PUBLIC }] }`
/// and a client's `nkey_seed`.
pub fn new_nkey_user() -> anyhow::Result<(String, String)> {
    let pair = nkeys::KeyPair::new_user();
    let seed = pair.seed().map_err(|e| anyhow!("NKey seed: {e}"))?;
    Ok((seed, pair.public_key()))
}

/// A nats-server on `127.0.0.1:<free port>`, by default with JetStream and
/// a file store in its own temporary directory. It runs as a child process
/// of the test; its output goes to a log file (see [`Self::log`]).
#[derive(Debug)]
pub struct NatsServer {
    dir: TempDir,
    store_dir: PathBuf,
    log_path: PathBuf,
    pid_path: PathBuf,
    config_path: Option<PathBuf>,
    binary: PathBuf,
    jetstream: bool,
    port: u16,
    child: Option<Child>,
    version: String,
    ca: Option<crate::TestCa>,
    client_cert: Option<crate::IssuedCert>,
    _watchdog: Option<Watchdog>,
}

impl NatsServer {
    /// Starts a nats-server with JetStream (file store in its own temporary
    /// directory).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(NatsOptions::default()).await
    }

    /// Starts a nats-server on a free port; returns once it sends its `INFO`
    /// line to a client and has logged "Server is ready".
    pub async fn start_with(opts: NatsOptions) -> anyhow::Result<Self> {
        let binary = resolve_binary(opts.binary.as_deref())?;
        let dir = tempfile::Builder::new()
            .prefix("relay-nats-")
            .tempdir()
            .context("creating a temporary directory for nats-server")?;
        let store_dir = dir.path().join("store");
        std::fs::create_dir(&store_dir).context("creating the JetStream store directory")?;
        let mut ca = None;
        let mut client_cert = None;
        let mut config = opts.config.clone();
        if opts.tls {
            let new_ca = crate::TestCa::new(dir.path(), "nats")?;
            let server = new_ca.issue_server(dir.path(), "nats-server", &["localhost", HOST])?;
            client_cert = Some(new_ca.issue_client(dir.path(), "nats-client", "outbox-relay")?);
            let block = format!(
                "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: {}\n  timeout: 5\n}}\n",
                server.cert_path,
                server.key_path,
                new_ca.cert_path(),
                opts.tls_verify_clients
            );
            config = Some(format!("{}\n{block}", config.unwrap_or_default()));
            ca = Some(new_ca);
        }
        let config_path = match &config {
            Some(text) => {
                let path = dir.path().join("nats.conf");
                std::fs::write(&path, format!("# relay-testkit extra config\n{text}\n"))
                    .context("writing nats.conf")?;
                Some(path)
            }
            None => None,
        };
        let pid_path = dir.path().join("nats.pid");
        let watchdog = Watchdog::spawn(&watchdog_script(dir.path(), &pid_path, &binary));
        let mut server = Self {
            store_dir,
            log_path: dir.path().join("nats.log"),
            pid_path,
            config_path,
            binary,
            jetstream: opts.jetstream,
            port: 0,
            child: None,
            version: String::new(),
            ca,
            client_cert,
            _watchdog: watchdog,
            dir,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            server.port = free_port();
            match server.spawn_and_wait().await {
                Ok(()) => return Ok(server),
                Err(StartError::PortInUse(_)) if attempt < 5 => continue,
                Err(StartError::PortInUse(e) | StartError::Other(e)) => return Err(e),
            }
        }
    }

    /// The client port (kept across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{HOST}:{}", self.port)
    }

    /// The test CA's certificate (PEM), when [`NatsOptions::tls`].
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.ca.as_ref().map(crate::TestCa::cert_path)
    }

    /// A client certificate issued by the test CA, when [`NatsOptions::tls`].
    pub fn client_cert(&self) -> Option<&crate::IssuedCert> {
        self.client_cert.as_ref()
    }

    /// The directory passed as `-sd` (nats-server keeps its data in a
    /// `jetstream` subdirectory of it). Kept across restarts.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// SIGKILLs the server and waits (briefly) until it has exited.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| anyhow!("kill9: nats-server is not running"))?;
        kill_and_reap(&mut child)
    }

    /// SIGTERM (a paused server is resumed first), then waits for the exit;
    /// SIGKILL after 10 s. Stopping a server that does not run is not an
    /// error.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(proc) = child.id().and_then(|pid| Proc::get(pid as i32)) {
            let _ = proc.signal(Signal::SIGCONT);
            proc.signal(Signal::SIGTERM)?;
        }
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(status) => {
                status.context("waiting for nats-server to exit")?;
                Ok(())
            }
            Err(_) => {
                kill_and_reap(&mut child)?;
                bail!(
                    "nats-server did not exit within 10 s of SIGTERM; killed it\n\
                     --- server log (tail) ---\n{}",
                    procs::log_tail(&self.log_path, LOG_TAIL_LINES)
                )
            }
        }
    }

    /// SIGSTOPs the server: connections stay open but nothing is answered. Returns once every
    /// thread of it is stopped.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.running_proc("pause")?.pause()
    }

    /// SIGCONTs the server.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.running_proc("resume")?.signal(Signal::SIGCONT)
    }

    /// Starts the server again on the same port with the same store
    /// directory, after [`Self::stop`] or [`Self::kill9`]. Fails if it is
    /// still running.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("start_again: nats-server is still running (stop or kill9 it first)");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            match self.spawn_and_wait().await {
                Ok(()) => return Ok(()),
                Err(StartError::PortInUse(e)) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(StartError::Other(e)) => return Err(e),
            }
        }
    }

    /// The server version from its `INFO` line, e.g. `"2.9.10"`.
    pub fn version(&self) -> String {
        self.version.clone()
    }

    /// Whether the server is at least version `min` (major, minor, patch): for tests of a
    /// feature that newer servers have (a pre-release suffix such as `-beta` is ignored).
    pub fn version_at_least(&self, min: (u64, u64, u64)) -> bool {
        let mut parts = self
            .version
            .trim_start_matches('v')
            .split(['.', '-'])
            .map(|p| p.parse::<u64>().unwrap_or(0));
        let mut next = || parts.next().unwrap_or(0);
        (next(), next(), next()) >= min
    }

    /// The server's log so far (all starts), for debugging failures.
    pub fn log(&self) -> String {
        procs::read_lossy(&self.log_path)
    }

    // ----- internals -----

    fn running_proc(&self, what: &str) -> anyhow::Result<Proc> {
        self.child
            .as_ref()
            .and_then(Child::id)
            .and_then(|pid| Proc::get(pid as i32))
            .ok_or_else(|| anyhow!("{what}: nats-server is not running"))
    }

    async fn spawn_and_wait(&mut self) -> Result<(), StartError> {
        let offset = procs::file_len(&self.log_path);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .context("opening the nats-server log")?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("-a").arg(HOST).arg("-p").arg(self.port.to_string());
        if self.jetstream {
            cmd.arg("-js").arg("-sd").arg(&self.store_dir);
        }
        if let Some(conf) = &self.config_path {
            cmd.arg("-c").arg(conf);
        }
        cmd.current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("cloning the log file handle")?)
            .stderr(log)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        if let Some(pid) = child.id() {
            let _ = std::fs::write(&self.pid_path, format!("{pid}\n"));
        }

        let started = tokio::time::Instant::now();
        let mut info_ok_since: Option<tokio::time::Instant> = None;
        let result = loop {
            if let Some(status) = child.try_wait().context("checking on nats-server")? {
                let new_log = procs::read_from(&self.log_path, offset);
                let msg = anyhow!(
                    "nats-server ({}) on port {} exited during startup ({status})\n\
                     --- server log (tail) ---\n{}",
                    self.binary.display(),
                    self.port,
                    procs::log_tail(&self.log_path, LOG_TAIL_LINES)
                );
                break if new_log.contains("address already in use") {
                    Err(StartError::PortInUse(msg))
                } else {
                    Err(StartError::Other(msg))
                };
            }
            if let Ok(Ok(info)) =
                tokio::time::timeout(Duration::from_secs(1), read_info(self.port)).await
            {
                let since = *info_ok_since.get_or_insert_with(tokio::time::Instant::now);
                let ready_logged =
                    procs::read_from(&self.log_path, offset).contains("Server is ready");
                // The log line may be missing if the extra config sends the
                // log elsewhere; then a working INFO for 2 s is enough.
                if ready_logged || since.elapsed() >= Duration::from_secs(2) {
                    self.version = json_string_field(&info, "version").unwrap_or_default();
                    break Ok(());
                }
            }
            if started.elapsed() >= START_TIMEOUT {
                break Err(StartError::Other(anyhow!(
                    "nats-server ({}) on port {} was not ready within {START_TIMEOUT:?}\n\
                     --- server log (tail) ---\n{}",
                    self.binary.display(),
                    self.port,
                    procs::log_tail(&self.log_path, LOG_TAIL_LINES)
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        match result {
            Ok(()) => {
                self.child = Some(child);
                Ok(())
            }
            Err(e) => {
                let _ = kill_and_reap(&mut child);
                Err(e)
            }
        }
    }
}

impl Drop for NatsServer {
    /// SIGKILL and reap; the directory is removed afterwards. Never panics.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill_and_reap(&mut child);
        }
    }
}

enum StartError {
    PortInUse(anyhow::Error),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for StartError {
    fn from(e: anyhow::Error) -> Self {
        Self::Other(e)
    }
}

fn kill_and_reap(child: &mut Child) -> anyhow::Result<()> {
    child.start_kill().context("SIGKILL nats-server")?;
    let exited = procs::wait_blocking(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)) | Err(_))
    });
    if !exited {
        bail!("nats-server did not exit within 10 s of SIGKILL");
    }
    Ok(())
}

/// Connects and reads the `INFO {...}` line the server sends first.
async fn read_info(port: u16) -> anyhow::Result<String> {
    let stream = TcpStream::connect((HOST, port)).await?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await?;
    if !line.starts_with("INFO ") {
        bail!("unexpected first line from nats-server: {line:?}");
    }
    Ok(line)
}

/// `"name":"value"` from a flat JSON object (good enough for INFO).
fn json_string_field(json: &str, name: &str) -> Option<String> {
    let key = format!("\"{name}\":");
    let rest = json[json.find(&key)? + key.len()..].trim_start();
    let rest = rest.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_owned())
}

fn resolve_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let (path, source) = if let Some(p) = explicit {
        (p.to_path_buf(), "NatsOptions::binary")
    } else if let Some(p) = std::env::var_os("RELAY_TEST_NATS_SERVER").filter(|v| !v.is_empty()) {
        (PathBuf::from(p), "$RELAY_TEST_NATS_SERVER")
    } else {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
            .map(|d| d.join("nats-server"))
            .find(|p| is_executable(p));
        let path = found.ok_or_else(|| {
            anyhow!(
                "nats-server not found on PATH: {ENSURE_DEPS_HINT} (Debian package nats-server), \
                 or set RELAY_TEST_NATS_SERVER to a nats-server binary (`scripts/ensure-deps.sh \
                 --new-servers` prints one)"
            )
        })?;
        return Ok(path);
    };
    if !is_executable(&path) {
        bail!(
            "nats-server binary {} (from {source}) is missing or not executable: \
             {ENSURE_DEPS_HINT}, or point RELAY_TEST_NATS_SERVER at a nats-server binary",
            path.display()
        );
    }
    Ok(path)
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Run by the watchdog if the test process dies without `Drop`.
fn watchdog_script(dir: &Path, pid_path: &Path, binary: &Path) -> String {
    // /proc/PID/comm holds at most 15 bytes of the executable's name.
    let comm: String = binary
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(15).collect())
        .unwrap_or_default();
    format!(
        "p=$(head -n 1 {pid} 2>/dev/null); \
         if [ -n \"$p\" ] && [ \"$(cat /proc/$p/comm 2>/dev/null)\" = {comm} ]; then \
           kill -KILL \"$p\"; fi; rm -rf {dir}",
        pid = procs::sh_quote_path(pid_path),
        comm = procs::sh_quote(&comm),
        dir = procs::sh_quote_path(dir),
    )
}
