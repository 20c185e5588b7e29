//! Process measurements: peak RSS and CPU time from /proc.

use std::sync::OnceLock;

/// Peak resident set size (VmHWM) of `pid`, in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    kib_field(&format!("/proc/{pid}/status"), "VmHWM:")
}

/// Resident set size (VmRSS) of `pid` now, in bytes: shared pages (the binary's text, shared
/// libraries) counted in full in every process that maps them.
pub fn rss(pid: u32) -> Option<u64> {
    kib_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

/// Proportional set size of `pid` now, in bytes (`Pss` of smaps_rollup): each shared page
/// divided among the processes that map it, so a sum over processes counts it once.
pub fn pss(pid: u32) -> Option<u64> {
    kib_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:")
}

/// The `key` line of a /proc file whose value is in kB, in bytes.
fn kib_field(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU seconds (user + system) of `root` and of every process whose parent is `root`, by pid:
/// a PostgreSQL server's postmaster, its backends, walsenders and helpers.
pub fn family_cpu(root: u32) -> std::collections::HashMap<u32, f64> {
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // A process that ended since the listing has nothing left to read: not counted.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((ppid, cpu)) = ppid_and_cpu(&stat)
            && (pid == root || ppid == root)
        {
            // PostgreSQL's processes have one thread each: its schedstat is the process's.
            let exact = schedstat_secs(&format!("/proc/{pid}/schedstat"));
            out.insert(pid, exact.unwrap_or(cpu));
        }
    }
    out
}

/// Seconds on the CPU of one thread (the first field of `/proc/PID/task/TID/schedstat`, in
/// nanoseconds): exact, where `/proc/PID/stat` counts whole clock ticks (10 ms), which over a
/// few seconds of an idle process is most of the figure.
fn schedstat_secs(path: &str) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 / 1e9)
}

/// A process's CPU time read two ways: clock ticks of the whole process (threads that ended
/// included), and each live thread's exact time.
#[derive(Debug, Clone, Default)]
pub struct ProcessCpu {
    ticks: Option<f64>,
    threads: Vec<(u32, f64)>,
}

impl ProcessCpu {
    pub fn now(pid: u32) -> Self {
        let mut threads: Vec<(u32, f64)> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| {
                let tid = t.file_name().to_str()?.parse().ok()?;
                Some((
                    tid,
                    schedstat_secs(&format!("/proc/{pid}/task/{tid}/schedstat"))?,
                ))
            })
            .collect();
        threads.sort_by_key(|t| t.0);
        Self {
            ticks: cpu_seconds(&pid.to_string()),
            threads,
        }
    }

    /// CPU seconds from `before` to this reading: exact when the same threads ran throughout,
    /// else (a thread started or ended between them) in clock ticks.
    pub fn since(&self, before: &ProcessCpu) -> f64 {
        let same = !self.threads.is_empty()
            && self.threads.len() == before.threads.len()
            && self
                .threads
                .iter()
                .zip(&before.threads)
                .all(|(a, b)| a.0 == b.0);
        if same {
            let sum = |t: &[(u32, f64)]| t.iter().map(|(_, s)| s).sum::<f64>();
            sum(&self.threads) - sum(&before.threads)
        } else {
            self.ticks
                .zip(before.ticks)
                .map_or(f64::NAN, |(a, b)| a - b)
        }
    }
}

/// The parent pid and the CPU seconds of one `/proc/PID/stat` text.
fn ppid_and_cpu(stat: &str) -> Option<(u32, f64)> {
    // After the command name: field 3 (state) is index 0, ppid (4) index 1, utime (14) index
    // 11, stime (15) 12.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ppid: u32 = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, (utime + stime) as f64 / clock_ticks()))
}

/// User + system CPU seconds of `pid` (`self` for this process).
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ppid_and_cpu(&stat).map(|(_, cpu)| cpu)
}

/// Context switches (voluntary and involuntary, every thread) of `pid` so far: how often the
/// relay went to sleep and was woken, the cost that dominates live 1-row transactions.
pub fn context_switches(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        // A thread that ended since the listing has no status left to read: not counted.
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            total += switches_in_status(&status)?;
        }
    }
    Some(total)
}

/// The sum of `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of one
/// `/proc/PID/task/TID/status` text.
fn switches_in_status(status: &str) -> Option<u64> {
    let mut sum = None;
    for line in status.lines() {
        if let Some(rest) = line
            .strip_prefix("voluntary_ctxt_switches:")
            .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
        {
            *sum.get_or_insert(0) += rest.trim().parse::<u64>().ok()?;
        }
    }
    sum
}

/// User + system CPU seconds of this process's children that have exited and been waited for
/// (`getrusage(RUSAGE_CHILDREN)`): the difference around one child's run is that child's CPU,
/// as long as no other child is reaped meanwhile.
pub fn children_cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(f64::NAN, |u| {
        let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        secs(u.user_time()) + secs(u.system_time())
    })
}

/// Busy CPU seconds of the whole machine so far, every core and every process together
/// (`/proc/stat`: user, nice, system, irq, softirq, steal; not idle or iowait).
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_ticks_in_stat(&stat).map(|ticks| ticks as f64 / clock_ticks())
}

/// The busy ticks of the `cpu` (all cores) line of a `/proc/stat` text.
fn busy_ticks_in_stat(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = fields[..] else {
        return None;
    };
    Some(user + nice + system + irq + softirq + steal)
}

/// Where the machine's CPU went during one timed run (on 2 cores the relay, the
/// walsender and nats-server share them, so a run can be bound by the machine, not by the
/// process under test).
#[derive(Debug, Clone, Default)]
pub struct CpuBudget {
    pub wall_secs: f64,
    /// Busy CPU seconds of the whole machine over the run, every process counted.
    pub machine_secs: Option<f64>,
    /// CPU seconds of each process the run is made of, by role (None: not readable).
    pub processes: Vec<(&'static str, Option<f64>)>,
}

impl CpuBudget {
    /// Cores kept busy on average, all processes (the machine's own count).
    pub fn busy_cores(&self) -> Option<f64> {
        self.machine_secs
            .filter(|_| self.wall_secs > 0.0)
            .map(|m| m / self.wall_secs)
    }
}

/// The readings a [`CpuBudget`] is the difference of, taken when a run starts.
pub struct BudgetStart {
    machine: Option<f64>,
    nats_pid: Option<u32>,
    nats: Option<f64>,
}

impl BudgetStart {
    /// Readings now; `nats_pid` is the nats-server's, whose CPU over the run is counted.
    pub fn now(nats_pid: Option<u32>) -> Self {
        Self {
            machine: machine_busy_seconds(),
            nats_pid,
            nats: nats_pid.and_then(|p| cpu_seconds(&p.to_string())),
        }
    }

    /// The budget of a run of `wall_secs` that ends now, with the CPU seconds of the run's own
    /// processes (`processes`, whole lifetimes: each was started for the run) and the
    /// nats-server's since [`BudgetStart::now`].
    pub fn finish(self, wall_secs: f64, processes: &[(&'static str, Option<f64>)]) -> CpuBudget {
        let since = |start: Option<f64>, end: Option<f64>| Some(end? - start?);
        let nats_now = self.nats_pid.and_then(|p| cpu_seconds(&p.to_string()));
        let mut all = processes.to_vec();
        all.push(("nats-server", since(self.nats, nats_now)));
        CpuBudget {
            wall_secs,
            machine_secs: since(self.machine, machine_busy_seconds()),
            processes: all,
        }
    }
}

/// CPU seconds per event as microseconds.
pub fn micros_per_event(cpu_secs: f64, events: u64) -> f64 {
    cpu_secs * 1e6 / events.max(1) as f64
}

fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The `q`-quantile (0..=1) of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_are_both_kinds_summed() {
        let status =
            "Name:\trelay\nvoluntary_ctxt_switches:\t1200\nnonvoluntary_ctxt_switches:\t34\n";
        assert_eq!(switches_in_status(status), Some(1234));
        assert_eq!(switches_in_status("Name:\trelay\n"), None);
    }

    #[test]
    fn machine_busy_time_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 5 40 9000 300 2 3 7 0 0\ncpu0 50 2 20 4500 150 1 1 3 0 0\n";
        assert_eq!(busy_ticks_in_stat(stat), Some(100 + 5 + 40 + 2 + 3 + 7));
        assert_eq!(busy_ticks_in_stat("cpu0 1 2 3\n"), None);
        assert_eq!(busy_ticks_in_stat("cpu  1 2 3\n"), None);
    }

    #[test]
    fn a_budget_counts_the_machine_busy_while_this_thread_spins() {
        let start = BudgetStart::now(None);
        let begun = std::time::Instant::now();
        let mut x = 0u64;
        while begun.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let budget = start.finish(begun.elapsed().as_secs_f64(), &[("spinner", Some(0.3))]);
        // One core spun for the whole run (ticks are 10 ms, so allow some slack), and the
        // nats-server had no pid, so its share is unknown rather than zero.
        assert!(budget.busy_cores().is_some_and(|c| c >= 0.8), "{budget:?}");
        assert_eq!(budget.processes.last(), Some(&("nats-server", None)));
    }

    #[test]
    fn a_stat_line_gives_its_parent_and_cpu() {
        // A command name with a space and a parenthesis: fields are counted after the last `)`.
        let stat = "42 (postgres: a) b) S 7 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 1 0";
        let (ppid, cpu) = ppid_and_cpu(stat).unwrap();
        assert_eq!(ppid, 7);
        assert!((cpu - 400.0 / clock_ticks()).abs() < 1e-9);
    }

    #[test]
    fn exact_cpu_counts_a_spin_shorter_than_a_tick() {
        let me = std::process::id();
        let before = ProcessCpu::now(me);
        let begun = std::time::Instant::now();
        while begun.elapsed() < std::time::Duration::from_millis(3) {
            std::hint::black_box(0);
        }
        let spent = ProcessCpu::now(me).since(&before);
        // Other test threads may start or end meanwhile: then it is whole ticks, >= 0.
        assert!(spent >= 0.0, "{spent}");
    }

    #[test]
    fn this_process_is_in_its_own_family_and_has_a_size() {
        let me = std::process::id();
        assert!(family_cpu(me).contains_key(&me));
        assert!(rss(me).is_some_and(|r| r > 0));
        assert!(pss(me).is_none_or(|p| p > 0));
    }

    #[test]
    fn this_process_has_switched_at_least_once() {
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(context_switches(std::process::id()).is_some_and(|n| n > 0));
    }
}
