//! The JetStream publisher: one `send` per message in commit order, acks awaited separately so
//! many are outstanding at once. Its [`Strategy`] is the publish mode in effect: per message, or
//! a framing task (`batch`, `fast_batch`) that batches what it can and publishes the rest
//! through a per-message copy of the publisher. Every mode publishes on one connection: the lean
//! one ([`crate::wire`], `lean.rs`), or async-nats' with `[nats] publish_path = "async-nats"`.

use std::error::Error as _;
use std::sync::{Arc, Mutex};

use async_nats::jetstream;
use async_nats::jetstream::context::PublishErrorKind as NatsKind;
use async_nats::jetstream::message::PublishMessage;
use futures::future::BoxFuture;
use relay_core::message::{HEADER_EXPECTED_STREAM, OutboundMessage};
use relay_core::route::MessageLimits;
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind, Publisher};

use self::batch::supports_atomic_batches;
use self::fast_batch::supports_fast_batches;
use self::framing::Framer;
use crate::closes::{self, Quarantine};
use crate::connection::{JetStream, NatsConnection};
use crate::error_codes::kind_for_error_code;
use crate::settings::PublishMode;

mod batch;
pub(crate) mod fast_batch;
mod framing;
pub(crate) mod headers;
mod lean;
use headers::HeaderState;

use crate::wire::LeanConnection;

/// Publishes outbound messages into one JetStream stream.
#[derive(Clone)]
pub struct JetStreamPublisher {
    /// The context, on the connection whose limits and events the publisher follows.
    jetstream: JetStream,
    stream: Arc<str>,
    /// The same context, shared with ack futures by reference count (no per-event clone).
    shared: Arc<jetstream::Context>,
    /// The headers of the current transaction, prepared once (see `headers::HeaderTemplate`), and
    /// the header names seen.
    template: Arc<Mutex<HeaderState>>,
    /// For the server's `max_payload` (a relaxed atomic load).
    client: async_nats::Client,
    /// Length of the longest reply subject a publish may carry: the lean path's
    /// `<inbox>.<16 hex digits>` or async-nats' `<inbox>.<id>.<token>`, or in fast batches the
    /// batch's reply subject.
    reply_len: usize,
    /// async-nats' reply length.
    nats_reply_len: usize,
    /// Messages the server closed the connection on, re-sent one at a time.
    quarantine: Arc<Quarantine>,
    /// How what the pipeline hands over is framed.
    strategy: Strategy,
    /// How long to wait for an answer before an outcome counts as unknown.
    ack_timeout: std::time::Duration,
    /// The lean publish path (its own connection, see [`crate::wire`]) for every message
    /// published on its own; `None` for a client made elsewhere, which publishes through
    /// async-nats.
    lean: Option<Arc<LeanConnection>>,
    /// `[nats] domain`: every PubAck must name it ([`crate::domain::check_ack_domain`]).
    domain: Option<Arc<str>>,
}

/// How the publisher frames what the pipeline hands it: the publish mode in effect (a mode the
/// server or stream cannot take falls back to `PerMessage`, with a warning).
#[derive(Debug, Clone)]
enum Strategy {
    /// Every message on its own. Also the strategy of the publisher a framing task publishes
    /// what it does not batch through.
    PerMessage,
    /// Each transaction as one atomic batch: the framing task's handle.
    AtomicBatch(Arc<Framer>),
    /// Fast batches: the framing task's handle.
    FastBatch(Arc<Framer>),
}

impl Strategy {
    fn framer(&self) -> Option<&Framer> {
        match self {
            Self::PerMessage => None,
            Self::AtomicBatch(framer) | Self::FastBatch(framer) => Some(framer),
        }
    }
}

/// A duplicate PubAck means JetStream already holds a message with this `Nats-Msg-Id`: a
/// re-send (same subject and payload), or a second outbox row reusing the id. Fetch the stored
/// copy and refuse the second case instead of reporting a silent success.
async fn verify_duplicate(
    context: &jetstream::Context,
    stream: &str,
    seq: u64,
    msg: &OutboundMessage,
) -> Result<(), PublishError> {
    let stored = match context.get_stream_no_info(stream).await {
        Ok(handle) => handle.get_raw_message(seq).await,
        Err(e) => {
            tracing::debug!(error = %e, seq, "cannot look up the stored copy of a duplicate");
            return Ok(());
        }
    };
    match stored {
        Ok(stored) if stored.subject.as_str() != msg.subject || stored.payload != msg.payload => {
            Err(PublishError::new(
                PublishErrorKind::Collision,
                format!(
                    "event id collision: `{}` is already stored (stream sequence {seq}) with a different subject or payload; two outbox rows share this event id",
                    msg.event_id
                ),
            ))
        }
        Ok(_) => Ok(()),
        // Purged or aged out: nothing to compare with.
        Err(e) => {
            tracing::debug!(error = %e, seq, "cannot read the stored copy of a duplicate");
            Ok(())
        }
    }
}

impl std::fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamPublisher")
            .field("stream", &self.stream)
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
        let client = connection.client().clone();
        // A JetStream publish replies to `<inbox prefix>.<id>.<token>`, where
        // `<inbox prefix>.<token>` is a new inbox (async-nats' request multiplexer).
        let inbox = client.new_inbox();
        let token = inbox.rsplit('.').next().map_or(0, str::len);
        // Messages published on their own go through the lean path when the connection was
        // made from settings (its reply subjects are `<inbox>.<16 hex digits>`).
        let lean = connection.lean_settings().map(|settings| {
            Arc::new(LeanConnection::new(
                settings,
                connection.state().clone(),
                ack_timeout,
            ))
        });
        let nats_reply_len = inbox.len() + 1 + token;
        let reply_len = lean
            .as_ref()
            .map_or(nats_reply_len, |lean| lean.reply_len());
        let jetstream = connection.jetstream_with(
            jetstream::ContextBuilder::new()
                .timeout(ack_timeout)
                .max_ack_inflight(max_in_flight.saturating_add(64)),
        );
        Self {
            shared: Arc::new(jetstream.context().clone()),
            jetstream,
            stream: stream.into(),
            template: Arc::default(),
            client,
            reply_len,
            nats_reply_len,
            quarantine: Arc::default(),
            strategy: Strategy::PerMessage,
            ack_timeout,
            lean,
            domain: connection.domain().cloned(),
        }
    }

    /// This publisher in `mode`. `atomic-batch` needs a server that takes `Nats-Msg-Id` inside
    /// atomic batches (2.12.1+, from its INFO) and a stream with `allow_atomic`; `fast-batch` a
    /// server with fast batches (2.14.0+) and a stream with `allow_batched`. `stream_allows` is
    /// the stream's setting for `mode` ([`crate::StreamReport::allows`]). Otherwise one warning
    /// says which is missing and every message is published on its own. `max_in_flight` bounds
    /// a batch: the pipeline stops reading at that many outstanding events, so a larger atomic
    /// batch could never commit, and a fast batch needs its flow acks more often than that.
    #[must_use]
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
        // A fast batch's flow acks name no domain, and a batch's commit is not checked.
        if self.domain.is_some() {
            tracing::warn!(
                stream = %self.stream,
                "[nats] publish_mode = \"{name}\" is not used with [nats] domain set (batch acknowledgements are not checked against the domain); publishing each message on its own"
            );
            return self;
        }
        let version = self.client.server_info().version;
        if !supported(&version) {
            tracing::warn!(
                server_version = %version,
                "[nats] publish_mode = \"{name}\" needs nats-server {needs_server} or later; publishing each message on its own"
            );
            return self;
        }
        if !stream_allows {
            tracing::warn!(
                stream = %self.stream,
                "[nats] publish_mode = \"{name}\" needs the stream's {setting} (nats stream edit {} {edit}, or create_stream); publishing each message on its own",
                self.stream
            );
            return self;
        }
        // What a batch does not take (a one-message transaction, a message left at the end of
        // a transaction, a dead letter) goes out in commit order between the batches, so on
        // their connection: the server orders nothing across two connections (a 1-row
        // transaction on one was stored after the batch of the next on the other, e2e
        // fast_batch, under load). So every message of every mode, every batch commit and every
        // answer go on one connection: the lean one, or async-nats' where the publisher
        // publishes through it. The framing task publishes what it does not batch through a
        // per-message copy of this publisher.
        let plain = self.clone();
        let flow = fast_batch::flow(max_in_flight);
        if mode == PublishMode::FastBatch {
            // Limits must hold for a fast batch's longer reply subject.
            let batch_reply_len = match &self.lean {
                Some(lean) => lean.batch_reply_len(flow),
                None => self.nats_reply_len + crate::wire::proto::fast_batch_reply_suffix_len(flow),
            };
            self.reply_len = self.reply_len.max(batch_reply_len);
        }
        let how = if mode == PublishMode::FastBatch {
            self.strategy =
                Strategy::FastBatch(Arc::new(fast_batch::start(plain, flow, self.ack_timeout)));
            "publishing in fast batches (one flow ack for many messages)"
        } else {
            self.strategy = Strategy::AtomicBatch(Arc::new(batch::start(plain, max_in_flight)));
            "publishing each transaction as one atomic batch"
        };
        tracing::info!(stream = %self.stream, server_version = %version, "{how}");
        self
    }

    /// Whether transactions are published as atomic batches.
    pub fn batches(&self) -> bool {
        matches!(self.strategy, Strategy::AtomicBatch(_))
    }

    /// Whether messages published on their own go through the lean publish path (its own
    /// connection, see `crate::wire`) rather than async-nats: made from settings, and not
    /// refused by the server.
    pub fn publishes_lean(&self) -> bool {
        self.lean.as_ref().is_some_and(|lean| !lean.refused())
    }

    /// The lean connection, once it is up (waiting at most `wait`), unless this publisher
    /// publishes through async-nats (a client made elsewhere, or a server that refused the
    /// lean connection). A batch takes one path for all its messages and its commit.
    pub(crate) async fn lean_path(&self, wait: std::time::Duration) -> Option<Arc<LeanConnection>> {
        match &self.lean {
            Some(lean) if lean.ready(wait).await => Some(lean.clone()),
            _ => None,
        }
    }

    /// Whether messages are published in fast batches.
    pub fn fast_batches(&self) -> bool {
        matches!(self.strategy, Strategy::FastBatch(_))
    }

    /// The client the publisher publishes on.
    pub(crate) fn client(&self) -> &async_nats::Client {
        &self.client
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

    /// Publishes `msg` on its own (per-message mode, re-sends, and what a batch does not take).
    /// While the lean connection is down, waits up to `ack_timeout` for it to come back: the
    /// callers (a delivery's re-send, the batch tasks) are not the pipeline's loop.
    pub(crate) async fn send_alone(
        &self,
        msg: &Arc<OutboundMessage>,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        self.send_alone_waiting(msg, self.ack_timeout).await
    }

    /// [`Self::send_alone`], waiting at most `wait` for a lost lean connection.
    async fn send_alone_waiting(
        &self,
        msg: &Arc<OutboundMessage>,
        wait: std::time::Duration,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        if self.quarantine.is_suspect(&msg.event_id) {
            // Re-sent alone among suspects. The wait is inside the ack future, so the caller
            // (the pipeline's loop, which polls the other deliveries) never blocks on it.
            let this = self.clone();
            let msg = msg.clone();
            return Ok(Box::pin(async move {
                let probe = this.quarantine.probe().await;
                this.publish(&msg, Some(probe), wait).await?.await
            }));
        }
        self.publish(msg, None, wait).await
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

    /// The JetStream context, for stream checks.
    pub fn context(&self) -> &jetstream::Context {
        self.jetstream.context()
    }

    /// The JetStream context with its connection's state, for [`crate::prepare_stream`] and
    /// [`crate::published_since`].
    pub fn jetstream(&self) -> &JetStream {
        &self.jetstream
    }

    /// Sends `msg` now; the returned future sees it acknowledged. `probe` (a suspect's turn,
    /// see [`Quarantine`]) is held until the outcome is known.
    async fn publish(
        &self,
        msg: &Arc<OutboundMessage>,
        probe: Option<tokio::sync::OwnedMutexGuard<()>>,
        wait: std::time::Duration,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        if let Some(lean) = &self.lean
            && lean.ready(wait).await
        {
            return self.publish_lean(lean, msg, probe);
        }
        // Before sending: a server close from now on may be this message's doing.
        let state = self.jetstream.state();
        let mut closes = state.closes.subscribe();
        let publish = PublishMessage::build()
            .headers(self.headers(msg))
            .payload(msg.payload.clone());
        let ack = self
            .context()
            .send_publish(msg.subject.clone(), publish)
            .await
            .map_err(classify)?;
        // For the rare duplicate ack and permission errors: reference counts, no copies.
        let context = self.shared.clone();
        let stream = self.stream.clone();
        let quarantine = self.quarantine.clone();
        let state = state.clone();
        let domain = self.domain.clone();
        let msg = msg.clone();
        Ok(Box::pin(async move {
            let subject = &msg.subject;
            // The server closed the connection over a protocol error while the ack was
            // pending: no ack will come on it. Say so now rather than after the ack timeout.
            let ack = tokio::select! {
                biased;
                ack = ack => ack,
                reason = closes::next_close(&mut closes) => {
                    quarantine.outcome(&msg.event_id, true);
                    return Err(PublishError::closed_by_server(format!(
                        "NATS closed the connection after this message was sent: -ERR '{reason}'"
                    )));
                }
            };
            quarantine.outcome(&msg.event_id, false);
            drop(probe);
            let ack = ack.map_err(|e| {
                let timed_out = e.kind() == NatsKind::TimedOut;
                let error = classify(e);
                match state.publish_denied(subject) {
                    // The server refused the publish itself: no PubAck will ever come.
                    Some(denied) if timed_out => PublishError::new(
                        PublishErrorKind::Rejected,
                        format!(
                            "NATS refused to let the relay publish to `{subject}` ({denied}): grant the relay's NATS user publish permission on the outbox subjects"
                        ),
                    ),
                    _ => error,
                }
            })?;
            crate::domain::check_ack_domain(domain.as_deref(), &ack.stream, Some(&ack.domain))?;
            if ack.duplicate {
                // Boxed: the lookup's future is kilobytes, and inline it would make every
                // outstanding ack that large, duplicate or not.
                Box::pin(verify_duplicate(&context, &stream, ack.sequence, &msg)).await?;
            }
            Ok(PubReceipt {
                stream_seq: ack.sequence,
                duplicate: ack.duplicate,
            })
        }))
    }
}

/// Maps an async-nats publish error to the pipeline's classes.
pub(crate) fn classify(error: jetstream::context::PublishError) -> PublishError {
    let server_code = error
        .source()
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .map(jetstream::Error::error_code);
    let kind = match error.kind() {
        NatsKind::TimedOut | NatsKind::BrokenPipe | NatsKind::MaxAckPending => {
            PublishErrorKind::Unknown
        }
        // 503 no responders: a leader election, or no stream captures the subject.
        NatsKind::StreamNotFound => PublishErrorKind::NoStream,
        NatsKind::MaxPayloadExceeded
        | NatsKind::WrongLastMessageId
        | NatsKind::WrongLastSequence => PublishErrorKind::Rejected,
        _ => server_code.map_or(PublishErrorKind::Unknown, |code| {
            kind_for_error_code(code.0)
        }),
    };
    let detail = match error.source() {
        Some(source) => format!("{error}: {source}"),
        None => error.to_string(),
    };
    PublishError::new(kind, detail)
}

impl Publisher for JetStreamPublisher {
    type Ack = BoxFuture<'static, Result<PubReceipt, PublishError>>;

    async fn send(&self, msg: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
        self.check_limits(msg)?;
        if let Some(framer) = self.strategy.framer() {
            return Ok(framer.send(msg));
        }
        // From the pipeline's loop: never wait for a lost connection here (the delivery
        // re-sends, and its re-send waits).
        self.send_alone_waiting(msg, std::time::Duration::ZERO)
            .await
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

    async fn resend(&self, msg: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
        self.check_limits(msg)?;
        self.send_alone(msg).await
    }

    fn limits(&self) -> MessageLimits {
        MessageLimits {
            // 0 before the first INFO: unknown, the server decides.
            // The lean connection's once it saw an INFO; async-nats' (same servers) before.
            max_payload: match self.lean.as_ref().map_or(0, |lean| lean.max_payload()) {
                0 => match self.client.max_payload() {
                    0 => usize::MAX,
                    n => n,
                },
                n => n,
            },
            max_control_line: self.jetstream.state().max_control_line,
            max_header_block: MessageLimits::JETSTREAM_MAX_HEADER_BYTES,
            reply_len: self.reply_len,
            extra_header_bytes: MessageLimits::header_line_len(
                HEADER_EXPECTED_STREAM,
                &self.stream,
            ),
        }
    }

    /// Every message carries `Nats-Expected-Stream`: every receipt counts in this stream.
    fn stream_name(&self) -> Option<Arc<str>> {
        Some(self.stream.clone())
    }

    fn max_server_closes(&self) -> u32 {
        self.jetstream.state().max_server_closes
    }
}

#[cfg(test)]
mod tests;
