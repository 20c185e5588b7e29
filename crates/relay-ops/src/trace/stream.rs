//! The event's message: found by its `Nats-Msg-Id` among the messages on the row's subject,
//! read from where the row's time is in the stream; else in the relay's dead-letter subject;
//! else not published yet.

use std::ops::ControlFlow;
use std::time::{Duration, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer};
use futures::StreamExt as _;
use outbox_contract::{HEADER_DLQ_EVENT_ID, HEADER_DLQ_REASON, HEADER_MSG_ID};
use outbox_position::{Limits, Target};
use serde::Serialize;
use tokio::time::Instant;
use tokio_postgres::Client;

use super::{RowStep, TraceOptions};
use relay_runtime::config::RelayConfig;
use relay_runtime::position::rfc3339;

/// How long a read waits for a message the server said is there before it gives up. A read
/// ends without waiting once it has read what the stream holds (see [`Scan::each`]).
const IDLE: Duration = Duration::from_secs(2);

/// Where the event's message is.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PublishStep {
    /// In the stream.
    Published {
        sequence: u64,
        subject: String,
        /// When the stream stored it (RFC 3339).
        stored: String,
        /// What was read to find it.
        searched: String,
    },
    /// In the relay's dead-letter subject: the row could not be published as mapped.
    DeadLettered {
        sequence: u64,
        subject: String,
        stored: String,
        reason: String,
    },
    /// Not in the stream as far as the search read.
    NotFound {
        /// What was read.
        searched: String,
        /// The relay's stored checkpoint, and how far the server's WAL is past it (bytes):
        /// an event committed after the checkpoint may simply not be published yet.
        checkpoint: Option<String>,
        wal_past_checkpoint_bytes: Option<u64>,
    },
}

/// Finds the message of `event_id`; a JetStream failure is an error.
// Long: the search in order (the subject, then the dead-letter subject, then the positions),
// each a few lines
pub async fn find(
    config: &RelayConfig,
    client: &Client,
    js: &jetstream::Context,
    event_id: &str,
    row: &RowStep,
    options: &TraceOptions,
    deadline: Instant,
) -> anyhow::Result<PublishStep> {
    let stream_name = &config.nats.stream;
    let mut stream = js.get_stream(stream_name).await?;
    let info = stream.info().await?.clone();
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let (subject, row_time) = row.subject_and_time();
    let since = options
        .since
        .or_else(|| row_time.map(|us| UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)));
    // Where the search starts: the first message committed at or after the row's time, found as
    // `position` finds it (its commit-time headers and the position map are PostgreSQL's clock,
    // as a time column written by `now()` is, and a row is written before its commit; the
    // stream's store times, which `position` falls back to, get its clock margin); else the
    // stream's first.
    let (start, from_what) = match since {
        Some(at) => {
            let found = relay_runtime::position::lookup(
                config,
                js,
                Target::Time(at),
                false,
                Limits::default(),
            )
            .await
            .map_err(|f| f.error)?;
            (
                found.position.sequence.max(first),
                format!(
                    "from sequence {} (committed at or after {})",
                    found.position.sequence.max(first),
                    rfc3339(at)
                ),
            )
        }
        None => (
            first,
            format!(
                "from the stream's first sequence {first} (the row's time is not known: give --since)"
            ),
        ),
    };
    let filter = subject.unwrap_or(">").to_owned();
    let on = if subject.is_some() {
        format!("messages on {filter}")
    } else {
        "messages of any subject".into()
    };
    let scan = Scan {
        start,
        last,
        max: options.max_scan,
        deadline,
    };
    let (hit, read) = scan
        .run(&stream, &filter, true, |m| {
            header(m, HEADER_MSG_ID) == Some(event_id)
        })
        .await?;
    let searched = format!(
        "{} {on} {from_what} up to sequence {last} of stream {stream_name}{}",
        read.count,
        scan.cut(&read)
    );
    if let Some(found) = hit {
        let stored = stream.get_raw_message(found).await?;
        return Ok(PublishStep::Published {
            sequence: found,
            subject: stored.subject.to_string(),
            stored: time_text(stored.time.unix_timestamp_nanos()),
            searched,
        });
    }
    if let Some(dead_letter) = &config.relay.dead_letter_subject {
        let id_columns: Vec<&str> = config.outbox.iter().map(|t| t.event_id.as_str()).collect();
        // Dead letters carry no commit time for the start found above to count: from the
        // stream's first message, reading only the dead-letter subject.
        let from_first = Scan {
            start: first,
            ..scan
        };
        let (hit, _) = from_first
            .run(&stream, dead_letter, false, |m| {
                names_event(m, &id_columns, event_id)
            })
            .await?;
        if let Some(found) = hit {
            let letter = DeadLetter::read(&stream, found).await?;
            return Ok(PublishStep::DeadLettered {
                sequence: found,
                subject: letter.subject,
                stored: letter.stored,
                reason: letter.reason,
            });
        }
    }
    let checkpoint = relay_postgres::catalog::stored_checkpoint(client, &config.postgres.slot)
        .await
        .ok()
        .flatten()
        .map(|(lsn, _)| lsn);
    let wal = relay_postgres::catalog::outbox_stats::position_now(client)
        .await
        .ok()
        .map(|(_, lsn)| lsn);
    Ok(PublishStep::NotFound {
        searched,
        checkpoint: checkpoint.map(|c| c.to_string()),
        wal_past_checkpoint_bytes: checkpoint.zip(wal).map(|(c, w)| w.0.saturating_sub(c.0)),
    })
}

/// A bounded forward read of the stream.
#[derive(Debug, Clone, Copy)]
pub struct Scan {
    /// The first stream sequence to read.
    pub start: u64,
    /// The last stream sequence to read.
    pub last: u64,
    /// The most messages to read.
    pub max: u64,
    /// When to stop reading.
    pub deadline: Instant,
}

/// What a [`Scan`] read: how many messages, and why it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Messages read.
    pub count: u64,
    /// Why the read ended.
    pub end: End,
}

/// Why a [`Scan`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The visitor had what it wanted.
    Found,
    /// Every message on the filter up to `last` was read (or none was there to read).
    AllRead,
    /// `max` messages were read.
    Limit,
    /// The deadline came.
    Deadline,
    /// A message the server counted as pending did not come within `IDLE`.
    Idle,
}

/// Whether a read has what there is once it has handed on the message at stream sequence `seq`
/// with `pending` more on its filter after it (as the server counted when it delivered it): it is
/// at or past `last`, or nothing more is there. Waiting for another message then would only
/// wait out [`IDLE`].
fn read_all(seq: u64, pending: u64, last: u64) -> bool {
    seq >= last || pending == 0
}

impl Scan {
    /// Reads the messages on `filter` from `start` to `last` (at most `max`, until the
    /// deadline), headers only unless `payload`; the sequence of the first `wanted` one, and
    /// what was read.
    pub(super) async fn run(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &str,
        headers_only: bool,
        wanted: impl Fn(&jetstream::Message) -> bool,
    ) -> anyhow::Result<(Option<u64>, Read)> {
        let mut hit = None;
        let read = self
            .each(stream, filter, headers_only, |seq, m| {
                if wanted(m) {
                    hit = Some(seq);
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .await?;
        Ok((hit, read))
    }

    /// Hands each message on `filter` from `start` to `last` (at most `max`, until the deadline)
    /// with its stream sequence to `visit` until it breaks; what was read. It ends as soon as
    /// it has read what there is: the consumer's pending count at its creation, then each
    /// message's, says when nothing more is on the filter.
    pub async fn each(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &str,
        headers_only: bool,
        mut visit: impl FnMut(u64, &jetstream::Message) -> ControlFlow<()>,
    ) -> anyhow::Result<Read> {
        let mut read = Read {
            count: 0,
            end: End::AllRead,
        };
        if self.start > self.last || self.start == 0 {
            return Ok(read);
        }
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: filter.to_owned(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: self.start,
                },
                headers_only,
                ..Default::default()
            })
            .await?;
        if consumer.cached_info().num_pending == 0 {
            return Ok(read);
        }
        let mut messages = consumer.messages().await?;
        read.end = loop {
            if read.count >= self.max {
                break End::Limit;
            }
            let wait = IDLE.min(self.deadline.saturating_duration_since(Instant::now()));
            if wait.is_zero() {
                break End::Deadline;
            }
            let m = match tokio::time::timeout(wait, messages.next()).await {
                Ok(Some(m)) => m?,
                Ok(None) => break End::AllRead,
                Err(_) if Instant::now() >= self.deadline => break End::Deadline,
                Err(_) => break End::Idle,
            };
            read.count += 1;
            let info = m.info().map_err(|e| anyhow::anyhow!("{e}"))?;
            let (seq, pending) = (info.stream_sequence, info.pending);
            if visit(seq, &m).is_break() {
                break End::Found;
            }
            if read_all(seq, pending, self.last) {
                break End::AllRead;
            }
        };
        Ok(read)
    }

    /// What cut the search short, if anything did.
    fn cut(&self, read: &Read) -> String {
        match read.end {
            End::Limit => format!(
                " (stopped at the limit of {} messages: raise --max-scan, or give --since)",
                self.max
            ),
            End::Deadline => {
                " (stopped at the time limit: raise --timeout, or give --since)".into()
            }
            End::Idle => format!(
                " (stopped after {}s without the next message)",
                IDLE.as_secs()
            ),
            End::Found | End::AllRead => String::new(),
        }
    }
}

pub(super) fn header<'m>(m: &'m jetstream::Message, name: &str) -> Option<&'m str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
}

/// A dead letter of the relay names its row's event in the raw row (the payload, a JSON
/// object of the row's columns: one of `id_columns`, the mappings' event id columns) or, for an
/// event the broker held with other content, in a header.
fn names_event(m: &jetstream::Message, id_columns: &[&str], event_id: &str) -> bool {
    if header(m, HEADER_DLQ_EVENT_ID) == Some(event_id) {
        return true;
    }
    let Ok(row) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&m.payload)
    else {
        return false;
    };
    id_columns.iter().any(|column| match row.get(*column) {
        Some(serde_json::Value::String(s)) => s == event_id,
        Some(serde_json::Value::Number(n)) => n.to_string() == event_id,
        _ => false,
    })
}

/// A stored time (nanoseconds since 1970) as RFC 3339.
/// A dead letter (the relay's or a consumer library's parked copy) as stored.
pub(super) struct DeadLetter {
    pub(super) subject: String,
    /// When the stream stored it (RFC 3339).
    pub(super) stored: String,
    /// Its `Outbox-Dlq-Reason` (empty when it has none).
    pub(super) reason: String,
}

impl DeadLetter {
    /// Message `seq` of `stream`.
    pub(super) async fn read(stream: &jetstream::stream::Stream, seq: u64) -> anyhow::Result<Self> {
        let stored = stream.get_raw_message(seq).await?;
        Ok(Self {
            subject: stored.subject.to_string(),
            stored: time_text(stored.time.unix_timestamp_nanos()),
            reason: stored
                .headers
                .get(HEADER_DLQ_REASON)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default(),
        })
    }
}

fn time_text(unix_nanos: i128) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_nanos(unix_nanos.max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_has_all_at_the_last_sequence_or_with_nothing_pending() {
        assert!(read_all(7, 3, 7), "at the last sequence");
        assert!(read_all(5, 0, 9), "nothing more on the filter");
        assert!(!read_all(5, 1, 9), "one more before the last");
    }

    /// Against a real nats-server: reads of a subject whose last message is before the stream's
    /// last, of a subject with no message, up to a `last` before the stream's, and of everything
    /// end because they read what there is (never by waiting out `IDLE`); a limit and a find end
    /// as such.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_ends_when_it_has_read_what_the_stream_holds() -> anyhow::Result<()> {
        let nats = relay_testkit::NatsServer::start().await?;
        let js = jetstream::new(async_nats::connect(nats.url()).await?);
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: "SCAN".into(),
                subjects: vec!["t.>".into()],
                ..Default::default()
            })
            .await?;
        for subject in ["t.a", "t.b", "t.a", "t.b", "t.b"] {
            js.publish(subject, "x".into()).await?.await?;
        }
        let scan = Scan {
            start: 1,
            last: 5,
            max: 100,
            deadline: Instant::now() + Duration::from_secs(120),
        };
        let read = |scan: Scan, filter: &'static str| {
            let stream = stream.clone();
            async move {
                scan.each(&stream, filter, true, |_, _| ControlFlow::Continue(()))
                    .await
            }
        };
        let all = |count| Read {
            count,
            end: End::AllRead,
        };
        assert_eq!(read(scan, "t.a").await?, all(2), "t.a ends at 3 of 5");
        assert_eq!(read(scan, "t.none").await?, all(0), "nothing on t.none");
        assert_eq!(read(scan, "").await?, all(5), "everything");
        let to_3 = Scan { last: 3, ..scan };
        assert_eq!(read(to_3, "t.>").await?, all(3), "up to 3");
        let from_4 = Scan { start: 4, ..scan };
        assert_eq!(read(from_4, "t.a").await?, all(0), "no t.a from 4");
        let two = Scan { max: 2, ..scan };
        let limited = Read {
            count: 2,
            end: End::Limit,
        };
        assert_eq!(
            read(two, "t.b").await?,
            limited,
            "the limit, one more there"
        );
        let (hit, found) = scan.run(&stream, "t.b", true, |_| true).await?;
        let found_first = Read {
            count: 1,
            end: End::Found,
        };
        assert_eq!((hit, found), (Some(2), found_first));
        Ok(())
    }
}
