//! What the stream already holds past a checkpoint, so a restart after a downtime longer than
//! the stream's `duplicate_window` does not store second copies.
//!
//! Holds when the relay is the only writer of messages with its event ids into the stream: it
//! reads the stream backwards from its last message and collects the `Nats-Msg-Id` of every
//! message whose `Outbox-Commit-Lsn` is at or after the checkpoint. Messages are stored in
//! commit order except around retries, so the scan goes on for `slack` messages older than the
//! checkpoint before it stops.

use std::collections::HashSet;
use std::str::FromStr;

use async_nats::jetstream;
use relay_core::Lsn;
use relay_core::message::{HEADER_COMMIT_LSN, HEADER_MSG_ID};

use crate::NatsError;

/// Most messages one scan reads, to bound start-up time.
const MAX_SCANNED: u64 = 1_000_000;

/// Event ids in `stream` from transactions committed at or after `since`.
pub async fn published_since(
    context: &jetstream::Context,
    stream: &str,
    since: Lsn,
    slack: u64,
) -> Result<HashSet<String>, NatsError> {
    let stream_err = |e: &dyn std::fmt::Display| NatsError::Stream {
        stream: stream.to_owned(),
        reason: e.to_string(),
    };
    let mut handle = context
        .get_stream(stream)
        .await
        .map_err(|e| stream_err(&e))?;
    let state = handle
        .info()
        .await
        .map_err(|e| stream_err(&e))?
        .state
        .clone();
    let mut ids = HashSet::new();
    if state.messages == 0 {
        return Ok(ids);
    }
    let (first, last) = (state.first_sequence.max(1), state.last_sequence);
    let mut older_in_a_row = 0;
    let mut seq = last;
    while seq >= first && last - seq < MAX_SCANNED && older_in_a_row <= slack {
        let msg = match handle.get_raw_message(seq).await {
            Ok(m) => Some(m),
            // Deleted or purged sequence numbers leave holes.
            Err(e) if e.to_string().contains("no message found") => None,
            Err(e) => return Err(stream_err(&e)),
        };
        let at_or_after = msg.as_ref().and_then(|m| {
            let lsn = m.headers.get(HEADER_COMMIT_LSN)?;
            let lsn = Lsn::from_str(lsn.as_str()).ok()?;
            (lsn >= since).then(|| {
                m.headers
                    .get(HEADER_MSG_ID)
                    .map(|id| id.as_str().to_owned())
            })?
        });
        match at_or_after {
            Some(id) => {
                ids.insert(id);
                older_in_a_row = 0;
            }
            None => older_in_a_row += 1,
        }
        seq -= 1;
    }
    Ok(ids)
}
