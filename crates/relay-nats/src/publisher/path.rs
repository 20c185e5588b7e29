//! The connection the publisher publishes on, behind one type: the relay's lean one
//! ([`crate::wire`]) or async-nats'. Which one is decided in one place, [`PathChoice::path`];
//! every publish mode then publishes (per message, batch members, commits, a fast batch's
//! replies) through the [`Path`] it returns, so no mode carries a branch per connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::message::PublishMessage;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PublishError, PublishErrorKind};

use super::headers::{HeaderState, headers};
use crate::wire::{BatchReplies, LeanConnection, RawOutcome};

/// The connection a publish goes on.
#[derive(Clone)]
pub(crate) enum Path {
    /// The relay's own lean connection.
    Lean(Arc<LeanConnection>),
    /// async-nats' connection: `[nats] publish_path = "async-nats"`, a client made elsewhere,
    /// or a server that refused the lean connection.
    AsyncNats(Arc<AsyncNats>),
}

/// What publishing through async-nats needs: its client, its JetStream context, and the
/// publisher's header template (the lean connection frames its headers itself).
pub(crate) struct AsyncNats {
    client: async_nats::Client,
    pub(super) context: Arc<jetstream::Context>,
    template: Arc<Mutex<HeaderState>>,
    /// Length of async-nats' reply subjects, `<inbox>.<id>.<token>`.
    reply_len: usize,
}

impl AsyncNats {
    /// Publishing through `context` (on `client`), with the headers of `template`.
    pub(super) fn new(
        client: async_nats::Client,
        context: Arc<jetstream::Context>,
        template: Arc<Mutex<HeaderState>>,
    ) -> Self {
        // A JetStream publish replies to `<inbox prefix>.<id>.<token>`, where
        // `<inbox prefix>.<token>` is a new inbox (async-nats' request multiplexer).
        let inbox = client.new_inbox();
        let token = inbox.rsplit('.').next().map_or(0, str::len);
        Self {
            reply_len: inbox.len() + 1 + token,
            client,
            context,
            template,
        }
    }

    /// The headers of `msg` published into `stream`, plus `extra`.
    pub(super) fn headers(
        &self,
        stream: &str,
        msg: &OutboundMessage,
        extra: &[(&str, &str)],
    ) -> async_nats::HeaderMap {
        let mut map = headers(&self.template, stream, msg);
        for (name, value) in extra {
            map.insert(*name, *value);
        }
        map
    }
}

/// The answer to an atomic batch's commit, as its path gives it.
pub(crate) enum CommitAnswer {
    Lean(RawOutcome),
    AsyncNats(Result<jetstream::publish::PublishAck, jetstream::context::PublishError>),
}

/// Where a fast batch's answers come: the lean connection's batch subscription, or an
/// async-nats subscription.
pub(crate) enum Answers {
    Lean(BatchReplies),
    AsyncNats(async_nats::Subscriber),
}

impl Answers {
    pub(crate) async fn next(&mut self) -> Option<bytes::Bytes> {
        match self {
            Self::Lean(replies) => replies.next().await,
            Self::AsyncNats(subscriber) => subscriber.next().await.map(|m| m.payload),
        }
    }

    pub(crate) async fn close(self) {
        if let Self::AsyncNats(mut subscriber) = self {
            let _ = subscriber.unsubscribe().await;
        }
    }
}

impl Path {
    /// Length of the longest reply subject a message published on its own carries.
    pub(crate) fn reply_len(&self) -> usize {
        match self {
            Self::Lean(lean) => lean.reply_len(),
            Self::AsyncNats(nats) => nats.reply_len,
        }
    }

    /// Length of the longest reply subject of a fast batch with `flow` messages between flow
    /// acks.
    pub(crate) fn batch_reply_len(&self, flow: usize) -> usize {
        match self {
            Self::Lean(lean) => lean.batch_reply_len(flow),
            Self::AsyncNats(nats) => {
                nats.reply_len + crate::wire::fast_batch_reply_suffix_len(flow)
            }
        }
    }

    /// The server's `max_payload` as this connection knows it (0: not yet known).
    pub(crate) fn max_payload(&self) -> usize {
        match self {
            Self::Lean(lean) => lean.max_payload(),
            Self::AsyncNats(nats) => nats.client.max_payload(),
        }
    }

    /// Waits (at most `wait` on the lean connection) until the server has read what was
    /// queued so far; the outcome does not matter to the callers.
    pub(crate) async fn flush(&self, wait: Duration) {
        match self {
            Self::Lean(lean) => drop(lean.flush(wait).await),
            Self::AsyncNats(nats) => drop(nats.client.flush().await),
        }
    }

    /// Publishes `msg` into `stream` with the `extra` header lines and no reply: an atomic
    /// batch's member before its commit, which the server does not answer.
    pub(crate) async fn publish_unanswered(
        &self,
        stream: &str,
        msg: &OutboundMessage,
        extra: &[(&str, &str)],
    ) -> Result<(), PublishError> {
        match self {
            Self::Lean(lean) => lean
                .publish_unanswered(stream, msg, extra)
                .map_err(crate::wire::publish_error),
            Self::AsyncNats(nats) => nats
                .client
                .publish_with_headers(
                    msg.subject.clone(),
                    nats.headers(stream, msg, extra),
                    msg.payload.clone(),
                )
                .await
                .map_err(|e| {
                    PublishError::new(
                        PublishErrorKind::Unknown,
                        format!("cannot publish to NATS: {e}"),
                    )
                }),
        }
    }

    /// Publishes `msg` into `stream` with the `extra` header lines (an atomic batch's commit);
    /// the future sees the answer as it came.
    pub(crate) async fn publish_commit(
        &self,
        stream: &str,
        msg: &Arc<OutboundMessage>,
        extra: &[(&str, &str)],
    ) -> Result<BoxFuture<'static, CommitAnswer>, PublishError> {
        match self {
            Self::Lean(lean) => {
                let answer = lean
                    .publish_raw(stream, msg, extra)
                    .map_err(crate::wire::publish_error)?;
                Ok(Box::pin(async move {
                    CommitAnswer::Lean(
                        answer
                            .await
                            .unwrap_or_else(|_| Err(crate::wire::connection_closed())),
                    )
                }))
            }
            Self::AsyncNats(nats) => {
                let publish = PublishMessage::build()
                    .headers(nats.headers(stream, msg, extra))
                    .payload(msg.payload.clone());
                match nats
                    .context
                    .send_publish(msg.subject.clone(), publish)
                    .await
                {
                    Ok(ack) => Ok(Box::pin(async move { CommitAnswer::AsyncNats(ack.await) })),
                    Err(e) => Ok(Box::pin(std::future::ready(CommitAnswer::AsyncNats(Err(
                        e,
                    ))))),
                }
            }
        }
    }

    /// A new fast batch's inbox (its last token is the batch's id) and the answers that come
    /// on `<inbox>.>`, subscribed at the server before any message of the batch is sent (on
    /// the lean connection, with `CONNECT`).
    pub(crate) async fn batch_replies(&self) -> Result<(String, Answers), String> {
        match self {
            Self::Lean(lean) => lean
                .batch_replies()
                .map(|replies| (replies.inbox.clone(), Answers::Lean(replies)))
                .map_err(|e| e.to_string()),
            Self::AsyncNats(nats) => {
                let inbox = nats.client.new_inbox();
                nats.client
                    .subscribe(format!("{inbox}.>"))
                    .await
                    .map(|s| (inbox, Answers::AsyncNats(s)))
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Publishes `msg` into `stream` replying to `reply`, with the `extra` header lines and no
    /// PubAck awaited: a fast batch's message, whose answers the batch's subscription reads.
    pub(crate) async fn publish_to(
        &self,
        stream: &str,
        msg: &OutboundMessage,
        reply: &str,
        extra: &[(&str, &str)],
    ) -> Result<(), String> {
        match self {
            Self::Lean(lean) => lean
                .publish_to(stream, msg, reply, extra)
                .map_err(|e| e.to_string()),
            Self::AsyncNats(nats) => nats
                .client
                .publish_with_reply_and_headers(
                    msg.subject.clone(),
                    reply.to_owned(),
                    nats.headers(stream, msg, extra),
                    msg.payload.clone(),
                )
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Publishes an empty message to `subject` replying to `reply` (a fast batch's commit).
    pub(crate) async fn publish_empty(&self, subject: &str, reply: &str) -> Result<(), String> {
        match self {
            Self::Lean(lean) => lean
                .publish_empty(subject, reply)
                .map_err(|e| e.to_string()),
            Self::AsyncNats(nats) => nats
                .client
                .publish_with_reply(subject.to_owned(), reply.to_owned(), bytes::Bytes::new())
                .await
                .map_err(|e| e.to_string()),
        }
    }
}

/// Which [`Path`] a publisher publishes on: the lean connection when the publisher has one (made
/// from settings, `[nats] publish_path = "lean"`), until the server refuses its first
/// connection; async-nats' otherwise.
#[derive(Clone)]
pub(crate) struct PathChoice {
    /// `Some(Path::Lean(_))` when the publisher has a lean connection.
    lean: Option<Path>,
    /// `Path::AsyncNats(_)`.
    nats: Path,
}

impl PathChoice {
    /// Publishing on `lean` when there is one, else (and once the server refused it) on `nats`.
    pub(super) fn new(lean: Option<Arc<LeanConnection>>, nats: AsyncNats) -> Self {
        Self {
            lean: lean.map(Path::Lean),
            nats: Path::AsyncNats(Arc::new(nats)),
        }
    }

    /// The path publishes go on unless the server refuses the lean connection: what the
    /// publisher's limits are sized for before its first connection.
    pub(super) fn preferred(&self) -> &Path {
        self.lean.as_ref().unwrap_or(&self.nats)
    }

    /// The path to publish on. The lean connection unless there is none or the server refused
    /// its first connection (a refusal only comes before it was ever up, so once refused it
    /// stays refused); async-nats' then. While the lean connection is down this waits for it,
    /// up to `wait` (its first connection: up to `connect_timeout` per configured server), and
    /// returns it whether or not it came back: a publish on a connection that is down fails at
    /// once as unknown, and the pipeline re-sends.
    #[inline]
    pub(crate) async fn path(&self, wait: Duration) -> &Path {
        match &self.lean {
            Some(path @ Path::Lean(lean)) if lean.ready(wait).await => path,
            _ => &self.nats,
        }
    }

    /// Whether publishes go on the lean connection: there is one, and the server did not refuse
    /// it (so far).
    pub(super) fn publishes_lean(&self) -> bool {
        matches!(&self.lean, Some(Path::Lean(lean)) if !lean.refused())
    }

    /// The server's `max_payload`: the lean connection's once it saw an INFO, async-nats' (same
    /// servers) before; 0 before the first INFO.
    pub(super) fn max_payload(&self) -> usize {
        match self.lean.as_ref().map_or(0, Path::max_payload) {
            0 => self.nats.max_payload(),
            n => n,
        }
    }
}
