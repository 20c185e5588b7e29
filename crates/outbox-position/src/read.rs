//! Reading outbox-relay's stream: one message by sequence (a direct get through
//! `$JS.API.STREAM.MSG.GET`), the first message stored at or after a time, and a forward scan of
//! headers through an ephemeral ordered consumer.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{self, DeliverPolicy};
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use futures::StreamExt as _;
use outbox_contract::{HEADER_BACKFILL, HEADER_COMMIT_LSN, HEADER_COMMIT_TIME, HEADER_MSG_ID, Lsn};

use crate::{Error, Located, Target};

/// One message as the lookup sees it: where it is and, for the relay's own messages, which
/// commit it carries. `commit_lsn` is `None` for a message that does not position anything: no
/// or an unreadable `Outbox-Commit-Lsn`, `0/0`, or `Outbox-Backfill` (a row read from the table,
/// not from the WAL).
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub(crate) seq: u64,
    pub(crate) subject: String,
    pub(crate) commit_lsn: Option<Lsn>,
    pub(crate) commit_time: Option<SystemTime>,
    pub(crate) event_id: Option<String>,
}

impl Probe {
    pub(crate) fn new(seq: u64, subject: &str, headers: Option<&HeaderMap>) -> Self {
        let get = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
        let backfill = get(HEADER_BACKFILL).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let commit_lsn = get(HEADER_COMMIT_LSN)
            .and_then(|v| Lsn::from_str(v).ok())
            .filter(|lsn| *lsn != Lsn(0) && !backfill);
        Self {
            seq,
            subject: subject.to_owned(),
            commit_lsn,
            commit_time: commit_lsn
                .and(get(HEADER_COMMIT_TIME))
                .and_then(|v| humantime::parse_rfc3339(v).ok()),
            event_id: get(HEADER_MSG_ID).map(str::to_owned),
        }
    }

    /// Whether this message was committed at or after `target` (`None`: it positions nothing).
    pub(crate) fn reaches(&self, target: Target) -> Option<bool> {
        match target {
            Target::Lsn(x) => self.commit_lsn.map(|lsn| lsn >= x),
            Target::Time(t) => self.commit_time.map(|time| time >= t),
        }
    }

    pub(crate) fn located(&self) -> Option<Located> {
        Some(Located {
            seq: self.seq,
            subject: self.subject.clone(),
            commit_lsn: self.commit_lsn?,
            commit_time: self.commit_time,
            event_id: self.event_id.clone(),
        })
    }
}

fn stream_error(stream: &Stream, e: impl std::fmt::Display) -> Error {
    Error::Stream {
        stream: stream.cached_info().config.name.clone(),
        message: e.to_string(),
    }
}

/// The first message at or after `seq` (one `$JS.API.STREAM.MSG.GET`), `None` past the end.
pub(crate) async fn get_at_or_after(stream: &Stream, seq: u64) -> Result<Option<Probe>, Error> {
    match stream.get_first_raw_message_by_subject(">", seq).await {
        Ok(m) => Ok(Some(Probe::new(m.sequence, &m.subject, Some(&m.headers)))),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(stream_error(stream, e)),
    }
}

/// An ephemeral ordered consumer over `stream` from `policy`, reading headers only.
async fn reader(stream: &Stream, policy: DeliverPolicy) -> Result<consumer::pull::Ordered, Error> {
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: policy,
            headers_only: true,
            ..Default::default()
        })
        .await
        .map_err(|e| stream_error(stream, e))?;
    consumer
        .messages()
        .await
        .map_err(|e| stream_error(stream, e))
}

/// The sequence of the first message the server stored at or after `time`, if any arrives
/// within `idle`.
pub(crate) async fn first_stored_at_or_after(
    stream: &Stream,
    time: SystemTime,
    idle: Duration,
) -> Result<Option<u64>, Error> {
    let nanos = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let start_time =
        async_nats::datetime::from_nanos(nanos as i128).map_err(|e| stream_error(stream, e))?;
    let mut messages = reader(stream, DeliverPolicy::ByStartTime { start_time }).await?;
    match tokio::time::timeout(idle, messages.next()).await {
        Ok(Some(Ok(m))) => Ok(m.info().ok().map(|i| i.stream_sequence)),
        Ok(Some(Err(e))) => Err(stream_error(stream, e)),
        Ok(None) | Err(_) => {
            // Nothing arrived: that means "none stored since" only if the stream's last message
            // is older. Otherwise the reader stalled, and answering "none" would start a replay
            // past events the stream holds.
            let info = stream
                .get_info()
                .await
                .map_err(|e| stream_error(stream, e))?;
            if info.state.messages > 0 && info.state.last_timestamp >= start_time {
                return Err(stalled(
                    stream,
                    idle,
                    "the first message stored at that time",
                ));
            }
            Ok(None)
        }
    }
}

/// The error for a reader that delivered nothing within `idle` although the stream holds what
/// it was reading.
fn stalled(stream: &Stream, idle: Duration, reading: &str) -> Error {
    stream_error(
        stream,
        format!(
            "no message arrived within {idle:?} while reading {reading}, which the stream holds: the server is slow or the reader stalled; run the lookup again"
        ),
    )
}

/// What a forward scan found.
#[derive(Debug)]
pub(crate) struct Scanned {
    /// The first message at or after the start that reaches the target.
    pub(crate) found: Option<Probe>,
    /// Messages read.
    pub(crate) scanned: u64,
}

/// Reads headers forward from `from` until a message reaches `target`, the stream's sequence
/// `last` (as it was when the lookup began), `idle` without a message, or `max` messages read
/// (an error: the answer would not be known).
pub(crate) async fn scan(
    stream: &Stream,
    from: u64,
    last: u64,
    target: Target,
    idle: Duration,
    max: u64,
) -> Result<Scanned, Error> {
    let mut scanned = 0;
    if from > last {
        return Ok(Scanned {
            found: None,
            scanned,
        });
    }
    let policy = DeliverPolicy::ByStartSequence {
        start_sequence: from,
    };
    let mut messages = reader(stream, policy).await?;
    let mut next = from;
    loop {
        let m = match tokio::time::timeout(idle, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(stream_error(stream, e)),
            Ok(None) | Err(_) => {
                // The end only if nothing up to `last` is left to read (limits may have removed
                // it meanwhile); otherwise "not found" would send a replay past events.
                if get_at_or_after(stream, next)
                    .await?
                    .is_some_and(|p| p.seq <= last)
                {
                    return Err(stalled(
                        stream,
                        idle,
                        &format!("sequence {next} (up to {last})"),
                    ));
                }
                break;
            }
        };
        scanned += 1;
        let seq = m
            .info()
            .map_err(|e| stream_error(stream, e))?
            .stream_sequence;
        next = seq + 1;
        let probe = Probe::new(seq, &m.subject, m.headers.as_ref());
        if probe.reaches(target) == Some(true) {
            return Ok(Scanned {
                found: Some(probe),
                scanned,
            });
        }
        if seq >= last {
            break;
        }
        if scanned >= max {
            return Err(Error::ScanLimit {
                scanned,
                from,
                at: seq,
                target,
            });
        }
    }
    Ok(Scanned {
        found: None,
        scanned,
    })
}
