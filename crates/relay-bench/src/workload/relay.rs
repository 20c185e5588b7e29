//! The real `outbox-relay` binary: its config, its process, and the catch-up run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::measure::{BudgetStart, cpu_seconds, peak_rss};

use super::setup::{Env, copy_slot, drop_slot, walsender_pid};
use super::{DB, PUBLICATION, RelayRun, STREAM};

/// The bench's relay config for `slot`, with `extra` TOML (e.g. `[[outbox]]` entries) appended.
pub(super) fn relay_config_with(
    env: &Env,
    slot: &str,
    max_in_flight: usize,
    extra: &str,
) -> Result<PathBuf> {
    relay_config_full(env, slot, max_in_flight, "", extra)
}

/// [`relay_config_with`] with `nats_extra` (keys of `[nats]`, e.g. `duplicate_window`) too.
pub(super) fn relay_config_full(
    env: &Env,
    slot: &str,
    max_in_flight: usize,
    nats_extra: &str,
    extra: &str,
) -> Result<PathBuf> {
    let mut text = format!(
        r#"[postgres]
url = "{pg}"
slot = "{slot}"
publication = "{PUBLICATION}"
create_slot = false
create_publication = false
status_interval = "1s"

[nats]
url = "{nats}"
stream = "{STREAM}"
create_stream = true
{nats_extra}

[relay]
max_in_flight = {max_in_flight}
checkpoint_interval = "100ms"
"#,
        pg = env.pg.url(DB),
        nats = env.nats.url(),
    );
    text.push_str(extra);
    let path = env.log_dir.join(format!("relay-{slot}.toml"));
    std::fs::write(&path, text)?;
    Ok(path)
}

pub(super) struct RelayProc {
    child: std::process::Child,
    pub(super) log: PathBuf,
}

impl RelayProc {
    /// `bin run` with the config file `config`; its log is `relay-{name}.log`.
    pub(super) fn start_config(env: &Env, bin: &Path, config: &Path, name: &str) -> Result<Self> {
        let log = relay_log(env, name);
        let child = std::process::Command::new(bin)
            .arg("--config")
            .arg(config)
            .arg("run")
            // RELAY_BENCH_LOG: the relays' log filter (e.g. `info,relay_nats=debug`).
            .env(
                "RUST_LOG",
                std::env::var("RELAY_BENCH_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self { child, log })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "outbox-relay exited ({status}); log {}:\n{}",
                self.log.display(),
                tail(&self.log)
            );
        }
        Ok(())
    }

    pub(super) async fn stop(mut self) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("outbox-relay did not stop within 30 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The log file of the relay run named `name` (its slot, for most runs).
pub(super) fn relay_log(env: &Env, name: &str) -> PathBuf {
    env.log_dir.join(format!("relay-{name}.log"))
}

/// The last line of a command's log that says it finished (its summary), or "".
pub(super) fn finished_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| l.contains("finished"))
        .unwrap_or_default()
        .to_owned()
}

pub(super) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

pub(super) async fn checkpoint_of(env: &Env, slot: &str) -> Result<Option<u64>> {
    let row = env
        .client
        .query_opt(
            "SELECT (confirmed_lsn - '0/0')::bigint FROM outbox_relay.checkpoint WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|r| r.get::<_, i64>(0) as u64))
}

fn unix_nanos_now() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// An optional profile of one run: `perf record` attached to a process when
/// `RELAY_BENCH_PERF_DIR` is set (see docs/benchmarks.md).
pub(super) struct Perf(Option<std::process::Child>);

impl Perf {
    /// Attaches to `pid`; the profile is `perf-{name}.data` in `RELAY_BENCH_PERF_DIR`.
    pub(super) fn attach(pid: u32, name: &str) -> Result<Self> {
        let Some(dir) = std::env::var_os("RELAY_BENCH_PERF_DIR") else {
            return Ok(Self(None));
        };
        let child = std::process::Command::new("perf")
            // RELAY_BENCH_PERF_CALL_GRAPH=dwarf when the binary has no frame pointers.
            .args(["record", "-F", "1999", "-q", "--call-graph"])
            .arg(std::env::var("RELAY_BENCH_PERF_CALL_GRAPH").unwrap_or_else(|_| "fp".into()))
            .arg("-o")
            .arg(PathBuf::from(dir).join(format!("perf-{name}.data")))
            .args(["-p", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf record")?;
        Ok(Self(Some(child)))
    }

    /// Stops the recording (it also ends by itself when the process exits) and waits for it.
    pub(super) fn finish(self) {
        if let Some(mut perf) = self.0 {
            let pid = nix::unistd::Pid::from_raw(perf.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            let _ = perf.wait();
        }
    }
}

/// A catch-up run's settings beyond the bench's defaults.
#[derive(Debug, Default)]
pub(super) struct CatchUpConfig<'a> {
    /// Keys of the relay's `[nats]` table (e.g. a short `duplicate_window`).
    pub(super) nats: &'a str,
    /// Keys of its `[relay]` table (e.g. `replay_retention`), and after them any tables
    /// (e.g. a `[[messages]]` entry): the config's last lines.
    pub(super) relay: &'a str,
    /// Leave the slot in place (and the stream as the relay filled it) after the run, for a
    /// command that decodes the slot's WAL again (`restore`).
    pub(super) keep_slot: bool,
}

/// What [`relay_catch_up_with`] leaves for the next step when it keeps the slot.
pub(super) struct CaughtUp {
    pub(super) run: RelayRun,
    pub(super) slot: String,
    pub(super) config: PathBuf,
}

/// The real relay on a copy of the base slot, from start until the checkpoint passed the last
/// transaction (so every event before it was acknowledged) and the stream holds every event.
pub(super) async fn relay_catch_up(
    env: &Env,
    bin: &Path,
    variant: &'static str,
    mif: usize,
    rows: u64,
    inside_last: u64,
) -> Result<RelayRun> {
    let default = CatchUpConfig::default();
    let caught_up =
        relay_catch_up_with(env, bin, variant, mif, rows, inside_last, &default).await?;
    Ok(caught_up.run)
}

/// [`relay_catch_up`] with settings of its own (`extra`).
// Long: one measured run: set-up, the timed region and its readings in order, so what the figure
// includes reads in one place
pub(super) async fn relay_catch_up_with(
    env: &Env,
    bin: &Path,
    variant: &'static str,
    mif: usize,
    rows: u64,
    inside_last: u64,
    extra: &CatchUpConfig<'_>,
) -> Result<CaughtUp> {
    let slot = format!("relay_m{mif}{variant}");
    copy_slot(env, &slot).await?;
    // A fresh copy of the slot: without the checkpoint an earlier run of the same name (an
    // earlier --rounds round) stored, which would end this run before it began.
    // (The relay's migrations make the tables at its first start.)
    for table in ["outbox_relay.checkpoint", "outbox_relay.position_map"] {
        let exists = env
            .client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .await?
            .get::<_, bool>(0);
        if exists {
            env.client
                .execute(
                    &format!("DELETE FROM {table} WHERE slot_name = $1"),
                    &[&slot],
                )
                .await
                .with_context(|| format!("clearing {table} for {slot}"))?;
        }
    }
    let _ = env.js.delete_stream(STREAM).await;
    let config = relay_config_full(env, &slot, mif, extra.nats, extra.relay)?;
    let timeout = Duration::from_secs(120 + rows / 2_000);
    let budget = BudgetStart::now(env.nats.pid());
    let started = Instant::now();
    let spawned_at = unix_nanos_now();
    let mut relay = RelayProc::start_config(env, bin, &config, &slot)?;
    let perf = Perf::attach(relay.pid(), &format!("{slot}-{rows}"))?;
    let mut walsender = None;
    loop {
        if walsender.is_none() {
            walsender = walsender_pid(env, &slot).await?;
        }
        if checkpoint_of(env, &slot)
            .await?
            .is_some_and(|c| c > inside_last)
        {
            break;
        }
        relay.check_alive()?;
        if started.elapsed() > timeout {
            bail!(
                "relay did not catch up within {timeout:?}; log:\n{}",
                tail(&relay.log)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let pid = relay.pid();
    let rss = peak_rss(pid).unwrap_or(0);
    let cpu = cpu_seconds(&pid.to_string()).unwrap_or(f64::NAN);
    let walsender_cpu = walsender.and_then(|p| cpu_seconds(&p.to_string()));
    let budget = budget.finish(secs, &[("relay", Some(cpu)), ("walsender", walsender_cpu)]);
    let state = env.js.get_stream(STREAM).await?.info().await?.state.clone();
    let messages = state.messages;
    // The broker's own clock, the same machine's: when the first and the last event were
    // stored, against the spawn (start-up) and the checkpoint seen (the end of the run).
    let since_spawn =
        |t: async_nats::datetime::DateTime| (t.unix_timestamp_nanos() - spawned_at) as f64 / 1e9;
    let first_stored_secs = since_spawn(state.first_timestamp);
    let last_stored_secs = since_spawn(state.last_timestamp);
    perf.finish();
    relay.stop().await?;
    if !extra.keep_slot {
        drop_slot(env, &slot).await;
    }
    if messages != rows {
        bail!("relay run stored {messages} messages, expected {rows}");
    }
    let run = RelayRun {
        variant,
        max_in_flight: mif,
        secs,
        events_per_s: rows as f64 / secs,
        peak_rss: rss,
        cpu_secs: cpu,
        first_stored_secs,
        last_stored_secs,
        budget: Some(budget),
    };
    Ok(CaughtUp { run, slot, config })
}
