//! Where an event committed at a commit LSN or time is in the stream, and how that was found:
//! from the relay's position map (`outbox_relay.position_map`) when it has an anchor before the
//! target, else by searching the stream (`outbox-position`). `position` prints it, `replay`
//! moves a consumer there.

use std::time::SystemTime;

use outbox_position::{Hint, Limits, Method, Position, Target};
use relay_core::Lsn;
use relay_postgres::checkpoint::{
    MapStart, MapSummary, MapTarget, map_start, map_start_all_slots, map_summary,
};
use serde_json::json;

use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind};

/// What the position map contributed.
#[derive(Debug, Clone)]
pub enum MapUse {
    /// Its anchor started the scan.
    Used(MapStart),
    /// It has no anchor before the target (empty, pruned, or the target is older).
    NoAnchor,
    /// `--no-map`.
    Skipped,
    /// It could not be read.
    Unavailable(String),
}

/// A lookup's answer with the context it was found in.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub position: Position,
    pub map: MapUse,
    pub summary: Option<MapSummary>,
    pub checkpoint: Option<Lsn>,
}

/// Reads the map's start for `target` (and what it holds) from the relay's database.
async fn read_map(
    config: &RelayConfig,
    target: Target,
) -> Result<(Option<MapStart>, MapSummary, Option<Lsn>), String> {
    let client = relay_postgres::connect(&config.postgres)
        .await
        .map_err(|e| e.to_string())?;
    let slot = config.postgres.slot.as_str();
    let stream = config.nats.stream.as_str();
    let map_target = match target {
        Target::Lsn(lsn) => MapTarget::Lsn(lsn),
        Target::Time(t) => MapTarget::Time(t),
    };
    // Shards share the stream: every shard's map, or none (see `map_start_all_slots`).
    let start = if config.postgres.shard.is_some() {
        map_start_all_slots(&client, stream, map_target).await
    } else {
        map_start(&client, slot, stream, map_target).await
    }
    .map_err(|e| format!("reading outbox_relay.position_map: {e}"))?;
    let summary = map_summary(&client, slot, stream)
        .await
        .map_err(|e| format!("reading outbox_relay.position_map: {e}"))?;
    let checkpoint = relay_postgres::catalog::stored_checkpoint(&client, slot)
        .await
        .ok()
        .flatten()
        .map(|(lsn, _)| lsn);
    Ok((start, summary, checkpoint))
}

/// Finds where `target` is in the configured stream: from the position map's anchor before it
/// (unless `no_map`), else by searching the stream within `limits`.
pub async fn lookup(
    config: &RelayConfig,
    js: &async_nats::jetstream::Context,
    target: Target,
    no_map: bool,
    limits: Limits,
) -> Result<Lookup, Failure> {
    let (map, summary, checkpoint) = if no_map {
        (MapUse::Skipped, None, None)
    } else {
        match read_map(config, target).await {
            Ok((Some(start), summary, cp)) => (MapUse::Used(start), Some(summary), cp),
            Ok((None, summary, cp)) => (MapUse::NoAnchor, Some(summary), cp),
            Err(e) => (MapUse::Unavailable(e), None, None),
        }
    };
    let hint = match &map {
        MapUse::Used(start) => Some(Hint {
            anchor_lsn: start.anchor_lsn,
            anchor_time: start.anchor_time,
            start_seq: start.start_seq,
        }),
        _ => None,
    };
    let position = outbox_position::locate(js, &config.nats.stream, target, hint, limits)
        .await
        .map_err(|e| match e {
            outbox_position::Error::ScanLimit { .. } => Failure::new(FailureKind::Config, e),
            outbox_position::Error::Stream { .. } => Failure::new(FailureKind::Unavailable, e),
        })?;
    Ok(Lookup {
        position,
        map,
        summary,
        checkpoint,
    })
}

/// A commit LSN as PostgreSQL prints it.
pub fn parse_lsn(s: &str) -> Result<Lsn, String> {
    s.trim()
        .parse::<Lsn>()
        .map_err(|e| format!("{e} (expected an LSN such as 0/16B3748)"))
}

/// RFC 3339 (`2026-11-29T11:38:44Z`, `2026-11-29 11:38:44`, UTC unless an offset is given), or
/// `<duration> ago` (`15m ago`).
pub fn parse_time(s: &str) -> Result<SystemTime, String> {
    parse_time_at(s, SystemTime::now())
}

/// [`parse_time`], `<duration> ago` counted back from `now` (a signal's: when it was asked for).
pub fn parse_time_at(s: &str, now: SystemTime) -> Result<SystemTime, String> {
    let s = s.trim();
    if let Some(ago) = s.strip_suffix("ago") {
        let d = humantime_serde::re::humantime::parse_duration(ago.trim())
            .map_err(|e| format!("`{s}`: {e}"))?;
        return now
            .checked_sub(d)
            .ok_or_else(|| format!("`{s}` is before 1970"));
    }
    humantime_serde::re::humantime::parse_rfc3339_weak(s).map_err(|e| {
        format!("`{s}`: {e} (expected RFC 3339, e.g. 2026-11-29T11:38:44Z, or e.g. `15m ago`)")
    })
}

/// An LSN, else a time ([`parse_lsn`], [`parse_time`]).
pub fn parse_target(s: &str) -> Result<Target, String> {
    parse_target_at(s, SystemTime::now())
}

/// [`parse_target`], a relative time counted back from `now`.
pub fn parse_target_at(s: &str, now: SystemTime) -> Result<Target, String> {
    match parse_lsn(s) {
        Ok(lsn) => Ok(Target::Lsn(lsn)),
        Err(_) => parse_time_at(s, now).map(Target::Time),
    }
}

/// `t` as RFC 3339 with microseconds.
pub fn rfc3339(t: SystemTime) -> String {
    humantime_serde::re::humantime::format_rfc3339_micros(t).to_string()
}

impl Lookup {
    /// "found via …": where the scan started and how much it read.
    pub fn how(&self) -> String {
        let p = &self.position;
        let scanned = format!(
            "{} messages scanned from sequence {}",
            p.scanned, p.scan_start
        );
        match &p.method {
            Method::Map(h) => format!(
                "found via position map anchor ({}, {}, sequence {}{}) + {scanned}",
                h.anchor_lsn,
                rfc3339(h.anchor_time),
                h.start_seq,
                match &self.map {
                    MapUse::Used(start) if start.slots.len() > 1 =>
                        format!("; the lowest of slots {}", start.slots.join(", ")),
                    _ => String::new(),
                }
            ),
            Method::Bisect { below, from_time } => {
                let why = match &self.map {
                    MapUse::NoAnchor => "the position map has no anchor before it",
                    MapUse::Skipped => "--no-map",
                    MapUse::Unavailable(_) => "the position map could not be read",
                    MapUse::Used(_) => "",
                };
                match (below, from_time) {
                    (Some(b), Some(t)) => format!(
                        "found via stream search ({why}): {} direct gets (bisection by Outbox-Commit-Lsn) found #{} committed before it ({}, {}); from the first message stored after {} + {scanned}",
                        p.gets,
                        b.seq,
                        b.commit_lsn,
                        b.commit_time.map(rfc3339).unwrap_or_default(),
                        rfc3339(*t)
                    ),
                    _ => format!(
                        "found via stream search ({why}): {} direct gets found no message committed before it; from the stream's first message + {scanned}",
                        p.gets
                    ),
                }
            }
            Method::StoredTime { from_time } => format!(
                "found via stream search (no position map anchor before it): from the first message stored after {} + {scanned}",
                rfc3339(*from_time)
            ),
            Method::EmptyStream => "the stream is empty".into(),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        let p = &self.position;
        let method = match &p.method {
            Method::Map(_) => "position_map",
            Method::Bisect { .. } => "stream_bisection",
            Method::StoredTime { .. } => "stream_stored_time",
            Method::EmptyStream => "empty_stream",
        };
        json!({
            "target": p.target.to_string(),
            "sequence": p.sequence,
            "found": p.found.as_ref().map(|f| json!({
                "sequence": f.seq,
                "subject": f.subject,
                "event_id": f.event_id,
                "commit_lsn": f.commit_lsn.to_string(),
                "commit_time": f.commit_time.map(rfc3339),
            })),
            "method": method,
            "how": self.how(),
            "scan_start": p.scan_start,
            "scanned": p.scanned,
            "direct_gets": p.gets,
            "stream_first": p.stream_first,
            "stream_last": p.stream_last,
            "truncated": p.truncated,
            "notes": p.notes,
            "position_map_rows": self.summary.as_ref().map(|s| s.rows),
            "position_map_slots": match &self.map {
                MapUse::Used(start) => Some(&start.slots),
                _ => None,
            },
            "checkpoint": self.checkpoint.map(|c| c.to_string()),
        })
    }

    /// Warnings to print with the answer.
    pub fn warnings(&self) -> Vec<String> {
        let p = &self.position;
        let mut out = p.notes.clone();
        if p.truncated {
            out.push(format!(
                "the stream's first message is {} : its limits removed older messages, and events committed at or after the target may have been among them",
                p.stream_first
            ));
        }
        if let MapUse::Unavailable(e) = &self.map {
            out.push(format!("position map not used: {e}"));
        }
        if let (Target::Lsn(x), Some(cp)) = (p.target, self.checkpoint)
            && x > cp
        {
            out.push(format!(
                "the target is after the relay's checkpoint {cp}: events committed since are not all in the stream yet"
            ));
        }
        out
    }
}
