//! Small helpers around `/proc` and signals, plus the watchdog that cleans up
//! servers when the test process dies without running `Drop`.

use std::io::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a SIGSTOPped process may take to stop everywhere before that is an error.
pub(crate) const PAUSE_WITHIN: Duration = Duration::from_secs(5);

/// What `/proc/PID/stat` tells about one process.
#[derive(Debug, Clone)]
pub(crate) struct Stat {
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub start_time: u64,
}

pub(crate) fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) line.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // `rest[0]` is field 3 (state); field N is `rest[N - 3]`.
    let state = rest.first()?.chars().next()?;
    let ppid = rest.get(1)?.parse().ok()?;
    let start_time = rest.get(19)?.parse().ok()?;
    Some(Stat {
        comm,
        state,
        ppid,
        start_time,
    })
}

/// A process identified by pid *and* start time, so that a recycled pid is
/// never mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub pid: i32,
    start_time: u64,
}

impl Proc {
    pub fn get(pid: i32) -> Option<Self> {
        stat(pid).map(|s| Self {
            pid,
            start_time: s.start_time,
        })
    }

    fn current(&self) -> Option<Stat> {
        stat(self.pid).filter(|s| s.start_time == self.start_time)
    }

    /// Running, sleeping or stopped; not a zombie, not gone.
    pub fn is_alive(&self) -> bool {
        self.current()
            .is_some_and(|s| !matches!(s.state, 'Z' | 'X' | 'x'))
    }

    /// Sends `sig` if the process is still alive; a process that is gone is
    /// not an error.
    pub fn signal(&self, sig: Signal) -> anyhow::Result<()> {
        if !self.is_alive() {
            return Ok(());
        }
        match kill(Pid::from_raw(self.pid), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(anyhow::anyhow!("kill({}, {sig}): {e}", self.pid)),
        }
    }
}

impl Proc {
    /// SIGSTOPs the process and returns once every thread of it is stopped.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGSTOP)?;
        self.wait_stopped(PAUSE_WITHIN)
    }

    /// Waits until every thread of the process is stopped (after a SIGSTOP). `kill` returns
    /// before the stop has taken effect: one thread carries it out once it is scheduled, and
    /// the others run on until then (on a busy machine, long enough for a "paused" nats-server
    /// to answer a request). Gone counts as stopped.
    pub fn wait_stopped(&self, within: Duration) -> anyhow::Result<()> {
        if wait_blocking(within, || !self.is_alive() || self.threads_stopped()) {
            return Ok(());
        }
        anyhow::bail!(
            "process {} was sent SIGSTOP but was not stopped after {within:?}",
            self.pid
        )
    }

    /// Whether every thread in `/proc/PID/task` is stopped (`T`, or `t` under a tracer).
    fn threads_stopped(&self) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return false;
        };
        tasks.filter_map(Result::ok).all(|task| {
            std::fs::read_to_string(task.path().join("stat"))
                .ok()
                .and_then(|text| parse_stat(&text))
                .map(|stat| stat.state)
                .is_some_and(|state| matches!(state, 'T' | 't'))
        })
    }
}

/// All descendants of `root` (children, grandchildren, ...), found by
/// scanning `/proc`. Does not include `root` itself.
pub(crate) fn descendants(root: i32) -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let table: Vec<(i32, Stat)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, st) in &table {
            if st.ppid == parent && !out.iter().any(|p: &Proc| p.pid == *pid) {
                out.push(Proc {
                    pid: *pid,
                    start_time: st.start_time,
                });
                frontier.push(*pid);
            }
        }
    }
    out
}

/// Blocks (briefly) until `cond` holds or `timeout` passes.
pub(crate) fn wait_blocking(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (asynchronously) until `cond` holds or `timeout` passes.
pub(crate) async fn wait_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Quotes `s` for a POSIX shell.
pub(crate) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(crate) fn sh_quote_path(p: &Path) -> String {
    sh_quote(&p.to_string_lossy())
}

/// A `sh` process that runs a cleanup script once its stdin reaches EOF,
/// which happens when the test process dies, even by SIGKILL (a
/// `Drop` that never ran). A normal `Drop` kills the watchdog first, so the
/// script then never runs.
#[derive(Debug)]
pub(crate) struct Watchdog {
    child: Child,
}

impl Watchdog {
    /// Best effort: `None` if `sh` cannot be started.
    pub fn spawn(cleanup_script: &str) -> Option<Self> {
        let script = format!("trap '' INT TERM HUP PIPE; read _ignored; {cleanup_script}");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group: a Ctrl-C aimed at the test run must not kill
        // the watchdog before it has cleaned up.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().ok()?;
        // Keep the pipe open (the handle lives in `child.stdin`); write nothing.
        if let Some(stdin) = child.stdin.as_mut() {
            let _ = stdin.flush();
        }
        Some(Self { child })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `max_lines` lines of a log file (lossy UTF-8).
pub(crate) fn log_tail(path: &Path, max_lines: usize) -> String {
    let text = read_lossy(path);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(max_lines);
    lines[start..].join("\n")
}

pub(crate) fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The log text written after byte `offset`.
pub(crate) fn read_from(path: &Path, offset: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

pub(crate) fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}
