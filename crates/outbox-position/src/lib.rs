//! Where is commit LSN `X`, or commit time `T`, in outbox-relay's JetStream stream?
//!
//! [`locate`] returns the first stream sequence to replay from so that **every event committed
//! at or after the target is delivered**: the first message, from a start that every such event
//! has a copy at or after, that was committed at or after the target. Events committed before
//! the target can still come after it, but only as copies the relay re-sent after a fault
//! (consumers skip those by `Outbox-Commit-Lsn` or event id). See `docs/replay.md`.
//!
//! The start comes from one of two places:
//!
//! - **The relay's position map** ([`Hint`], read by the caller from
//!   `outbox_relay.position_map`): the anchor committed last before the target, and the lowest
//!   stream sequence of it and every later anchor. Exact whatever the ack order, re-sends and
//!   duplicates, with no assumption about clocks.
//! - **The stream alone**, when there is no anchor before the target (pruned, or no access to
//!   the relay's database): for an LSN, a bounded bisection by `Outbox-Commit-Lsn` (direct gets)
//!   finds a message committed before the target; every event committed at or after the target
//!   committed after it, so every copy of one was stored after that commit time. The scan starts
//!   at the first message stored at or after that time less [`Limits::clock_margin`]; for a
//!   time, at the first message stored at or after `T` less the margin. This holds while the
//!   clocks of PostgreSQL and the NATS servers differ by less than the margin, and commit times
//!   follow commit order (PostgreSQL's do, unless its clock steps back).
//!
//! From the start, a scan of message headers (an ephemeral ordered consumer, headers only)
//! reads forward to the first message that reaches the target.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

mod read;

use std::fmt;
use std::time::{Duration, SystemTime};

use async_nats::jetstream;
use async_nats::jetstream::consumer::{self, DeliverPolicy};
pub use outbox_contract::Lsn;

use read::{Probe, first_stored_at_or_after, get_at_or_after, scan};

/// What to find: the first event committed at or after a commit LSN or a commit time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Commit LSN (`Outbox-Commit-Lsn`).
    Lsn(Lsn),
    /// Commit time (`Outbox-Commit-Time`).
    Time(SystemTime),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Lsn(lsn) => write!(f, "commit LSN {lsn}"),
            Target::Time(t) => write!(f, "commit time {}", humantime::format_rfc3339_micros(*t)),
        }
    }
}

/// Where the relay's position map starts the scan (`outbox_relay.position_map`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    /// The anchor committed last before the target.
    pub anchor_lsn: Lsn,
    /// Its commit time.
    pub anchor_time: SystemTime,
    /// The lowest stream sequence of that anchor and every later one.
    pub start_seq: u64,
}

/// Bounds of one lookup.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Messages the scan reads at most before giving up with [`Error::ScanLimit`].
    pub max_scan: u64,
    /// Direct gets the bisection makes at most.
    pub max_gets: u32,
    /// How far the clocks of PostgreSQL and the NATS servers may differ (the stream-only
    /// search starts this much earlier).
    pub clock_margin: Duration,
    /// How long the scan waits for the next message before it counts as the end.
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_scan: 1_000_000,
            max_gets: 64,
            clock_margin: Duration::from_secs(5),
            idle: Duration::from_secs(5),
        }
    }
}

/// A message the lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// Its stream sequence.
    pub seq: u64,
    /// Its subject.
    pub subject: String,
    /// `Outbox-Commit-Lsn`.
    pub commit_lsn: Lsn,
    /// `Outbox-Commit-Time`.
    pub commit_time: Option<SystemTime>,
    /// `Nats-Msg-Id`.
    pub event_id: Option<String>,
}

/// How the scan's start was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// From the relay's position map.
    Map(Hint),
    /// Stream only, for an LSN: the bisection's closest message committed before the target
    /// (`None`: every message it read was at or after it), and the stored time the scan
    /// started from.
    Bisect {
        /// The message committed before the target with the highest commit LSN the bisection
        /// read.
        below: Option<Located>,
        /// Its commit time less the clock margin.
        from_time: Option<SystemTime>,
    },
    /// Stream only, for a time: the scan started at the first message stored at or after it.
    StoredTime {
        /// The target less the clock margin.
        from_time: SystemTime,
    },
    /// The stream holds no message.
    EmptyStream,
}

/// The answer of [`locate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// What was looked for.
    pub target: Target,
    /// The first sequence to deliver from: `found`'s, or the next one the stream will store
    /// when no message at or after the target is in it yet.
    pub sequence: u64,
    /// The first message at or after the target.
    pub found: Option<Located>,
    /// How the scan's start was found.
    pub method: Method,
    /// Where the scan started.
    pub scan_start: u64,
    /// Messages the scan read.
    pub scanned: u64,
    /// Direct gets (`$JS.API.STREAM.MSG.GET`) made.
    pub gets: u32,
    /// The stream's first and last sequence when the lookup began.
    pub stream_first: u64,
    /// See `stream_first`.
    pub stream_last: u64,
    /// The scan would have had to start before the stream's first message: the stream's limits
    /// (`max_age`, `max_msgs`, …) removed messages, and events committed at or after the target
    /// may have been among them.
    pub truncated: bool,
    /// Remarks on the lookup (a position map that does not fit the stream, …).
    pub notes: Vec<String>,
}

/// Why a lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// JetStream refused or did not answer.
    #[error("JetStream stream `{stream}`: {message}")]
    Stream {
        /// The stream.
        stream: String,
        /// What went wrong.
        message: String,
    },
    /// The scan read its limit of messages without reaching the target.
    #[error(
        "read {scanned} messages from sequence {from} (up to {at}) without reaching {target}: raise the scan limit, or keep the position map longer ([relay] position_retention)"
    )]
    ScanLimit {
        /// Messages read.
        scanned: u64,
        /// Where the scan started.
        from: u64,
        /// The last sequence read.
        at: u64,
        /// What was looked for.
        target: Target,
    },
}

fn stream_error(stream: &str, e: impl fmt::Display) -> Error {
    Error::Stream {
        stream: stream.to_owned(),
        message: e.to_string(),
    }
}

/// Finds the first stream sequence to replay `target` from; see the crate documentation. `hint`
/// is the relay's position map's start for the target, if it has one.
pub async fn locate(
    js: &jetstream::Context,
    stream_name: &str,
    target: Target,
    hint: Option<Hint>,
    limits: Limits,
) -> Result<Position, Error> {
    let mut stream = js
        .get_stream(stream_name)
        .await
        .map_err(|e| stream_error(stream_name, e))?;
    let state = stream
        .info()
        .await
        .map_err(|e| stream_error(stream_name, e))?
        .state
        .clone();
    let (first, last) = (state.first_sequence, state.last_sequence);
    let mut position = Position {
        target,
        sequence: last + 1,
        found: None,
        method: Method::EmptyStream,
        scan_start: last + 1,
        scanned: 0,
        gets: 0,
        stream_first: first,
        stream_last: last,
        truncated: false,
        notes: Vec::new(),
    };
    if state.messages == 0 {
        return Ok(position);
    }
    let hint = match hint {
        Some(h) if h.start_seq > last + 1 => {
            position.notes.push(format!(
                "position map ignored: its start {} is past the stream's last sequence {last} (a purged or re-created stream)",
                h.start_seq
            ));
            None
        }
        other => other,
    };
    let start = match hint {
        Some(hint) => {
            position.truncated = hint.start_seq < first;
            let start = hint.start_seq.max(first);
            position.method = Method::Map(hint);
            start
        }
        None => stream_only_start(&stream, target, first, last, limits, &mut position).await?,
    };
    position.scan_start = start;
    let scanned = scan(&stream, start, last, target, limits.idle, limits.max_scan).await?;
    position.scanned = scanned.scanned;
    if let Some(found) = scanned.found.as_ref().and_then(Probe::located) {
        position.sequence = found.seq;
        position.found = Some(found);
    }
    Ok(position)
}

/// The scan's start without a position map (see the crate documentation).
async fn stream_only_start(
    stream: &jetstream::stream::Stream,
    target: Target,
    first: u64,
    last: u64,
    limits: Limits,
    position: &mut Position,
) -> Result<u64, Error> {
    let from_time = match target {
        Target::Time(t) => {
            let from_time = t.checked_sub(limits.clock_margin).unwrap_or(t);
            position.method = Method::StoredTime { from_time };
            Some(from_time)
        }
        Target::Lsn(x) => {
            let below = bisect(stream, first, last, x, limits.max_gets, &mut position.gets).await?;
            let from_time = below
                .as_ref()
                .and_then(|b| b.commit_time)
                .map(|t| t.checked_sub(limits.clock_margin).unwrap_or(t));
            position.method = Method::Bisect {
                below: below.as_ref().and_then(Probe::located),
                from_time,
            };
            // Without a message before the target the whole stream is after it.
            if below.is_none() {
                position.truncated = first > 1;
                return Ok(first);
            }
            from_time
        }
    };
    let Some(from_time) = from_time else {
        return Ok(first);
    };
    Ok(
        match first_stored_at_or_after(stream, from_time, limits.idle).await? {
            Some(seq) => {
                position.truncated = seq == first && first > 1;
                seq
            }
            None => last + 1,
        },
    )
}

/// Bisects `[first, last]` by `Outbox-Commit-Lsn` with at most `max_gets` direct gets; returns
/// the message committed before `x` with the highest commit LSN it read. Messages that position
/// nothing (no commit LSN, backfill rows) are stepped over.
async fn bisect(
    stream: &jetstream::stream::Stream,
    first: u64,
    last: u64,
    x: Lsn,
    max_gets: u32,
    gets: &mut u32,
) -> Result<Option<Probe>, Error> {
    let (mut lo, mut hi) = (first, last);
    let mut below: Option<Probe> = None;
    while lo <= hi && *gets < max_gets {
        let mid = lo + (hi - lo) / 2;
        let mut at = mid;
        let probe = loop {
            if *gets >= max_gets {
                break None;
            }
            *gets += 1;
            match get_at_or_after(stream, at).await? {
                Some(p) if p.seq > hi => break None,
                Some(p) if p.commit_lsn.is_some() => break Some(p),
                Some(p) => at = p.seq + 1,
                None => break None,
            }
        };
        match probe {
            Some(p) if p.commit_lsn.is_some_and(|lsn| lsn < x) => {
                lo = p.seq + 1;
                if below.as_ref().is_none_or(|b| p.commit_lsn > b.commit_lsn) {
                    below = Some(p);
                }
            }
            // At or after the target, or nothing usable in [mid, hi].
            _ if mid == 0 => break,
            _ => hi = mid - 1,
        }
    }
    Ok(below)
}

/// Messages in `[from, until)` (`until`: `None` for the end of the stream) whose subject matches
/// one of `subjects` (all messages when empty), counted by the server: one ephemeral consumer
/// per filter and bound. Overlapping filters count a message once per filter.
pub async fn count(
    js: &jetstream::Context,
    stream_name: &str,
    from: u64,
    until: Option<u64>,
    subjects: &[String],
) -> Result<u64, Error> {
    let stream = js
        .get_stream(stream_name)
        .await
        .map_err(|e| stream_error(stream_name, e))?;
    let filters: Vec<String> = if subjects.is_empty() {
        vec![String::new()]
    } else {
        subjects.to_vec()
    };
    let mut total = 0;
    for filter in &filters {
        let mut n = pending(&stream, stream_name, from, filter).await?;
        if let Some(until) = until {
            n = n.saturating_sub(pending(&stream, stream_name, until.max(from), filter).await?);
        }
        total += n;
    }
    Ok(total)
}

/// Messages at or after `from` matching `filter` (all when empty).
async fn pending(
    stream: &jetstream::stream::Stream,
    stream_name: &str,
    from: u64,
    filter: &str,
) -> Result<u64, Error> {
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from.max(1),
            },
            ack_policy: consumer::AckPolicy::None,
            filter_subject: filter.to_owned(),
            inactive_threshold: Duration::from_secs(10),
            ..Default::default()
        })
        .await
        .map_err(|e| stream_error(stream_name, e))?;
    let info = consumer.cached_info();
    let n = info.num_pending;
    let _ = stream.delete_consumer(&info.name).await;
    Ok(n)
}
