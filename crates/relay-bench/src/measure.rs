//! Process measurements: peak RSS and CPU time from /proc.

use std::sync::OnceLock;

/// Peak resident set size (VmHWM) of `pid`, in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// User + system CPU seconds of `pid` (`self` for this process).
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command name: field 3 (state) is index 0, utime (14) index 11, stime (15) 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks())
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
    fn this_process_has_switched_at_least_once() {
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(context_switches(std::process::id()).is_some_and(|n| n > 0));
    }
}
