//! Human-readable durations, seconds and byte counts for the reports.

use super::*;

pub(crate) fn duration(d: Duration) -> String {
    humantime_serde::re::humantime::format_duration(d).to_string()
}

/// Whole seconds as a duration, e.g. `1h 2m 3s`.
pub(super) fn seconds(s: f64) -> String {
    if !s.is_finite() || s > 1e12 {
        return "forever".into();
    }
    duration(Duration::from_secs(s.max(0.0).round() as u64))
}

/// Bytes in PostgreSQL's units (1 kB = 1024 bytes), e.g. `64 MB`, `1.5 GB`.
pub(crate) fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if n.abs() < 1024.0 {
        return format!("{n:.0} bytes");
    }
    let mut value = n / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value.abs() < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    if (value - value.round()).abs() < 0.05 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}
