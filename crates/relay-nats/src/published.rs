//! What the stream already holds past a checkpoint, so a restart after a downtime longer than
//! the stream's `duplicate_window` does not store second copies.
//!
//! Holds when the relay is the only writer of messages with its event ids into the stream. It
//! reads the stream's tail — at most `MAX_SCANNED` messages, with an ordered consumer — and
//! collects the `Nats-Msg-Id` (and stream sequence, for the position map) of every message whose
//! `Outbox-Commit-Lsn` is at or after the checkpoint. The bound keeps start-up fast and memory small; a longer unconfirmed tail (a
//! crash in the middle of a transaction of more events than that) is still re-sent, and only
//! JetStream's duplicate window drops those copies.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::consumer;
pub use async_nats::jetstream::stream::State as StreamState;
use futures::StreamExt as _;
use relay_core::Lsn;
use relay_core::message::{HEADER_COMMIT_LSN, HEADER_EVENT_ID, HEADER_MSG_ID};

use crate::connection::JetStream;
use crate::error::NatsError;

/// Most messages one scan reads (about 1 MB of ids at most).
pub(crate) const MAX_SCANNED: u64 = 20_000;
/// Gap after which a scan gives up waiting for the next message.
const IDLE: Duration = Duration::from_secs(3);

/// Reads the headers of `stream`'s messages with an ordered consumer, from the sequence `start`
/// picks given the stream's state (`None`: read nothing), to the last message (or until the
/// stream is idle for a few seconds), handing each message's sequence and headers to `visit`.
/// Returns the stream's state when the scan began. One reader for every scan of the stream:
/// the start-up scan past the checkpoint and the backfill's check of ids already there.
pub async fn scan_headers(
    jetstream: &JetStream,
    stream: &str,
    headers_only: bool,
    start: impl FnOnce(&StreamState) -> Option<u64>,
    mut visit: impl FnMut(Option<u64>, &async_nats::HeaderMap),
) -> Result<StreamState, NatsError> {
    let stream_err = |e: &dyn std::fmt::Display| jetstream.stream_error(stream, e);
    let mut handle = jetstream
        .context()
        .get_stream(stream)
        .await
        .map_err(|e| stream_err(&e))?;
    let state = handle
        .info()
        .await
        .map_err(|e| stream_err(&e))?
        .state
        .clone();
    if state.messages == 0 {
        return Ok(state);
    }
    let Some(start_sequence) = start(&state) else {
        return Ok(state);
    };
    let reader = handle
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start_sequence.max(1),
            },
            headers_only,
            ..Default::default()
        })
        .await
        .map_err(|e| stream_err(&e))?;
    let mut messages = reader.messages().await.map_err(|e| stream_err(&e))?;
    loop {
        let msg = match tokio::time::timeout(IDLE, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(stream_err(&e)),
            Ok(None) | Err(_) => break,
        };
        let seq = msg.info().map(|i| i.stream_sequence).ok();
        if let Some(headers) = &msg.headers {
            visit(seq, headers);
        }
        if seq.is_none_or(|seq| seq >= state.last_sequence) {
            break;
        }
    }
    Ok(state)
}

/// Event ids in the last `max(at_least, MAX_SCANNED)` messages of `stream` whose transaction
/// committed at or after `since`, each with the sequence of its first copy there.
pub async fn published_since(
    jetstream: &JetStream,
    stream: &str,
    since: Lsn,
    at_least: u64,
) -> Result<HashMap<String, u64>, NatsError> {
    let window = at_least.max(MAX_SCANNED);
    let mut ids = HashMap::new();
    scan_headers(
        jetstream,
        stream,
        false,
        |state| {
            Some(
                state
                    .first_sequence
                    .max(state.last_sequence.saturating_sub(window - 1)),
            )
        },
        |seq, headers| {
            let at_or_after = headers
                .get(HEADER_COMMIT_LSN)
                .and_then(|l| Lsn::from_str(l.as_str()).ok())
                .is_some_and(|lsn| lsn >= since);
            // A scheduled event's delivered copy carries its id as `Outbox-Event-Id` (JetStream
            // strips `Nats-Msg-Id`, and removes the schedule once it has fired).
            let id = headers
                .get(HEADER_MSG_ID)
                .or_else(|| headers.get(HEADER_EVENT_ID));
            if at_or_after && let Some(id) = id {
                // 0: not known (the pipeline then uses no position for it).
                ids.entry(id.as_str().to_owned())
                    .or_insert(seq.unwrap_or(0));
            }
        },
    )
    .await?;
    Ok(ids)
}

/// Event ids of every message in `stream` whose transaction committed in `[from, to)`, or that
/// carries no commit position (`0/0`: a backfilled copy), each with its stream sequence: what
/// `outbox-relay restore` leaves alone. Reads the whole stream's headers (an ordered consumer).
pub async fn published_between(
    jetstream: &JetStream,
    stream: &str,
    from: Lsn,
    to: Lsn,
) -> Result<HashMap<String, u64>, NatsError> {
    let mut ids = HashMap::new();
    scan_headers(
        jetstream,
        stream,
        true,
        |state| Some(state.first_sequence),
        |seq, headers| {
            let lsn = headers
                .get(HEADER_COMMIT_LSN)
                .and_then(|l| Lsn::from_str(l.as_str()).ok());
            let in_window = lsn.is_some_and(|lsn| lsn == Lsn(0) || (lsn >= from && lsn < to));
            if in_window && let Some(id) = headers.get(HEADER_MSG_ID) {
                ids.entry(id.as_str().to_owned())
                    .or_insert(seq.unwrap_or(0));
            }
        },
    )
    .await?;
    Ok(ids)
}
