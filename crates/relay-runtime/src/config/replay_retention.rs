//! `[relay] replay_retention`: one key that takes a duration (`"6h"`) or a WAL size (`"2GB"`).

use relay_core::trail::ReplayRetention;
use serde::{Deserialize, Deserializer, Serializer};

/// Byte units, binary (PostgreSQL's `kB`, `MB`, `GB` are powers of 1024 too).
const UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("TB", 1 << 40),
    ("GB", 1 << 30),
    ("MB", 1 << 20),
    ("kB", 1 << 10),
    ("B", 1),
];

/// Parses `"6h"`, `"90m"` (a duration, humantime) or `"2GB"`, `"512MB"` (bytes of WAL).
pub fn parse(text: &str) -> Result<ReplayRetention, String> {
    let text = text.trim();
    let unit = UNITS
        .iter()
        .find(|(u, _)| text.ends_with(u) || (*u == "kB" && text.ends_with("KB")));
    let parsed = match unit {
        Some((u, factor)) => text[..text.len() - u.len()]
            .trim()
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(*factor))
            .map(ReplayRetention::Bytes),
        None => humantime::parse_duration(text)
            .ok()
            .map(ReplayRetention::Time),
    };
    match parsed {
        Some(ReplayRetention::Time(d)) if d.is_zero() => Err("must be positive".into()),
        Some(ReplayRetention::Bytes(0)) => Err("must be positive".into()),
        Some(r) => Ok(r),
        None => Err(format!(
            "`{text}` is neither a duration (\"6h\", \"30m\") nor a WAL size (\"2GB\", \"512MB\")"
        )),
    }
}

/// As written back by `config print` (parsed back by [`parse`]).
pub fn format(retention: ReplayRetention) -> String {
    retention.to_string()
}

pub fn serialize<S: Serializer>(
    value: &Option<ReplayRetention>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(r) => serializer.serialize_str(&format(*r)),
        None => serializer.serialize_none(),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<ReplayRetention>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    text.map(|t| parse(&t).map_err(serde::de::Error::custom))
        .transpose()
}

/// Why `[relay] audit_interval` / `audit_heal` cannot be used as set.
pub(super) fn audit_problem(relay: &super::PipelineSettings) -> Option<String> {
    match relay.audit_interval {
        Some(interval) if interval.is_zero() => {
            Some("[relay] audit_interval must be positive (leave it out to turn the audit off)".into())
        }
        Some(_) if relay.replay_retention.is_none() => Some(
            "[relay] audit_interval needs [relay] replay_retention: the audit reads the WAL the slot keeps behind the checkpoint (e.g. replay_retention = \"1h\", longer than audit_interval)".into(),
        ),
        None if relay.audit_heal => {
            Some("[relay] audit_heal = true needs [relay] audit_interval".into())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(
            parse("6h"),
            Ok(ReplayRetention::Time(Duration::from_secs(21600)))
        );
        assert_eq!(parse("2GB"), Ok(ReplayRetention::Bytes(2 << 30)));
        assert_eq!(parse("512 MB"), Ok(ReplayRetention::Bytes(512 << 20)));
        assert_eq!(parse("64kB"), Ok(ReplayRetention::Bytes(64 << 10)));
        assert_eq!(parse("100B"), Ok(ReplayRetention::Bytes(100)));
        assert!(parse("0s").is_err());
        assert!(parse("lots").is_err());
        assert_eq!(format(ReplayRetention::Bytes(2 << 30)), "2GiB");
        assert_eq!(
            parse(&format(ReplayRetention::Bytes(2 << 30))),
            Ok(ReplayRetention::Bytes(2 << 30))
        );
    }
}
