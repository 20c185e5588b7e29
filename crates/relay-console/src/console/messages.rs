//! The stream's messages as the console lists them: the latest on a subject, read from a bounded
//! window at the stream's end, and one message by sequence.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::time::{Duration, SystemTime};

use async_nats::HeaderMap;
use async_nats::jetstream;
use serde::Serialize;
use tokio::time::Instant;

use relay_ops::trace::stream::Scan;

/// How long one listing may read.
const READ_FOR: Duration = Duration::from_secs(5);

/// Payload bytes shown in a listing (the whole payload is in [`one`]).
const PREVIEW: usize = 240;

/// A message of the stream.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Shown {
    pub seq: u64,
    pub subject: String,
    /// When the stream stored it (RFC 3339).
    pub stored_at: String,
    pub headers: Vec<(String, String)>,
    /// The payload as text (lossy), cut to a preview in listings.
    pub payload: String,
    /// Bytes of the whole payload.
    pub payload_bytes: usize,
}

/// A listing and what it read.
#[derive(Debug, Serialize)]
pub(crate) struct Listing {
    /// Newest first.
    pub messages: Vec<Shown>,
    /// The sequences the search read, `[first, last]`.
    pub searched: (u64, u64),
    /// The stream's last sequence when the search started.
    pub stream_last: u64,
}

fn headers_of(headers: Option<&HeaderMap>) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = headers
        .map(|h| {
            h.iter()
                .flat_map(|(name, values)| {
                    values
                        .iter()
                        .map(move |v| (name.to_string(), v.as_str().to_owned()))
                })
                .collect()
        })
        .unwrap_or_default();
    all.sort();
    all
}

fn preview(payload: &[u8]) -> String {
    let text = String::from_utf8_lossy(payload);
    match text.char_indices().nth(PREVIEW) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.into_owned(),
    }
}

/// A time as async-nats gives it (Unix nanoseconds), as RFC 3339.
fn stored_at(unix_nanos: i128) -> String {
    let nanos = u64::try_from(unix_nanos).unwrap_or(0);
    relay_runtime::position::rfc3339(SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos))
}

/// The newest `limit` messages on `subject` (the stream's subjects when `None`) among the last
/// `window` messages of the stream.
pub(crate) async fn latest(
    js: &jetstream::Context,
    stream_name: &str,
    subject: Option<&str>,
    limit: usize,
    window: u64,
) -> anyhow::Result<Listing> {
    let mut stream = js.get_stream(stream_name).await?;
    let state = stream.info().await?.state.clone();
    let last = state.last_sequence;
    let first = state
        .first_sequence
        .max(last.saturating_sub(window.saturating_sub(1)))
        .max(1);
    let scan = Scan {
        start: first,
        last,
        max: window,
        deadline: Instant::now() + READ_FOR,
    };
    let mut kept: VecDeque<Shown> = VecDeque::with_capacity(limit);
    let mut read_to = first.saturating_sub(1);
    scan.each(&stream, subject.unwrap_or(""), false, |seq, m| {
        read_to = seq;
        if kept.len() == limit {
            kept.pop_front();
        }
        let stored = m
            .info()
            .map(|i| i.published.unix_timestamp_nanos())
            .unwrap_or_default();
        kept.push_back(Shown {
            seq,
            subject: m.subject.to_string(),
            stored_at: stored_at(stored),
            headers: headers_of(m.headers.as_ref()),
            payload: preview(&m.payload),
            payload_bytes: m.payload.len(),
        });
        ControlFlow::Continue(())
    })
    .await?;
    Ok(Listing {
        messages: kept.into_iter().rev().collect(),
        searched: (first, read_to),
        stream_last: last,
    })
}

/// Message `seq` whole; `None` when the stream does not hold it.
pub(crate) async fn one(
    js: &jetstream::Context,
    stream_name: &str,
    seq: u64,
) -> anyhow::Result<Option<Shown>> {
    let stream = js.get_stream(stream_name).await?;
    let raw = match stream.get_raw_message(seq).await {
        Ok(raw) => raw,
        Err(e) if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Some(Shown {
        seq,
        subject: raw.subject.to_string(),
        stored_at: stored_at(raw.time.unix_timestamp_nanos()),
        headers: headers_of(Some(&raw.headers)),
        payload: String::from_utf8_lossy(&raw.payload).into_owned(),
        payload_bytes: raw.payload.len(),
    }))
}
