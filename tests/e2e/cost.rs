//! What a process costs while a test watches it: CPU time from `/proc`, and a relay log's lines
//! at WARN or ERROR level.

use std::time::Duration;

use anyhow::{Context, Result};

/// CPU time process `pid` has used so far, user and system: `utime` + `stime` of
/// `/proc/<pid>/stat`, in clock ticks of USER_HZ (100 per second on Linux).
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces: field 3
    // (the state) first, so utime (14) and stime (15) are the 12th and 13th.
    let (_, rest) = stat.rsplit_once(')').context("/proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        Ok(fields.get(i).context("/proc/<pid>/stat fields")?.parse()?)
    };
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// Lines of a relay's log (text format: time, level, target, message) at WARN or ERROR level.
pub fn warnings(log: &str) -> usize {
    log.lines()
        .filter(|l| matches!(l.split_whitespace().nth(1), Some("WARN" | "ERROR")))
        .count()
}

#[test]
fn warnings_are_counted_by_their_level_field() {
    let log = "2026-12-07T22:06:31.436240Z  WARN relay_runtime::broker: replicas: 1\n\
               2026-12-07T22:06:31.443798Z  INFO relay_runtime::relay::standby: WARN in text\n\
               2026-12-07T22:06:32.000000Z ERROR relay_runtime::relay: failed\n";
    assert_eq!(warnings(log), 2);
}
