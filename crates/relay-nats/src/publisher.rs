//! The JetStream publisher: one `send` per message in commit order, acks awaited separately so
//! many are outstanding at once. Its [`Strategy`] is the publish mode in effect: per message, or
//! the batch framer (`batching`, with the mode's `atomic` or `fast` batches) that batches what
//! it can and publishes the rest through the per-message core ([`MessagePublisher`],
//! `message.rs`). Every mode publishes on one connection, the [`path::Path`] its
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
    PubReceipt, PublishError, PublishErrorKind, PublishHook, PublishHooks, Publisher, Watches,
};

use self::batching::Mode;
use self::batching::atomic::{Atomic, supports_atomic_batches};
use self::batching::fast::{self, Fast, supports_fast_batches};
use self::framing::Framer;
use self::message::{Condition, MessagePublisher};
use crate::connection::{JetStream, NatsConnection};
use crate::settings::PublishMode;

pub(crate) mod batching;
mod chain;
mod framing;
pub(crate) mod headers;
mod lean;
mod message;
mod nats;
mod path;
mod sequenced;

pub(crate) use message::classify;

/// Publishes outbound messages into one JetStream stream.
#[derive(Clone)]
pub struct JetStreamPublisher {
    /// Publishes each message on its own: every message in per-message mode; in the batch modes
    /// what a batch does not take (the framing task holds a copy).
    core: MessagePublisher,
    /// How what the pipeline hands over is framed.
    strategy: Strategy,
    /// Length of the longest reply subject a publish may carry: the per-message core's, or in
    /// fast batches the batch's reply subject.
    reply_len: usize,
    /// What watches each message and its outcome (tracing, `restore`'s check of duplicates).
    hooks: PublishHooks,
    /// A backfill's publisher: every message marked `Outbox-Backfill: true`, none with a
    /// condition on the stream's last message ([`Self::for_backfill`]).
    backfill: bool,
}

/// How the publisher frames what the pipeline hands it: the publish mode in effect (a mode the
/// server or stream cannot take falls back to `PerMessage`, with a warning).
#[derive(Debug, Clone)]
enum Strategy {
    /// Every message on its own, through the per-message core.
    PerMessage,
    /// Each transaction as one atomic batch: the framing task's handle.
    AtomicBatch(Arc<Framer>),
    /// Fast batches: the framing task's handle.
    FastBatch(Arc<Framer>),
    /// Every message on its own, on a stream where every condition names a sequence: the
    /// sequence chain's task (`sequenced`).
    BySequence(Arc<Framer>),
}

impl Strategy {
    fn framer(&self) -> Option<&Framer> {
        match self {
            Self::PerMessage => None,
            Self::AtomicBatch(framer) | Self::FastBatch(framer) | Self::BySequence(framer) => {
                Some(framer)
            }
        }
    }
}

impl std::fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamPublisher")
            .field("stream", &self.core.stream)
            .field("strategy", &self.strategy)
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
            strategy: Strategy::PerMessage,
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
        self
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

    /// This publisher with every commit-order condition naming a stream sequence instead of an
    /// event id when `by_sequence` ([`crate::StreamReport::order_by_sequence`]: a replicated
    /// stream where a refused event-id condition would fail the stream), in every publish mode
    /// that keeps order that way. Call before [`Self::with_publish_mode`].
    #[must_use]
    pub fn with_order_by_sequence(mut self, by_sequence: bool) -> Self {
        if by_sequence && !self.core.by_sequence {
            self.core.by_sequence = true;
            tracing::info!(
                stream = %self.core.stream,
                "commit order kept by the stream's sequence (Nats-Expected-Last-Sequence): the stream is replicated, and on nats-server 2.14 or later a refused Nats-Expected-Last-Msg-Id fails a replicated stream"
            );
            self.strategy = Strategy::BySequence(Arc::new(sequenced::start(self.core.clone())));
        }
        self
    }

    /// This publisher in `mode`. `atomic-batch` needs a server that takes `Nats-Msg-Id` inside
    /// atomic batches (2.12.1+, from its INFO) and a stream with `allow_atomic`; `fast-batch` a
    /// server with fast batches (2.14.0+) and a stream with `allow_batched`. `stream_allows` is
    /// the stream's setting for `mode` ([`crate::StreamReport::allows`]). Otherwise one warning
    /// says which is missing and every message is published on its own. `max_in_flight` bounds
    /// a batch: the pipeline stops reading at that many outstanding events, so a larger atomic
    /// batch could never commit, and a fast batch needs its flow acks more often than that.
    #[must_use]
    // Long: one `match` over the mode and what the server and stream allow, each case with its one
    // warning
    pub fn with_publish_mode(
        mut self,
        mode: PublishMode,
        stream_allows: bool,
        max_in_flight: usize,
    ) -> Self {
        let (name, supported, needs_server, setting, edit) = match mode {
            PublishMode::PerMessage => return self,
            PublishMode::AtomicBatch => (
                "atomic-batch",
                supports_atomic_batches as fn(&str) -> bool,
                "2.12.1 (Nats-Msg-Id inside atomic batches)",
                "allow_atomic",
                "--allow-batch",
            ),
            PublishMode::FastBatch => (
                "fast-batch",
                supports_fast_batches as fn(&str) -> bool,
                "2.14.0 (fast batch publishing)",
                "allow_batched",
                "--allow-batched",
            ),
        };
        // A fast batch's flow acks name no domain (an atomic batch's commit PubAck does, and
        // is checked like a single PubAck).
        if mode == PublishMode::FastBatch && self.core.domain.is_some() {
            tracing::warn!(
                stream = %self.core.stream,
                "[nats] publish_mode = \"{name}\" is not used with [nats] domain set (its flow acknowledgements name no domain); publishing each message on its own"
            );
            return self;
        }
        if mode == PublishMode::FastBatch && self.core.by_sequence {
            tracing::warn!(
                stream = %self.core.stream,
                "[nats] publish_mode = \"{name}\" does not keep commit order on a replicated stream of nats-server 2.14 or later; publishing each message on its own"
            );
            return self;
        }
        let version = self.core.context().client().server_info().version;
        if !supported(&version) {
            tracing::warn!(
                server_version = %version,
                "[nats] publish_mode = \"{name}\" needs nats-server {needs_server} or later; publishing each message on its own"
            );
            return self;
        }
        if !stream_allows {
            tracing::warn!(
                stream = %self.core.stream,
                "[nats] publish_mode = \"{name}\" needs the stream's {setting} (nats stream edit {} {edit}, or create_stream); publishing each message on its own",
                self.core.stream
            );
            return self;
        }
        // What a batch does not take (a one-message transaction, a message left at the end of
        // a transaction, a dead letter) goes out in commit order between the batches, so on
        // their connection: the server orders nothing across two connections (a 1-row
        // transaction on one was stored after the batch of the next on the other, e2e
        // fast_batch, under load). So every message of every mode, every batch commit and every
        // answer go on one connection: the lean one, or async-nats' where the publisher
        // publishes through it. The framing task publishes what it does not batch through the
        // per-message core.
        let per_message = self.core.clone();
        let how = if mode == PublishMode::FastBatch {
            let flow = fast::flow(max_in_flight);
            // Limits must hold for a fast batch's longer reply subject.
            let batch_reply_len = self.core.paths.preferred().batch_reply_len(flow);
            self.reply_len = self.reply_len.max(batch_reply_len);
            let framer = batching::start(per_message, Mode::Fast(Fast::new(flow)));
            self.strategy = Strategy::FastBatch(Arc::new(framer));
            "publishing in fast batches (one flow ack for many messages)"
        } else {
            let framer = batching::start(per_message, Mode::Atomic(Atomic::new(max_in_flight)));
            self.strategy = Strategy::AtomicBatch(Arc::new(framer));
            "publishing each transaction as one atomic batch"
        };
        tracing::info!(stream = %self.core.stream, server_version = %version, "{how}");
        self
    }

    /// Whether transactions are published as atomic batches.
    pub fn batches(&self) -> bool {
        matches!(self.strategy, Strategy::AtomicBatch(_))
    }

    /// Whether messages are published in fast batches.
    pub fn fast_batches(&self) -> bool {
        matches!(self.strategy, Strategy::FastBatch(_))
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
        if let Some(framer) = self.strategy.framer() {
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
            && let Some(framer) = self.strategy.framer()
        {
            // Every condition names a sequence: the re-send takes its place in the chain in
            // the framing task, in call order.
            return Ok(framer.resend(msg, after));
        }
        // Atomic batches keep commit order by the stream's sequence: a re-send is counted in
        // their chain from before it goes until it is answered.
        let Some(chain) = self.strategy.framer().and_then(Framer::chain) else {
            return self.core.send_alone(msg, Condition::event(after)).await;
        };
        let link = chain.alone(true);
        Ok(link.follow(self.core.send_alone(msg, Condition::event(after)).await?))
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
        let (msg, after) = self.handed(msg, after);
        let msg = &*msg;
        if self.hooks.is_empty() {
            return self.send_unwatched(msg, after).await;
        }
        let watches = self.hooks.handing(msg);
        watched(watches, self.send_unwatched(msg, after).await).await
    }

    async fn resend(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> Result<Ack, PublishError> {
        let (msg, after) = self.handed(msg, after);
        let msg = &*msg;
        if self.hooks.is_empty() {
            return self.resend_unwatched(msg, after).await;
        }
        let watches = self.hooks.handing(msg);
        watched(watches, self.resend_unwatched(msg, after).await).await
    }

    fn begin_transaction(&self, commit_lsn: relay_core::Lsn) {
        if let Some(framer) = self.strategy.framer() {
            framer.begin(commit_lsn);
        }
    }

    fn end_transaction(&self) {
        if let Some(framer) = self.strategy.framer() {
            framer.end();
        }
    }

    fn hold(&self) {
        if let Some(framer) = self.strategy.framer() {
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

    fn max_server_closes(&self) -> u32 {
        self.core.jetstream.state().max_server_closes
    }
}

#[cfg(test)]
mod tests;
