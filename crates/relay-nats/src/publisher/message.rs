//! The per-message core of the publisher: one message at a time on the publishing connection
//! (the lean one, `lean.rs`, or async-nats'), with its outcome, the server-close quarantine,
//! permission errors and the duplicate check. Per-message mode publishes through it, and so do
//! the framing tasks for what they do not batch (a one-message transaction, a dead letter, a
//! batch refused whole) and re-sends.

use std::error::Error as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::PublishErrorKind as NatsKind;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use futures::future::BoxFuture;
use relay_core::message::{
    HEADER_EXPECTED_LAST_MSG_ID, HEADER_EXPECTED_LAST_SEQUENCE, HEADER_MSG_ID, OutboundMessage,
};
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind};

use super::headers::HeaderState;
use crate::closes::Quarantine;
use crate::connection::{JetStream, NatsConnection};
use crate::connection_state::ConnectionState;
use crate::error_codes::kind_for_error_code;
use crate::wire::LeanConnection;
use nats_wire::ConnectOptions;

use super::path::{AsyncNats, Path, PathChoice};

/// What a message is stored on, when its predecessor in commit order is not known stored: the
/// stream's last message is that event (`Nats-Expected-Last-Msg-Id`), or the stream's last
/// sequence is the one it will have once that event is stored (`Nats-Expected-Last-Sequence`,
/// see `chain`). The server refuses the message otherwise, storing nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Condition<'a> {
    AfterEvent(&'a str),
    AfterSequence(u64),
}

impl<'a> Condition<'a> {
    /// The condition naming the event `after`, when there is one.
    pub(crate) fn event(after: Option<&'a str>) -> Option<Self> {
        after.map(Self::AfterEvent)
    }

    /// Its header: name and value.
    pub(crate) fn header(self) -> (&'static str, std::borrow::Cow<'a, str>) {
        match self {
            Self::AfterEvent(id) => (HEADER_EXPECTED_LAST_MSG_ID, id.into()),
            Self::AfterSequence(seq) => (HEADER_EXPECTED_LAST_SEQUENCE, seq.to_string().into()),
        }
    }
}

/// Publishes one message at a time into one stream. Cheap to clone (reference counts): the
/// publisher and its framing task each hold one.
#[derive(Clone)]
pub(crate) struct MessagePublisher {
    /// The context, on the connection whose limits and events the publisher follows.
    pub(super) jetstream: JetStream,
    pub(super) stream: Arc<str>,
    /// The same context, shared with ack futures by reference count (no per-event clone).
    pub(super) shared: Arc<jetstream::Context>,
    /// The headers of the current transaction, prepared once (see `headers::HeaderTemplate`), and
    /// the header names seen.
    pub(super) template: Arc<Mutex<HeaderState>>,
    /// Messages the server closed the connection on, re-sent one at a time.
    pub(super) quarantine: Arc<Quarantine>,
    /// How long to wait for an answer before an outcome counts as unknown.
    pub(super) ack_timeout: Duration,
    /// The connection it publishes on: the lean one (see [`crate::wire`]), or async-nats' for a
    /// client made elsewhere, with `[nats] publish_path = "async-nats"`, or once the server
    /// refused the lean connection.
    pub(super) paths: PathChoice,
    /// `[nats] domain`: every PubAck must name it ([`crate::domain::check_ack_domain`]).
    pub(super) domain: Option<Arc<str>>,
    /// Every commit-order condition names a stream sequence, never an event id (see
    /// [`crate::StreamReport::order_by_sequence`]).
    pub(super) by_sequence: bool,
    /// What a duplicate of a copy the stream no longer holds counts as; shared by every clone
    /// (the framing tasks' too), so [`super::JetStreamPublisher::leave_lost_copies_to_caller`]
    /// reaches them.
    pub(super) lost_copies: Arc<std::sync::atomic::AtomicBool>,
}

impl MessagePublisher {
    /// See [`super::JetStreamPublisher::new`].
    pub(super) fn new(
        connection: &NatsConnection,
        stream: &str,
        ack_timeout: Duration,
        max_in_flight: usize,
    ) -> Self {
        // The lean path when the connection was made from settings (its reply subjects are
        // `<inbox>.<16 hex digits>`).
        let lean = connection.lean_settings().map(|settings| {
            // Every PubAck must name this publisher's stream.
            let mut options = ConnectOptions::clone(&settings);
            options.stream = Some(stream.into());
            Arc::new(LeanConnection::new(Arc::new(options), ack_timeout))
        });
        let jetstream = connection.jetstream_with(
            jetstream::ContextBuilder::new()
                .timeout(ack_timeout)
                .max_ack_inflight(max_in_flight.saturating_add(64)),
        );
        let shared = Arc::new(jetstream.context().clone());
        let template = Arc::<Mutex<HeaderState>>::default();
        let nats = AsyncNats::new(
            connection.client().clone(),
            shared.clone(),
            template.clone(),
        );
        Self {
            shared,
            jetstream,
            stream: stream.into(),
            template,
            quarantine: Arc::default(),
            ack_timeout,
            paths: PathChoice::new(lean, nats),
            domain: connection.domain().cloned(),
            by_sequence: false,
            lost_copies: Arc::default(),
        }
    }

    /// What an ack future needs to check a duplicate answer ([`verify_duplicate`]).
    pub(super) fn duplicate_check(&self) -> DuplicateCheck {
        let left = self.lost_copies.load(std::sync::atomic::Ordering::Relaxed);
        DuplicateCheck {
            context: self.shared.clone(),
            state: self.jetstream.state().clone(),
            stream: self.stream.clone(),
            domain: self.domain.clone(),
            lost_copies: if left {
                LostCopies::LeftToCaller
            } else {
                LostCopies::NotStored
            },
        }
    }

    /// Length of the longest reply subject a message published on its own may carry.
    pub(super) fn reply_len(&self) -> usize {
        self.paths.preferred().reply_len()
    }

    /// The server's `max_payload` ([`PathChoice::max_payload`]).
    pub(super) fn max_payload(&self) -> usize {
        self.paths.max_payload()
    }

    /// Whether messages go through the lean publish path (its own connection, see
    /// `crate::wire`) rather than async-nats: made from settings, and not refused by the server.
    pub(super) fn publishes_lean(&self) -> bool {
        self.paths.publishes_lean()
    }

    /// The path to publish on ([`PathChoice::path`]), waiting at most `wait` for a lost lean
    /// connection. A batch takes one path for all its messages and its commit.
    pub(crate) async fn path(&self, wait: Duration) -> Path {
        self.paths.path(wait).await.clone()
    }

    /// The headers of `msg` ([`super::JetStreamPublisher::headers`]).
    pub(crate) fn headers(&self, msg: &OutboundMessage) -> async_nats::HeaderMap {
        super::headers::headers(&self.template, &self.stream, msg)
    }

    /// The JetStream context, for stream checks.
    pub(super) fn context(&self) -> &jetstream::Context {
        self.jetstream.context()
    }

    /// Publishes `msg` now, never waiting for a lost connection: for the pipeline's loop (a
    /// delivery whose outcome is unknown re-sends, and its re-send waits) and the same first
    /// attempt made for it elsewhere.
    pub(crate) async fn send_now(
        &self,
        msg: &Arc<OutboundMessage>,
        condition: Option<Condition<'_>>,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        self.send_waiting(msg, condition, Duration::ZERO).await
    }

    /// Publishes `msg` (re-sends, and what the batch framer publishes on its own). While the
    /// lean connection is down, waits up to `ack_timeout` for it to come back: the callers are
    /// not the pipeline's loop.
    pub(crate) async fn send_alone(
        &self,
        msg: &Arc<OutboundMessage>,
        condition: Option<Condition<'_>>,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        self.send_waiting(msg, condition, self.ack_timeout).await
    }

    /// Publishes `msg` (stored only if `condition` holds, when set: see
    /// [`relay_core::stage::Publisher::send`]), waiting at most `wait` for a lost lean
    /// connection.
    pub(crate) async fn send_waiting(
        &self,
        msg: &Arc<OutboundMessage>,
        condition: Option<Condition<'_>>,
        wait: Duration,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        if self.quarantine.is_suspect(&msg.event_id) {
            // Re-sent alone among suspects. The wait is inside the ack future, so the caller
            // (the pipeline's loop, which polls the other deliveries) never blocks on it.
            let this = self.clone();
            let msg = msg.clone();
            let condition = condition.map(OwnedCondition::from);
            return Ok(Box::pin(async move {
                let probe = this.quarantine.probe().await;
                let condition = condition.as_ref().map(OwnedCondition::borrow);
                this.publish(&msg, condition, Some(probe), wait)
                    .await?
                    .await
            }));
        }
        self.publish(msg, condition, None, wait).await
    }

    /// Sends `msg` now, on the path [`PathChoice::path`] gives (waiting at most `wait` for a
    /// lost lean connection); the returned future sees it acknowledged. `probe` (a suspect's
    /// turn, see [`Quarantine`]) is held until the outcome is known.
    async fn publish(
        &self,
        msg: &Arc<OutboundMessage>,
        condition: Option<Condition<'_>>,
        probe: Option<tokio::sync::OwnedMutexGuard<()>>,
        wait: Duration,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        match self.paths.path(wait).await {
            Path::Lean(lean) => self.publish_lean(lean, msg, condition, probe),
            Path::AsyncNats(nats) => self.publish_nats(nats, msg, condition, probe).await,
        }
    }
}

/// A [`Condition`] kept by a future that sends later (a suspect's turn).
enum OwnedCondition {
    AfterEvent(String),
    AfterSequence(u64),
}

impl From<Condition<'_>> for OwnedCondition {
    fn from(condition: Condition<'_>) -> Self {
        match condition {
            Condition::AfterEvent(id) => Self::AfterEvent(id.to_owned()),
            Condition::AfterSequence(seq) => Self::AfterSequence(seq),
        }
    }
}

impl OwnedCondition {
    fn borrow(&self) -> Condition<'_> {
        match self {
            Self::AfterEvent(id) => Condition::AfterEvent(id),
            Self::AfterSequence(seq) => Condition::AfterSequence(*seq),
        }
    }
}

/// What an ack future needs to read back the copy a `duplicate` answer names: the context, the
/// connection's state (a refused read names its permission), the stream and its API prefix.
/// Reference counts only: made per publish, used only on the rare duplicate.
pub(super) struct DuplicateCheck {
    pub(super) context: Arc<jetstream::Context>,
    pub(super) state: Arc<ConnectionState>,
    pub(super) stream: Arc<str>,
    pub(super) domain: Option<Arc<str>>,
    /// What a duplicate of a copy the stream no longer holds is ([`LostCopies`]).
    pub(super) lost_copies: LostCopies,
}

/// What a `duplicate` answer naming a copy the stream no longer holds (deleted or purged inside
/// the duplicate window, or lost by a server that restarted without its last writes) counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LostCopies {
    /// Not stored: an unknown outcome, published again (in commit order, with backoff) until
    /// the stream stores it once the duplicate window has passed. The relay's and the backfill's.
    NotStored,
    /// Counted as answered: the caller reads the stream itself and names each such event
    /// (`restore`, [`crate::RestoreCheck`]).
    LeftToCaller,
}

/// A `duplicate` answer says JetStream remembers the event id, not that the stream holds the
/// event: inside the duplicate window the id of a deleted or purged message still blocks a
/// re-publish (measured on nats-server 2.9 and 2.15), and a server that lost the tail of its
/// last block reuses sequence numbers. So the sequence the answer names is read back, and the
/// event counts as stored only when the stream holds a message there with its `Nats-Msg-Id`;
/// with the same subject and payload, or it is a collision (two outbox rows share the id).
pub(super) async fn verify_duplicate(
    check: &DuplicateCheck,
    seq: u64,
    msg: &OutboundMessage,
) -> Result<(), PublishError> {
    let stored = match check
        .context
        .get_stream_no_info(check.stream.as_ref())
        .await
    {
        Ok(handle) => handle.get_raw_message(seq).await,
        Err(e) => return Err(check.unreadable(seq, msg, &e)),
    };
    let stored = match stored {
        Ok(stored) => stored,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
            return check.lost(
                msg,
                format!("stream sequence {seq} it names is no longer in the stream (deleted or purged inside the duplicate window)"),
            );
        }
        Err(e) => return Err(check.unreadable(seq, msg, &e)),
    };
    let stored_id = stored
        .headers
        .get(HEADER_MSG_ID)
        .map(|v| v.as_str().to_owned());
    if stored_id.as_deref() != Some(msg.event_id.as_str()) {
        return check.lost(
            msg,
            format!(
                "stream sequence {seq} it names holds another message (Nats-Msg-Id {}): the stream lost the event",
                stored_id.as_deref().unwrap_or("none")
            ),
        );
    }
    if stored.subject.as_str() != msg.subject || stored.payload != msg.payload {
        return Err(PublishError::new(
            PublishErrorKind::Collision,
            format!(
                "event id collision: `{}` is already stored (stream sequence {seq}) with a different subject or payload; two outbox rows share this event id",
                msg.event_id
            ),
        ));
    }
    Ok(())
}

impl DuplicateCheck {
    /// The answer for a duplicate of a copy the stream does not hold (`why`).
    fn lost(&self, msg: &OutboundMessage, why: String) -> Result<(), PublishError> {
        match self.lost_copies {
            LostCopies::LeftToCaller => Ok(()),
            LostCopies::NotStored => Err(PublishError::new(
                PublishErrorKind::Unknown,
                format!(
                    "JetStream answered `duplicate` for event {} but the {why}: not counted as stored; published again until the stream stores it (after its duplicate_window)",
                    msg.event_id
                ),
            )),
        }
    }

    /// The answer when the copy cannot be read: never counted as stored; a refused read (the
    /// relay's NATS user may not read its stream's messages) stops with the permission to grant.
    fn unreadable(
        &self,
        seq: u64,
        msg: &OutboundMessage,
        error: &dyn std::fmt::Display,
    ) -> PublishError {
        let api = crate::domain::api_prefix(self.domain.as_deref());
        let subject = format!("{api}.STREAM.MSG.GET.{}", self.stream);
        if let Some(denied) = self.state.publish_denied(&subject) {
            return PublishError::new(
                PublishErrorKind::Rejected,
                format!(
                    "JetStream answered `duplicate` for event {} and the relay cannot read stream sequence {seq} to check that the stream holds it ({denied}): allow `{subject}` in the relay user's publish permissions",
                    msg.event_id
                ),
            );
        }
        PublishError::new(
            PublishErrorKind::Unknown,
            format!(
                "JetStream answered `duplicate` for event {} and stream sequence {seq} cannot be read to check it ({error}): not counted as stored until it can be",
                msg.event_id
            ),
        )
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
        // The commit-order condition: the predecessor was not the stream's last message.
        NatsKind::WrongLastMessageId | NatsKind::WrongLastSequence => PublishErrorKind::OutOfTurn,
        NatsKind::MaxPayloadExceeded => PublishErrorKind::Rejected,
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
