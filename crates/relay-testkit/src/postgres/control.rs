//! Stopping, crashing, killing, pausing, resuming and restarting a test server; cleanup on drop.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail};
use nix::sys::signal::Signal;

use super::{LOG_TAIL_LINES, PostgresServer, START_TIMEOUT};
use crate::procs::{self, Proc};

impl PostgresServer {
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
        postmaster.pause()
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
        let descendants = procs::descendants(postmaster.pid);
        for p in &descendants {
            p.signal(Signal::SIGSTOP)?;
        }
        for p in std::iter::once(&postmaster).chain(&descendants) {
            p.wait_stopped(procs::PAUSE_WITHIN)?;
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

    pub(super) async fn pg_ctl_start(&self) -> anyhow::Result<StartOutcome> {
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
            .arg(format!("-p {}", self.port))
            .envs(self.server_env.iter().map(|(k, v)| (k, v)));
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
    pub(super) async fn wait_ready(&self) -> anyhow::Result<()> {
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

    pub(super) fn start_error(&self, msg: &str) -> String {
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

pub(super) enum StartOutcome {
    Started,
    /// Worth retrying (port clash, a previous instance still exiting).
    Transient(String),
    Failed(String),
}
