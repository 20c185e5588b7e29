//! `outbox-relay position --lsn X | --time T`: the first stream sequence to replay from so that
//! every event committed at or after X (or T) is delivered, and how it was found: from the
//! relay's position map (`outbox_relay.position_map`) when it has an anchor before the target,
//! else by searching the stream (see `outbox-position` and `docs/replay.md`).

use std::time::{Duration, SystemTime};

use outbox_position::{Limits, Target};
use relay_core::Lsn;
use relay_postgres::checkpoint::MapSummary;
use relay_runtime::config::RelayConfig;
pub use relay_runtime::position::{Lookup, rfc3339};

use crate::exit::{Failure, FailureKind};

pub use relay_runtime::position::{parse_lsn, parse_time};

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
    #[arg(long, default_value = "5s", value_parser = relay_runtime::config::parse_duration)]
    pub clock_margin: Duration,
    /// Ignore the position map and search the stream only.
    #[arg(long)]
    pub no_map: bool,
}

impl Search {
    pub fn limits(&self) -> Limits {
        Limits {
            max_scan: self.max_scan,
            max_gets: self.max_gets,
            clock_margin: self.clock_margin,
            ..Limits::default()
        }
    }
}

/// Finds where `target` is in the configured stream ([`relay_runtime::position::lookup`]).
pub async fn lookup(
    config: &RelayConfig,
    js: &async_nats::jetstream::Context,
    target: Target,
    search: &Search,
) -> Result<Lookup, Failure> {
    relay_runtime::position::lookup(config, js, target, search.no_map, search.limits()).await
}

/// `outbox-relay position`.
pub async fn position(
    config: &RelayConfig,
    at: &At,
    search: &Search,
    as_json: bool,
) -> Result<(), Failure> {
    let nats = relay_nats::connect(&config.nats)
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, e))?;
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
