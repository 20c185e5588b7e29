//! The JetStream publisher: one `send` per message in commit order, acks awaited separately so
//! many are outstanding at once. Its [`Framing`] (`choice.rs`, decided once) says how events go
//! out: each on its own through the per-message core ([`MessagePublisher`], `message.rs`), through
//! the sequence chain's task (`sequenced`), or through the batch framer (`batching`, with
//! `atomic` or `fast` batches) that batches what it can and publishes the rest through the core. Every mode publishes on one connection, the [`path::Path`] its
//! [`path::PathChoice`] gives: the lean one ([`crate::wire`], `lean.rs`), or async-nats' (`nats.rs`)
//! with `[nats] publish_path = "async-nats"` or once the server refused the lean connection.

use std::borrow::Cow;
use std::sync::Arc;

use async_nats::jetstream;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use relay_core::message::{HEADER_BACKFILL, HEADER_EXPECTED_STREAM, OutboundMessage};
use relay_core::route::MessageLimits;
use relay_core::stage::{
    AckCheck, PubReceipt, PublishError, PublishErrorKind, PublishHook, PublishHooks, Publisher,
    Watches,
};

use self::batching::Batches;
use self::batching::atomic::Atomic;
use self::batching::fast::{self, Fast};
use self::framing::Framer;
use self::message::{Condition, MessagePublisher};
use crate::connection::{JetStream, NatsConnection};
use crate::settings::PublishMode;

mod ack_check;
pub(crate) mod batching;
mod chain;
mod choice;
mod framing;
pub(crate) mod headers;
mod lean;
mod message;
mod nats;
mod path;
mod sequenced;

pub use choice::{ChoiceNote, Framing, StreamTakes};
pub(crate) use message::classify;

/// Publishes outbound messages into one JetStream stream.
#[derive(Clone)]
pub struct JetStreamPublisher {
    /// Publishes each message on its own: every message in per-message mode; in the batch modes
    /// what a batch does not take (the framing task holds a copy).
    core: MessagePublisher,
    /// How events go out.
    framing: Framing,
    /// The framing task's handle, for the framings that have one (batches, the sequence chain).
    framer: Option<Arc<Framer>>,
    /// Length of the longest reply subject a publish may carry: the per-message core's, or in
    /// fast batches the batch's reply subject.
    reply_len: usize,
    /// What watches each message and its outcome (tracing, `restore`'s check of duplicates).
    hooks: PublishHooks,
    /// A backfill's publisher: every message marked `Outbox-Backfill: true`, none with a
    /// condition on the stream's last message ([`Self::for_backfill`]).
    backfill: bool,
}

impl std::fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamPublisher")
            .field("stream", &self.core.stream)
            .field("framing", &self.framing)
            .finish_non_exhaustive()
    }
}

impl JetStreamPublisher {
    /// A publisher into `stream` on `connection`. `ack_timeout` bounds the wait for each PubAck;
    /// `max_in_flight` sizes the client's own window so it never blocks before the pipeline's
    /// does. Its [`Publisher::limits`] are the server's `max_payload` and the connection's
    /// `[nats] max_control_line` / `max_server_closes`; server closes and refused publishes are
    /// the ones the connection saw.
    pub fn new(
        connection: &NatsConnection,
        stream: &str,
        ack_timeout: std::time::Duration,
        max_in_flight: usize,
    ) -> Self {
        let core = MessagePublisher::new(connection, stream, ack_timeout, max_in_flight);
        Self {
            reply_len: core.reply_len(),
            core,
            framing: Framing::ByEventId,
            framer: None,
            hooks: PublishHooks::default(),
            backfill: false,
        }
    }

    /// This publisher for a backfill: every message gets `Outbox-Backfill: true` as its last
    /// header, and none names its predecessor. A backfill publishes old rows in key order beside
    /// the relay's live events, not in commit order (docs/guarantees.md).
    #[must_use]
    pub fn for_backfill(mut self) -> Self {
        self.backfill = true;
        self.with_framing(Framing::Alone, 0)
    }

    /// What goes out for `msg` sent after `after`: a backfill's marked copy without a condition,
    /// or `msg` as it is.
    fn handed<'m>(
        &self,
        msg: &'m Arc<OutboundMessage>,
        after: Option<&'m str>,
    ) -> (Cow<'m, Arc<OutboundMessage>>, Option<&'m str>) {
        if self.backfill {
            (Cow::Owned(crate::backfill::marked(msg)), None)
        } else {
            (Cow::Borrowed(msg), after)
        }
    }

    /// This publisher, with `hook` called for every message it hands over and its outcome.
    #[must_use]
    pub fn with_hook(mut self, hook: Arc<dyn PublishHook>) -> Self {
        self.hooks = self.hooks.with(hook);
        self
    }

    /// This publisher in `mode` where the server and `stream` take it, else each message on its
    /// own ([`Framing::choose`], which says why in one warning). `max_in_flight` bounds a batch:
    /// the pipeline stops reading at that many outstanding events, so a larger atomic batch could
    /// never commit, and a fast batch needs its flow acks more often than that.
    #[must_use]
    pub fn with_publish_mode(
        self,
        mode: PublishMode,
        stream: StreamTakes,
        max_in_flight: usize,
    ) -> Self {
        let version = self.core.context().client().server_info().version;
        let (framing, notes) = Framing::choose(
            mode,
            stream,
            &self.core.stream,
            &version,
            self.core.domain.is_some(),
        );
        for note in notes {
            match note {
                ChoiceNote::Info(line) => {
                    tracing::info!(stream = %self.core.stream, server_version = %version, "{line}");
                }
                ChoiceNote::Warn(line) => {
                    tracing::warn!(stream = %self.core.stream, server_version = %version, "{line}");
                }
            }
        }
        self.with_framing(framing, max_in_flight)
    }

    /// This publisher framing events as `framing` says (starting its framing task, if it has
    /// one). Call once, on a new publisher.
    // What a batch does not take (a one-message transaction, a message left at the end of a
    // transaction, a dead letter) goes out in commit order between the batches, so on their
    // connection: the server orders nothing across two connections (a 1-row transaction on one
    // was stored after the batch of the next on the other, e2e fast_batch, under load). So every
    // message of every mode, every batch commit and every answer go on one connection: the lean
    // one, or async-nats' where the publisher publishes through it. The framing task publishes
    // what it does not batch through the per-message core.
    #[must_use]
    pub fn with_framing(mut self, framing: Framing, max_in_flight: usize) -> Self {
        self.core.by_sequence = framing.by_sequence();
        let per_message = self.core.clone();
        self.framer = match framing {
            Framing::Alone | Framing::ByEventId => None,
            Framing::BySequence => Some(sequenced::start(per_message)),
            Framing::AtomicBatch { .. } => Some(batching::start(
                per_message,
                framing,
                Batches::Atomic(Atomic::new(max_in_flight)),
            )),
            Framing::FastBatch => {
                let flow = fast::flow(max_in_flight);
                // Limits must hold for a fast batch's longer reply subject.
                let batch_reply_len = self.core.paths.preferred().batch_reply_len(flow);
                self.reply_len = self.reply_len.max(batch_reply_len);
                Some(batching::start(
                    per_message,
                    framing,
                    Batches::Fast(Fast::new(flow)),
                ))
            }
        }
        .map(Arc::new);
        self.framing = framing;
        self
    }

    /// How events go out.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// From now on, in fast-batch mode, the messages of transactions committed at or before
    /// `lsn` go out on their own: a fast batch's flow acknowledgements do not say which messages
    /// JetStream dropped as duplicates, while a message on its own is answered `duplicate`, and
    /// that answer is read back. For what an earlier run may have published and the stream no
    /// longer holds (deleted or purged inside the duplicate window). Other framings say
    /// duplicates in every answer: nothing changes for them.
    pub fn alone_through(&self, lsn: relay_core::Lsn) {
        if self.framing.fast_batches()
            && let Some(framer) = &self.framer
        {
            framer.alone_through(lsn);
        }
    }

    /// Whether messages go through the lean publish path (its own connection, see
    /// `crate::wire`) rather than async-nats: made from settings, and not refused by the server.
    pub fn publishes_lean(&self) -> bool {
        self.core.publishes_lean()
    }

    /// The headers of `msg`: its shared headers from the transaction's template, then its own.
    /// Exactly what [`relay_core::stage::Publisher::send`] puts on the wire; public so consumer
    /// tests publish (and compare against) the relay's real header set instead of a
    /// hand-written copy.
    pub fn headers(&self, msg: &OutboundMessage) -> async_nats::HeaderMap {
        self.core.headers(msg)
    }

    /// The route stage checked rows already; this catches dead letters and limits that changed
    /// since (a reconnect to a server with a smaller `max_payload`).
    fn check_limits(&self, msg: &OutboundMessage) -> Result<(), PublishError> {
        self.limits().check(msg).map_err(|over| {
            PublishError::new(
                PublishErrorKind::Rejected,
                format!("event {} is too large to publish: {over}", msg.event_id),
            )
        })
    }

    /// A publisher on a client made elsewhere (tests, benchmarks), with explicit defaults:
    /// `max_control_line` 4096 and `max_server_closes` 5 ([`crate::NatsSettings`]' defaults),
    /// and no events followed, so a server close is seen only as an ack timeout and a refused
    /// publish only as an unknown outcome. The relay uses [`JetStreamPublisher::new`] on a
    /// [`crate::connect`]ed connection.
    pub fn with_default_limits(
        client: async_nats::Client,
        stream: &str,
        ack_timeout: std::time::Duration,
        max_in_flight: usize,
    ) -> Self {
        Self::new(
            &NatsConnection::unwatched(client),
            stream,
            ack_timeout,
            max_in_flight,
        )
    }

    /// From now on a `duplicate` answer naming a copy the stream no longer holds counts as
    /// answered, for a caller that reads the stream itself and names each such event
    /// ([`crate::RestoreCheck`]). Otherwise (the relay, backfills) such an answer is an
    /// unknown outcome: the event is published again until the stream stores it.
    pub(crate) fn leave_lost_copies_to_caller(&self) {
        self.core
            .lost_copies
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The JetStream context, for stream checks.
    pub fn context(&self) -> &jetstream::Context {
        self.core.context()
    }

    /// The JetStream context with its connection's state, for [`crate::prepare_stream`] and
    /// [`crate::published_since`].
    pub fn jetstream(&self) -> &JetStream {
        &self.core.jetstream
    }
}

/// What a publish hands back: the pending answer.
type Ack = BoxFuture<'static, Result<PubReceipt, PublishError>>;

impl JetStreamPublisher {
    async fn send_unwatched(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Ack, PublishError> {
        self.check_limits(msg)?;
        if let Some(framer) = self.framer.as_deref() {
            // The framing task keeps the condition on the stream's last message its own way
            // (docs/guarantees.md, "Commit order").
            return Ok(framer.send(msg, after));
        }
        // From the pipeline's loop: never wait for a lost connection here (the delivery
        // re-sends, and its re-send waits).
        self.core.send_now(msg, Condition::event(after)).await
    }

    async fn resend_unwatched(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Ack, PublishError> {
        self.check_limits(msg)?;
        if self.core.by_sequence
            && let Some(framer) = self.framer.as_deref()
        {
            // Every condition names a sequence: the re-send takes its place in the chain in
            // the framing task, in call order.
            return Ok(framer.resend(msg, after));
        }
        // Atomic batches keep commit order by the stream's sequence: a re-send is counted in
        // their chain from before it goes until it is answered.
        let Some(chain) = self.framer.as_deref().and_then(Framer::chain) else {
            return self.core.send_alone(msg, Condition::event(after)).await;
        };
        let link = chain.alone(true);
        Ok(link.follow(self.core.send_alone(msg, Condition::event(after)).await?))
    }
}

impl JetStreamPublisher {
    /// A first send or the pipeline's re-send (`resend`) of `msg`, as this publisher hands it
    /// over (a backfill's marked copy), its hooks told before it goes and of its outcome.
    async fn publish(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
        resend: bool,
    ) -> Result<Ack, PublishError> {
        let (msg, after) = self.handed(msg, after);
        let msg = &*msg;
        // No hooks (the common case): nothing called, nothing allocated.
        let watches = (!self.hooks.is_empty()).then(|| self.hooks.handing(msg));
        let sent = if resend {
            self.resend_unwatched(msg, after).await
        } else {
            self.send_unwatched(msg, after).await
        };
        match watches {
            Some(watches) => watched(watches, sent).await,
            None => sent,
        }
    }
}

/// `sent`, with its hooks told that it went out and, once known, its outcome.
async fn watched(
    mut watches: Watches,
    sent: Result<Ack, PublishError>,
) -> Result<Ack, PublishError> {
    if watches.is_empty() {
        return sent;
    }
    match sent {
        Ok(ack) => {
            watches.sent();
            Ok(async move {
                let outcome = ack.await;
                watches.settled(&outcome).await;
                outcome
            }
            .boxed())
        }
        Err(error) => {
            watches.settled(&Err(error.clone())).await;
            Err(error)
        }
    }
}

impl Publisher for JetStreamPublisher {
    type Ack = Ack;

    async fn send(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Ack, PublishError> {
        self.publish(msg, after, false).await
    }

    async fn resend(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Ack, PublishError> {
        self.publish(msg, after, true).await
    }

    fn begin_transaction(&self, commit_lsn: relay_core::Lsn) {
        if let Some(framer) = self.framer.as_deref() {
            framer.begin(commit_lsn);
        }
    }

    fn end_transaction(&self) {
        if let Some(framer) = self.framer.as_deref() {
            framer.end();
        }
    }

    fn hold(&self) {
        if let Some(framer) = self.framer.as_deref() {
            framer.hold();
        }
    }

    fn limits(&self) -> MessageLimits {
        MessageLimits {
            // 0 before the first INFO: unknown, the server decides.
            // The lean connection's once it saw an INFO; async-nats' (same servers) before.
            max_payload: match self.core.max_payload() {
                0 => usize::MAX,
                n => n,
            },
            max_control_line: self.core.jetstream.state().max_control_line,
            max_header_block: MessageLimits::JETSTREAM_MAX_HEADER_BYTES,
            reply_len: self.reply_len,
            extra_header_bytes: MessageLimits::header_line_len(
                HEADER_EXPECTED_STREAM,
                &self.core.stream,
            ) + if self.backfill {
                MessageLimits::header_line_len(HEADER_BACKFILL, "true")
            } else {
                0
            },
        }
    }

    /// Every message carries `Nats-Expected-Stream`: every receipt counts in this stream.
    fn stream_name(&self) -> Option<Arc<str>> {
        Some(self.core.stream.clone())
    }

    fn check_acks(&self, highest_seq: u64) -> impl Future<Output = AckCheck> + Send + 'static {
        let context = self.context().clone();
        let stream = self.core.stream.clone();
        async move { ack_check::check(&context, &stream, highest_seq).await }
    }

    fn max_server_closes(&self) -> u32 {
        self.core.jetstream.state().max_server_closes
    }
}

#[cfg(test)]
mod tests;
