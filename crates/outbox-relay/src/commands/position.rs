//! `outbox-relay position --lsn X | --time T`: the first stream sequence to replay from so that
//! every event committed at or after X (or T) is delivered, and how it was found: from the
//! relay's position map (`outbox_relay.position_map`) when it has an anchor before the target,
//! else by searching the stream (see `outbox-position` and `docs/replay.md`).

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use outbox_position::{Hint, Limits, Method, Position, Target};
use relay_core::Lsn;
use relay_postgres::checkpoint::{
    MapStart, MapSummary, MapTarget, map_start, map_start_all_slots, map_summary,
};
use serde_json::json;

use crate::config::RelayConfig;
use crate::exit::{Exit, ExitKind};

/// A commit LSN as PostgreSQL prints it.
pub fn parse_lsn(s: &str) -> Result<Lsn, String> {
    Lsn::from_str(s.trim()).map_err(|e| format!("{e} (expected an LSN such as 0/16B3748)"))
}

/// RFC 3339 (`2026-11-29T11:38:44Z`, `2026-11-29 11:38:44`, UTC unless an offset is given), or
/// `<duration> ago` (`15m ago`).
pub fn parse_time(s: &str) -> Result<SystemTime, String> {
    let s = s.trim();
    if let Some(ago) = s.strip_suffix("ago") {
        let d = humantime_serde::re::humantime::parse_duration(ago.trim())
            .map_err(|e| format!("`{s}`: {e}"))?;
        return SystemTime::now()
            .checked_sub(d)
            .ok_or_else(|| format!("`{s}` is before 1970"));
    }
    humantime_serde::re::humantime::parse_rfc3339_weak(s).map_err(|e| {
        format!("`{s}`: {e} (expected RFC 3339, e.g. 2026-11-29T11:38:44Z, or e.g. `15m ago`)")
    })
}

/// `position`'s target.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct At {
    /// Commit LSN, as PostgreSQL prints it (`0/16B3748`).
    #[arg(long, value_parser = parse_lsn)]
    pub lsn: Option<Lsn>,
    /// Commit time: RFC 3339 (`2026-11-29T11:38:44Z`) or `<duration> ago` (`15m ago`).
    #[arg(long, value_parser = parse_time)]
    pub time: Option<SystemTime>,
}

impl At {
    pub fn target(&self) -> Target {
        match (self.lsn, self.time) {
            (Some(lsn), _) => Target::Lsn(lsn),
            (None, Some(t)) => Target::Time(t),
            // clap's group makes one of them required.
            (None, None) => Target::Lsn(Lsn(0)),
        }
    }
}

/// How a lookup may search.
#[derive(Debug, Clone, clap::Args)]
pub struct Search {
    /// Read at most this many messages from where the search starts.
    #[arg(long, default_value_t = Limits::default().max_scan)]
    pub max_scan: u64,
    /// Direct gets the stream-only search may make (bisection by `Outbox-Commit-Lsn`).
    #[arg(long, default_value_t = Limits::default().max_gets)]
    pub max_gets: u32,
    /// How far the clocks of PostgreSQL and the NATS servers may differ; the stream-only search
    /// starts this much earlier.
    #[arg(long, default_value = "5s", value_parser = crate::config::parse_duration)]
    pub clock_margin: Duration,
    /// Ignore the position map and search the stream only.
    #[arg(long)]
    pub no_map: bool,
}

impl Search {
    fn limits(&self) -> Limits {
        Limits {
            max_scan: self.max_scan,
            max_gets: self.max_gets,
            clock_margin: self.clock_margin,
            ..Limits::default()
        }
    }
}

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

/// Finds where `target` is in the configured stream.
pub async fn lookup(
    config: &RelayConfig,
    js: &async_nats::jetstream::Context,
    target: Target,
    search: &Search,
) -> Result<Lookup, Exit> {
    let (map, summary, checkpoint) = if search.no_map {
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
    let position = outbox_position::locate(js, &config.nats.stream, target, hint, search.limits())
        .await
        .map_err(|e| match e {
            outbox_position::Error::ScanLimit { .. } => Exit::new(ExitKind::Config, e),
            outbox_position::Error::Stream { .. } => Exit::new(ExitKind::Unavailable, e),
        })?;
    Ok(Lookup {
        position,
        map,
        summary,
        checkpoint,
    })
}

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

/// `outbox-relay position`.
pub async fn position(
    config: &RelayConfig,
    at: &At,
    search: &Search,
    as_json: bool,
) -> Result<(), Exit> {
    let nats = relay_nats::connect(&config.nats)
        .await
        .map_err(|e| Exit::new(ExitKind::Unavailable, e))?;
    let js = nats.jetstream().context().clone();
    let found = lookup(config, &js, at.target(), search).await?;
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&found.json()).unwrap_or_default()
        );
        return Ok(());
    }
    let p = &found.position;
    println!("sequence {}", p.sequence);
    match &p.found {
        Some(f) => println!(
            "  first message committed at or after {}: #{} {} (event {}, commit LSN {}, committed {})",
            p.target,
            f.seq,
            f.subject,
            f.event_id.as_deref().unwrap_or("-"),
            f.commit_lsn,
            f.commit_time.map(rfc3339).unwrap_or_default()
        ),
        None => println!(
            "  no message committed at or after {} is in the stream yet: the next one stored",
            p.target
        ),
    }
    println!("  {}", found.how());
    let map = match &found.summary {
        Some(MapSummary {
            rows,
            range: Some((oldest, newest)),
        }) => format!(
            "position map: {rows} anchors, {} ({}) to {} ({})",
            oldest.commit_lsn,
            rfc3339(oldest.commit_time),
            newest.commit_lsn,
            rfc3339(newest.commit_time)
        ),
        Some(_) => "position map: empty".into(),
        None => "position map: not read".into(),
    };
    let checkpoint = found
        .checkpoint
        .map(|c| format!("; relay checkpoint {c}"))
        .unwrap_or_default();
    println!(
        "  stream {}: sequences {}..{}; {map}{checkpoint}",
        config.nats.stream, p.stream_first, p.stream_last
    );
    for warning in found.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(())
}
