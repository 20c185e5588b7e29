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
use crate::config::RelayConfig;
use crate::position::rfc3339;

/// How long a read waits for the next message before the search counts as done.
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
            let found =
                crate::position::lookup(config, js, Target::Time(at), false, Limits::default())
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
        "{read} {on} {from_what} up to sequence {last} of stream {stream_name}{}",
        scan.cut(read)
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
pub(crate) struct Scan {
    pub(crate) start: u64,
    pub(crate) last: u64,
    pub(crate) max: u64,
    pub(crate) deadline: Instant,
}

impl Scan {
    /// Reads the messages on `filter` from `start` to `last` (at most `max`, until the
    /// deadline), headers only unless `payload`; the sequence of the first `wanted` one, and how
    /// many were read.
    pub(super) async fn run(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &str,
        headers_only: bool,
        wanted: impl Fn(&jetstream::Message) -> bool,
    ) -> anyhow::Result<(Option<u64>, u64)> {
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
    /// with its stream sequence to `visit` until it breaks; how many were read.
    pub(crate) async fn each(
        &self,
        stream: &jetstream::stream::Stream,
        filter: &str,
        headers_only: bool,
        mut visit: impl FnMut(u64, &jetstream::Message) -> ControlFlow<()>,
    ) -> anyhow::Result<u64> {
        let mut read = 0;
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
        let mut messages = consumer.messages().await?;
        while read < self.max && Instant::now() < self.deadline {
            let wait = IDLE.min(self.deadline.saturating_duration_since(Instant::now()));
            let m = match tokio::time::timeout(wait, messages.next()).await {
                Ok(Some(m)) => m?,
                Ok(None) | Err(_) => break,
            };
            read += 1;
            let seq = m
                .info()
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .stream_sequence;
            if visit(seq, &m).is_break() || seq >= self.last {
                break;
            }
        }
        Ok(read)
    }

    /// What cut the search short, if anything did.
    fn cut(&self, read: u64) -> String {
        if read >= self.max {
            format!(
                " (stopped at the limit of {} messages: raise --max-scan, or give --since)",
                self.max
            )
        } else if Instant::now() >= self.deadline {
            " (stopped at the time limit: raise --timeout, or give --since)".into()
        } else {
            String::new()
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
