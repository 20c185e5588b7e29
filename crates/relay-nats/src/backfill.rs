//! The backfill's side of JetStream: the `Outbox-Backfill` header its publisher adds
//! ([`crate::JetStreamPublisher::for_backfill`]), and the event ids the stream already holds for
//! a table.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};

use futures::StreamExt as _;
use relay_core::id_digest::{IdDigest, SharedIds, id_digest};
use relay_core::message::{HEADER_BACKFILL, HEADER_MSG_ID, HEADER_TABLE, OutboundMessage};
use tokio_util::sync::CancellationToken;

use crate::connection::JetStream;
use crate::error::NatsError;

/// `Outbox-Backfill: true`, allocated once.
static BACKFILL_HEADER: LazyLock<(Arc<str>, Arc<str>)> =
    LazyLock::new(|| (HEADER_BACKFILL.into(), "true".into()));

/// `msg` with `Outbox-Backfill: true` as its last header.
pub(crate) fn marked(msg: &Arc<OutboundMessage>) -> Arc<OutboundMessage> {
    let mut marked = OutboundMessage::clone(msg);
    marked.headers.push(BACKFILL_HEADER.clone());
    Arc::new(marked)
}

/// Watches the stream's subjects with a plain NATS subscription and notes the event id of every
/// message of `table` that is not the backfill's own: the relay's live publishes. Subscribed
/// (and confirmed by the server) before the stream's ids are read, so together they cover
/// every row the stream holds or the relay is publishing. A message the subscription misses
/// (no subscribe permission, a slow consumer) only means the backfill sends that row too.
/// Ends when `stop` is cancelled, after noting what the server sent before the unsubscribe.
pub async fn watch_live(
    client: &async_nats::Client,
    subjects: &[String],
    table: &str,
    stop: &CancellationToken,
) -> (SharedIds, Vec<tokio::task::JoinHandle<()>>) {
    let live = SharedIds::default();
    let mut tasks = Vec::new();
    for subject in subjects {
        let mut subscription = match client.subscribe(subject.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(subject = %subject, error = %e, "cannot watch the relay's live messages: rows it publishes during the backfill may be sent by both");
                continue;
            }
        };
        let (live, table, stop) = (live.clone(), table.to_owned(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let note = |msg: async_nats::Message| {
                let Some(headers) = &msg.headers else {
                    return;
                };
                if headers.get(HEADER_BACKFILL).is_none()
                    && headers.get(HEADER_TABLE).map(|t| t.as_str()) == Some(table.as_str())
                    && let Some(id) = headers.get(HEADER_MSG_ID)
                {
                    live.insert(id.as_str());
                }
            };
            loop {
                tokio::select! {
                    msg = subscription.next() => match msg {
                        Some(msg) => note(msg),
                        None => return,
                    },
                    () = stop.cancelled() => break,
                }
            }
            // The subscription's queue ends after what the server sent before the UNSUB.
            let _ = subscription.unsubscribe().await;
            while let Some(msg) = subscription.next().await {
                note(msg);
            }
        }));
    }
    // The server has the subscriptions once it answered a ping sent after them.
    if let Err(e) = client.flush().await {
        tracing::warn!(error = %e, "cannot confirm the watch of the relay's live messages");
    }
    (live, tasks)
}

/// What the stream holds for a table.
#[derive(Debug)]
pub enum StreamIds {
    /// Fingerprints of the event ids of every message of `table` in the stream.
    Read(HashSet<IdDigest>),
    /// The stream holds more messages than the limit: not read.
    TooLarge(u64),
}

/// Fingerprints of the `Nats-Msg-Id` of every message in `stream` whose `Outbox-Table` is
/// `table`, read with an ordered, headers-only consumer, when the stream holds at most `limit`
/// messages.
pub async fn stream_ids(
    jetstream: &JetStream,
    stream: &str,
    table: &str,
    limit: u64,
) -> Result<StreamIds, NatsError> {
    let mut ids = HashSet::new();
    let mut too_large = None;
    crate::published::scan_headers(
        jetstream,
        stream,
        true,
        |state| {
            if state.messages > limit {
                too_large = Some(state.messages);
                return None;
            }
            Some(state.first_sequence)
        },
        |_, headers| {
            if headers.get(HEADER_TABLE).map(|t| t.as_str()) == Some(table)
                && let Some(id) = headers.get(HEADER_MSG_ID)
            {
                ids.insert(id_digest(id.as_str()));
            }
        },
    )
    .await?;
    Ok(match too_large {
        Some(messages) => StreamIds::TooLarge(messages),
        None => StreamIds::Read(ids),
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use relay_core::Lsn;

    use super::*;

    #[test]
    fn the_backfill_header_is_added_last_to_a_copy() {
        let original = Arc::new(OutboundMessage {
            subject: "outbox.x".into(),
            event_id: "e1".into(),
            headers: vec![("Outbox-Tx-Index".into(), "0".into())],
            shared_headers: 0,
            payload: Bytes::from_static(b"{}"),
            table: "public.outbox".into(),
            commit_lsn: Lsn(0),
            commit_time_micros: 0,
        });
        let sent = marked(&original);
        let names: Vec<&str> = sent.headers.iter().map(|(n, _)| &**n).collect();
        assert_eq!(names, ["Outbox-Tx-Index", HEADER_BACKFILL]);
        assert_eq!(&*sent.headers[1].1, "true");
        // A re-send marks the original again, so the header is never there twice.
        assert_eq!(
            original.headers.len(),
            1,
            "the pipeline's message is unchanged"
        );
    }
}
