//! Harness for end-to-end tests: a real PostgreSQL (wal_level=logical) and a real
//! `nats-server -js` per test, the real `outbox-relay` binary as a child process, and helpers to
//! read the stream back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use relay_testkit::{NatsServer, PostgresServer};

/// The database every test uses.
pub const DB: &str = "app";
/// The stream every test publishes into.
pub const STREAM: &str = "OUTBOX";

/// The migrations shipped in `migrations/`.
pub fn migrations() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("migrations dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("migration"))
        .collect()
}

/// A PostgreSQL and a NATS server for one test, with the migrations applied to `app`.
pub struct Env {
    pub pg: PostgresServer,
    pub nats: NatsServer,
    pub dir: tempfile::TempDir,
}

impl Env {
    pub async fn start() -> Result<Self> {
        Self::start_with_pg(relay_testkit::PgOptions::default()).await
    }

    pub async fn start_with_pg(options: relay_testkit::PgOptions) -> Result<Self> {
        Self::start_with(options, relay_testkit::NatsOptions::default()).await
    }

    /// Servers started with `pg` and `nats` options.
    pub async fn start_with(
        pg: relay_testkit::PgOptions,
        nats: relay_testkit::NatsOptions,
    ) -> Result<Self> {
        let (pg, nats) =
            tokio::try_join!(PostgresServer::start_with(pg), NatsServer::start_with(nats))?;
        Self::with_servers(pg, nats).await
    }

    /// A new PostgreSQL beside `nats`, a server the test started (a leaf node, say).
    pub async fn start_on_nats(nats: NatsServer) -> Result<Self> {
        let pg = PostgresServer::start().await?;
        Self::with_servers(pg, nats).await
    }

    /// `pg` with the migrations applied to `app`, and `nats`.
    async fn with_servers(pg: PostgresServer, nats: NatsServer) -> Result<Self> {
        pg.create_database(DB).await?;
        let client = pg.connect(DB).await?;
        for sql in migrations() {
            client.batch_execute(&sql).await?;
        }
        Ok(Self {
            pg,
            nats,
            dir: tempfile::tempdir()?,
        })
    }

    pub async fn db(&self) -> Result<tokio_postgres::Client> {
        self.pg.connect(DB).await
    }

    /// A relay config: the default outbox mapping unless `outbox` is given, fast checkpoints.
    pub fn config(&self, extra: &str) -> PathBuf {
        self.config_full("create_stream = true", extra)
    }

    /// A relay config with `nats_extra` lines in `[nats]` and `extra` at the end.
    pub fn config_full(&self, nats_extra: &str, extra: &str) -> PathBuf {
        let text = format!(
            r#"
[postgres]
url = "{pg}"
slot = "relay_slot"
publication = "relay_pub"
status_interval = "1s"

[nats]
url = "{nats}"
stream = "{STREAM}"
ack_timeout = "3s"
{nats_extra}

[relay]
checkpoint_interval = "100ms"
idle_checkpoint_interval = "1s"
reconnect_max = "1s"
{extra}
"#,
            pg = self.pg.url(DB),
            nats = self.nats.url(),
        );
        let path = self
            .dir
            .path()
            .join(format!("relay-{}.toml", fastrand_suffix()));
        std::fs::write(&path, text).expect("write config");
        path
    }

    pub async fn jetstream(&self) -> Result<jetstream::Context> {
        let client = async_nats::connect(self.nats.url()).await?;
        Ok(jetstream::new(client))
    }

    /// The slot's confirmed_flush_lsn as a number.
    pub async fn slot_confirmed(&self) -> Result<Option<u64>> {
        let row = self
            .db()
            .await?
            .query_opt(
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = 'relay_slot'",
                &[],
            )
            .await?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    /// `pg_current_wal_lsn()` as a number.
    pub async fn current_wal(&self) -> Result<u64> {
        let row = self
            .db()
            .await?
            .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
            .await?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// The pid of the walsender streaming the slot (`active_pid`), `None` while nobody streams it.
    pub async fn slot_active_pid(&self) -> Result<Option<i32>> {
        let row = self
            .db()
            .await?
            .query_opt(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'relay_slot'",
                &[],
            )
            .await?;
        Ok(row.and_then(|r| r.get(0)))
    }

    /// The stored checkpoint as a number.
    pub async fn checkpoint(&self) -> Result<Option<u64>> {
        let row = self
            .db()
            .await?
            .query_opt(
                "SELECT (confirmed_lsn - '0/0')::bigint FROM outbox_relay.checkpoint WHERE slot_name = 'relay_slot'",
                &[],
            )
            .await?;
        Ok(row.map(|r| r.get::<_, i64>(0) as u64))
    }

    /// Waits until the relay's stored checkpoint is at or past `lsn`; returns it.
    pub async fn wait_checkpoint(&self, lsn: u64, within: Duration) -> Result<u64> {
        let deadline = Instant::now() + within;
        loop {
            let checkpoint = self.checkpoint().await?.unwrap_or(0);
            if checkpoint >= lsn {
                return Ok(checkpoint);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the checkpoint stayed at {checkpoint:X}, before {lsn:X}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn fastrand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The relay binary as a child process; killed on drop.
pub struct Relay {
    child: Child,
    log: PathBuf,
}

impl Relay {
    pub fn start(config: &Path) -> Result<Self> {
        Self::start_with_args(config, &["run"])
    }

    pub fn start_with_args(config: &Path, args: &[&str]) -> Result<Self> {
        Self::start_with_env(config, args, &[])
    }

    /// Starts the relay with extra environment variables (e.g. `RELAY_FAILPOINT`).
    pub fn start_with_env(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let log = config.with_extension(format!("{}.log", fastrand_suffix()));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(relay_bin())
            .arg("--config")
            .arg(config)
            .args(args)
            .env("RUST_LOG", "info,relay_core=debug")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .context("spawn outbox-relay")?;
        Ok(Self { child, log })
    }

    /// Starts the relay and waits (30 s at most) until its replication stream has started.
    pub async fn start_streaming(config: &Path) -> Result<Self> {
        let relay = Self::start(config)?;
        relay
            .wait_log("replication started", Duration::from_secs(30))
            .await?;
        Ok(relay)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Resident memory of the relay process now, in bytes (from /proc).
    pub fn rss_bytes(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024)
    }

    /// The relay's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, signal);
    }

    /// SIGSTOPs the relay and returns once it is stopped everywhere (undo with SIGCONT).
    pub fn pause(&self) -> Result<()> {
        relay_testkit::pause_process(self.child.id())
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The exit status if the process has exited, `None` while it runs.
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Polls `probe` every 50 ms until it gives a value, while the process keeps running: an
    /// error naming `what`, with the log, when `within` passes or the process exits first.
    pub async fn poll_while_running<T>(
        &mut self,
        within: Duration,
        what: &str,
        mut probe: impl AsyncFnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(value) = probe().await? {
                return Ok(value);
            }
            ensure!(
                Instant::now() < deadline,
                "{what} not within {within:?}; log:\n{}",
                self.log()
            );
            ensure!(
                self.try_status()?.is_none(),
                "ended before {what}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "relay did not exit within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            if Instant::now() > deadline {
                bail!("relay log never showed {needle:?}; log:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits up to `within` for `relay` to exit; asserts the exit code, that the log has every
/// needle and no panic. Returns the log (to check, e.g., that no secret is in it).
pub async fn expect_exit(
    relay: &mut Relay,
    code: i32,
    within: Duration,
    needles: &[&str],
) -> Result<String> {
    let status = relay.wait_exit(within).await?;
    let log = relay.log();
    assert_eq!(status.code(), Some(code), "exit code; log:\n{log}");
    for needle in needles {
        assert!(
            log.contains(needle),
            "log should mention {needle:?}:\n{log}"
        );
    }
    assert!(!log.contains("panicked"), "{log}");
    Ok(log)
}

/// A message read back from the stream.
#[derive(Debug, Clone)]
pub struct Received {
    pub seq: u64,
    pub subject: String,
    pub payload: Vec<u8>,
    pub headers: std::collections::BTreeMap<String, String>,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or("")
    }
    pub fn id(&self) -> &str {
        self.header("Nats-Msg-Id")
    }
}

/// Every message now in the stream, in stream order.
pub async fn read_stream(js: &jetstream::Context) -> Result<Vec<Received>> {
    read_stream_named(js, STREAM).await
}

/// Every message now in stream `name`, in stream order.
pub async fn read_stream_named(js: &jetstream::Context, name: &str) -> Result<Vec<Received>> {
    let mut stream = js.get_stream(name).await?;
    let total = stream.info().await?.state.messages;
    if total == 0 {
        return Ok(Vec::new());
    }
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut out = Vec::new();
    while (out.len() as u64) < total {
        let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .context("reading the stream timed out")?
            .context("stream ended")??;
        let seq = m.info().map(|i| i.stream_sequence).unwrap_or_default();
        let headers = m
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            v.first().map(|x| x.as_str().to_owned()).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Received {
            seq,
            subject: m.subject.to_string(),
            payload: m.payload.to_vec(),
            headers,
        });
    }
    Ok(out)
}

/// Messages in the stream now (0 while it does not exist).
pub async fn stream_count(js: &jetstream::Context) -> Result<usize> {
    Ok(match js.get_stream(STREAM).await {
        Ok(mut s) => s.info().await?.state.messages as usize,
        Err(_) => 0,
    })
}

/// The stream's last sequence.
pub async fn last_sequence(js: &jetstream::Context) -> Result<u64> {
    Ok(js
        .get_stream(STREAM)
        .await?
        .info()
        .await?
        .state
        .last_sequence)
}

/// Reads and acknowledges up to `n` messages from durable `name`; their stream sequences.
pub async fn fetch_acked(
    js: &async_nats::jetstream::Context,
    name: &str,
    n: usize,
) -> Result<Vec<u64>> {
    use futures::StreamExt as _;
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream(STREAM)
        .await?
        .get_consumer(name)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let mut batch = consumer
        .fetch()
        .max_messages(n)
        .expires(Duration::from_secs(3))
        .messages()
        .await?;
    let mut seqs = Vec::new();
    while let Some(m) = batch.next().await {
        let m = m.map_err(|e| anyhow::anyhow!(e))?;
        m.ack().await.map_err(|e| anyhow::anyhow!(e))?;
        seqs.push(m.info().map_err(|e| anyhow::anyhow!(e))?.stream_sequence);
    }
    Ok(seqs)
}

/// Waits until the stream holds at least `n` messages; returns them.
pub async fn wait_for_messages(
    js: &jetstream::Context,
    n: usize,
    timeout: Duration,
    relay: Option<&Relay>,
) -> Result<Vec<Received>> {
    let deadline = Instant::now() + timeout;
    loop {
        let count = stream_count(js).await?;
        if count >= n {
            return read_stream(js).await;
        }
        if Instant::now() > deadline {
            bail!(
                "stream holds {count} of {n} messages after {timeout:?}; relay log:\n{}",
                relay.map(Relay::log).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (30 s) until a message with `Nats-Msg-Id` = `id` is in the stream; returns the stream.
pub async fn wait_for_id(
    js: &jetstream::Context,
    id: &str,
    relay: &Relay,
) -> Result<Vec<Received>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = read_stream(js).await?;
        if got.iter().any(|m| m.id() == id) {
            return Ok(got);
        }
        if Instant::now() > deadline {
            bail!("event {id} never arrived; log:\n{}", relay.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Inserts one Debezium-shaped outbox row; returns its id.
pub async fn insert_event(
    client: &impl tokio_postgres::GenericClient,
    aggregate: &str,
    kind: &str,
    payload: &str,
) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, $2, '1', $3, $4::text::jsonb)",
            &[&id, &aggregate, &kind, &payload],
        )
        .await?;
    Ok(id)
}

/// Inserts an outbox row whose empty `type` cannot form a subject token (dead-lettered when
/// `[relay] dead_letter_subject` is set); returns its id.
pub async fn insert_unroutable(
    client: &impl tokio_postgres::GenericClient,
    payload: &str,
) -> Result<String> {
    Ok(client
        .query_one(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES (gen_random_uuid(), 'Order', 'x', '', $1::text::jsonb) RETURNING id::text",
            &[&payload],
        )
        .await?
        .get(0))
}

/// An LSN as PostgreSQL prints it (`16/B374D848`, e.g. the `Outbox-Commit-Lsn` header) as a
/// number.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// The commit LSN of the transaction a stopped relay names in the first log line that has
/// `needle` (an event id, `cannot route`) and `commit LSN X/Y`.
pub fn stopped_commit_lsn(log: &str, needle: &str) -> Result<u64> {
    let line = log
        .lines()
        .find(|l| l.contains(needle) && l.contains("commit LSN "))
        .with_context(|| format!("no line with {needle:?} and a commit LSN:\n{log}"))?;
    let lsn = line
        .split("commit LSN ")
        .nth(1)
        .and_then(|rest| rest.split([')', ',', ' ', ';']).next())
        .context("commit LSN")?;
    parse_lsn(lsn).with_context(|| format!("LSN form: {lsn:?}"))
}

/// Asserts that neither the stored checkpoint nor the slot is past the commit of the transaction
/// the relay stopped at ([`stopped_commit_lsn`]); returns (checkpoint, slot, commit), 0 for a
/// position not there. Only that commit bounds them: an LSN taken inside the transaction does
/// not, as PostgreSQL may log records (a RUNNING_XACTS) before the commit that the relay may
/// confirm.
pub async fn assert_not_confirmed_past(
    env: &Env,
    log: &str,
    needle: &str,
) -> Result<(u64, u64, u64)> {
    let commit = stopped_commit_lsn(log, needle)?;
    let checkpoint = env.checkpoint().await?.unwrap_or(0);
    let slot = env.slot_confirmed().await?.unwrap_or(0);
    assert!(
        checkpoint <= commit && slot <= commit,
        "confirmed past the stopped transaction: checkpoint {checkpoint:X} / slot {slot:X}, \
         commit {commit:X}"
    );
    Ok((checkpoint, slot, commit))
}

/// Config lines serving the relay's `/metrics` on a free port (append them at the end of a
/// config), and that address for [`scrape`].
pub fn http_listen() -> (String, String) {
    let addr = format!("127.0.0.1:{}", relay_testkit::free_port());
    (format!("\n[http]\nlisten = \"{addr}\"\n"), addr)
}

/// The relay's `/metrics` at `addr` (see [`http_listen`]): `name{labels}` → value, e.g.
/// `outbox_relay_outstanding_acks` or `outbox_relay_events_already_published_total`.
pub async fn scrape(addr: &str) -> Result<std::collections::HashMap<String, f64>> {
    let (status, text) = http_get(addr, "/metrics").await?;
    anyhow::ensure!(status == 200, "/metrics: {status}");
    let mut out = std::collections::HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if let Some((key, value)) = line.rsplit_once(' ')
            && let Ok(value) = value.parse::<f64>()
        {
            out.insert(key.to_owned(), value);
        }
    }
    Ok(out)
}

/// GET `path` of the relay's `[http]` listener at `addr`: the status code and the body.
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    use http_body_util::{BodyExt, Empty};
    let get = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let request = hyper::Request::get(path)
            .header("host", addr)
            .body(Empty::<hyper::body::Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .with_context(|| format!("GET http://{addr}{path} timed out"))?
}

/// One metric of the relay at `addr` (see [`scrape`]); an error when it is missing.
pub async fn metric(addr: &str, name: &str) -> Result<f64> {
    scrape(addr)
        .await?
        .get(name)
        .copied()
        .with_context(|| format!("metric {name} missing at {addr}"))
}

/// Polls the relay's metric `name` at `addr` until `cond` holds (an unreachable endpoint counts
/// as not yet); returns the value that held, or the last one seen after `timeout`.
pub async fn wait_metric(
    addr: &str,
    name: &str,
    timeout: Duration,
    cond: impl Fn(f64) -> bool,
) -> Option<f64> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        if let Ok(v) = metric(addr, name).await {
            if cond(v) {
                return Some(v);
            }
            last = Some(v);
        }
        if Instant::now() > deadline {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The relay binary the tests run: this build's, or `RELAY_TEST_BIN` (to show a scenario failing
/// on another build, e.g. the one before a fix).
pub fn relay_bin() -> std::ffi::OsString {
    std::env::var_os("RELAY_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_outbox-relay").into())
}

/// Runs the relay binary with `args` (e.g. `validate --connect`) and waits for it.
pub async fn relay_cmd(config: &Path, args: &[&str]) -> Result<Output> {
    let config = config.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    Ok(tokio::task::spawn_blocking(move || {
        Command::new(relay_bin())
            .arg("--config")
            .arg(&config)
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
    })
    .await??)
}

/// Waits until `cond` holds, at most 40 s (checked every 100 ms); fails naming `what`, with the
/// relay's log.
pub async fn wait_until(
    what: &str,
    relay: &Relay,
    mut cond: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    const WAIT: Duration = Duration::from_secs(40);
    let deadline = Instant::now() + WAIT;
    while !cond().await? {
        if Instant::now() > deadline {
            bail!(
                "{what} did not happen within {WAIT:?}; log:\n{}",
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
