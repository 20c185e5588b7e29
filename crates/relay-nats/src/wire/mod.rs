//! The lean per-message publish path: the relay's own NATS connection for publishing, with
//! `HPUB` frames whose shared header lines are serialised once per transaction, one `SUB` for
//! every PubAck, PubAcks matched by number and parsed into a plain struct, and one deadline
//! sweep instead of a timer per message (docs/benchmarks.md, "What would move it").
//! It carries every message of every publish mode and every answer: PubAcks, atomic batches
//! and their commits, fast batches and their flow acks (on a second subscription made with
//! `CONNECT`); async-nats serves management only (stream checks, direct gets, the duplicate
//! check), and publishing where `[nats] publish_path = "async-nats"` or the server refused
//! this connection. Where each message goes in each mode: `docs/design.md`, "Where each message
//! goes".
//!
//! - [`proto`]: framing and parsing, no IO.
//! - [`connect`]: servers from [`crate::NatsSettings`], credentials and TLS from
//!   [`crate::client_auth`] (shared with the async-nats connection); the handshake.
//! - [`session`]: the connection's life (reader, writer, reconnects).
//! - [`pending`]: the outstanding publishes and PubAck parsing.

mod connect;
mod headers;
mod pending;
pub(crate) mod proto;
mod session;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use relay_core::message::OutboundMessage;
use relay_core::stage::{PublishError, PublishErrorKind};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

pub(crate) use connect::WireSettings;
pub(crate) use pending::{Outcome, RawOutcome};

/// After `<reply prefix>.`, what starts a fast batch's reply subjects: `b.<batch token>.…`.
const BATCH_TOKEN_PREFIX: &[u8] = b"b.";

use crate::connection_state::ConnectionState;
use headers::WireHeaders;

/// The lean publish connection. Dropping the last handle stops its task and closes it.
pub(crate) struct LeanConnection {
    inner: Arc<Inner>,
    /// Dropped with the handle: the supervisor sees its receiver close and stops.
    _stop: watch::Sender<()>,
    stop: watch::Receiver<()>,
    started: AtomicBool,
}

impl std::fmt::Debug for LeanConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeanConnection")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

struct Inner {
    settings: Arc<WireSettings>,
    /// `_INBOX.<unique>`: publish `n` replies to `<reply_prefix>.<16 hex digits of n>`.
    reply_prefix: String,
    /// `<reply prefix>.b`: a fast batch's replies are `<batch prefix>.<batch token>.…`.
    batch_prefix: String,
    ack_timeout: Duration,
    /// The state the async-nats connection's events feed too: permission errors seen here are
    /// recorded there, so both paths explain a refused publish alike.
    connection: Arc<ConnectionState>,
    state: Mutex<Shared>,
    wake_writer: Notify,
    /// The server's `max_payload` (0 before the first `INFO`).
    max_payload: AtomicUsize,
    ever_connected: AtomicBool,
    /// The server refused the first connection: publish through async-nats instead.
    refused: AtomicBool,
    up: watch::Sender<bool>,
}

/// What the publishing side and the connection's tasks share, behind one lock.
#[derive(Default)]
struct Shared {
    /// A connection is up and takes frames.
    live: bool,
    /// Frames not yet written.
    out: BytesMut,
    pending: pending::Pending,
    next_n: u64,
    headers: WireHeaders,
    /// A protocol `-ERR` after which the server closes the connection.
    closing: Option<Arc<str>>,
    /// Servers learned from `INFO` `connect_urls`.
    discovered: Vec<connect::ServerUrl>,
    pings_out: u32,
    /// One entry per `PING` out, in order: who waits for its `PONG` (a flush), if anyone.
    pongs: VecDeque<Option<oneshot::Sender<()>>>,
    /// The readers of the open fast batches, by batch token.
    batch_replies: HashMap<String, mpsc::UnboundedSender<Bytes>>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A poisoned lock only means a panic elsewhere mid-update; the state stays usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl LeanConnection {
    /// A connection made from `settings`, opened on first use. Its permission errors are
    /// recorded in `connection` (the async-nats connection's state).
    pub(crate) fn new(
        settings: Arc<WireSettings>,
        connection: Arc<ConnectionState>,
        ack_timeout: Duration,
    ) -> Self {
        let (stop_tx, stop) = watch::channel(());
        let reply_prefix = format!("_INBOX.{}", nuid::next());
        let pending = pending::Pending::in_domain(settings.domain.clone());
        Self {
            inner: Arc::new(Inner {
                settings,
                batch_prefix: format!("{reply_prefix}.b"),
                reply_prefix,
                ack_timeout,
                connection,
                state: Mutex::new(Shared {
                    pending,
                    ..Shared::default()
                }),
                wake_writer: Notify::new(),
                max_payload: AtomicUsize::new(0),
                ever_connected: AtomicBool::new(false),
                refused: AtomicBool::new(false),
                up: watch::Sender::new(false),
            }),
            _stop: stop_tx,
            stop,
            started: AtomicBool::new(false),
        }
    }

    /// The server's `max_payload`, 0 before the connection's first `INFO`.
    pub(crate) fn max_payload(&self) -> usize {
        self.inner.max_payload.load(Ordering::Relaxed)
    }

    /// The length of a reply subject: `<reply prefix>.<16 hex digits>`.
    pub(crate) fn reply_len(&self) -> usize {
        self.inner.reply_prefix.len() + 1 + proto::REPLY_TOKEN_LEN
    }

    /// Connects, unless started already (the supervisor then keeps it connected).
    fn start(&self) {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(session::supervise(self.inner.clone(), self.stop.clone()));
        }
    }

    /// Whether to publish on this connection: starts it on first use and, while it is down,
    /// waits up to `wait` for it (the first connection always, up to `connect_timeout` per
    /// configured server). `false` only when the server refused the first connection (e.g. a
    /// connection limit of the account) though async-nats' connection with the same
    /// credentials is up: messages then go through async-nats (logged once).
    pub(crate) async fn ready(&self, wait: Duration) -> bool {
        self.start();
        let inner = &self.inner;
        if !*inner.up.borrow() && !inner.refused.load(Ordering::Relaxed) {
            let wait = if inner.ever_connected.load(Ordering::Relaxed) {
                wait
            } else {
                let servers = u32::try_from(inner.settings.servers.len()).unwrap_or(u32::MAX);
                inner.settings.connect_timeout * servers.max(1) + Duration::from_secs(1)
            };
            let mut up = inner.up.subscribe();
            // Timing out is fine: the publish reports it.
            let _ = tokio::time::timeout(
                wait,
                up.wait_for(|up| *up || inner.refused.load(Ordering::Relaxed)),
            )
            .await;
        }
        !inner.refused.load(Ordering::Relaxed)
    }

    /// Whether the server refused the first connection (see [`Self::ready`]).
    pub(crate) fn refused(&self) -> bool {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Queues `msg` (into `stream`) for the writer; the receiver gets its outcome. Fails as
    /// unknown while the connection is down (the caller re-sends).
    pub(crate) fn publish(
        &self,
        stream: &str,
        msg: &Arc<OutboundMessage>,
    ) -> Result<oneshot::Receiver<Outcome>, PublishError> {
        self.publish_numbered(stream, msg, &[], pending::Pending::push)
    }

    /// Queues `msg` (into `stream`) with the `extra` header lines, replying to its publish
    /// number, and registers it with `register` (which says how its answer is handed over).
    fn publish_numbered<T>(
        &self,
        stream: &str,
        msg: &Arc<OutboundMessage>,
        extra: &[(&str, &str)],
        register: impl FnOnce(&mut pending::Pending, u64, Arc<OutboundMessage>, Instant) -> T,
    ) -> Result<T, PublishError> {
        let inner = &self.inner;
        self.queue(|state| {
            let n = state.next_n;
            state.next_n += 1;
            let Shared { out, headers, .. } = &mut *state;
            let reply = proto::ReplyTo::Numbered(&inner.reply_prefix, n);
            headers.write_hpub_with(out, stream, msg, reply, extra);
            register(
                &mut state.pending,
                n,
                msg.clone(),
                Instant::now() + inner.ack_timeout,
            )
        })
    }

    /// Queues `msg` (into `stream`) with the `extra` header lines and no reply: an atomic
    /// batch's message before its commit, which the server does not answer.
    pub(crate) fn publish_unanswered(
        &self,
        stream: &str,
        msg: &OutboundMessage,
        extra: &[(&str, &str)],
    ) -> Result<(), PublishError> {
        self.queue(|state| {
            let Shared { out, headers, .. } = state;
            headers.write_hpub_with(out, stream, msg, proto::ReplyTo::None, extra);
        })
    }

    /// Queues `msg` (into `stream`) with the `extra` header lines; the receiver gets the
    /// answer as it came (an atomic batch's commit, whose PubAck names the batch).
    pub(crate) fn publish_raw(
        &self,
        stream: &str,
        msg: &Arc<OutboundMessage>,
        extra: &[(&str, &str)],
    ) -> Result<oneshot::Receiver<RawOutcome>, PublishError> {
        self.publish_numbered(stream, msg, extra, pending::Pending::push_raw)
    }

    /// A new fast batch's reply subjects on this connection: `inbox` (whose last token is the
    /// batch's id) and the answers that come on `<inbox>.>`. Fails while the connection is
    /// down; the answers end when it is lost or the handle is dropped.
    pub(crate) fn batch_replies(&self) -> Result<BatchReplies, PublishError> {
        let token = nuid::next().to_string();
        let (sender, answers) = mpsc::unbounded_channel();
        self.queue(|state| {
            state.batch_replies.insert(token.clone(), sender);
        })?;
        Ok(BatchReplies {
            inbox: format!("{}.{token}", self.inner.batch_prefix),
            token,
            answers,
            inner: self.inner.clone(),
        })
    }

    /// The longest reply subject of a fast batch with `flow` messages between flow acks:
    /// `<batch prefix>.<22-character token>` and the batch's suffix.
    pub(crate) fn batch_reply_len(&self, flow: usize) -> usize {
        self.inner.batch_prefix.len() + 1 + 22 + proto::fast_batch_reply_suffix_len(flow)
    }

    /// Waits until the server has read everything queued so far (a `PING` after it, and its
    /// `PONG`), at most `wait`; `false` when it did not within `wait` or the connection is down.
    pub(crate) async fn flush(&self, wait: Duration) -> bool {
        let (done, pong) = oneshot::channel();
        let queued = self.queue(|state| {
            state.pongs.push_back(Some(done));
            state.out.extend_from_slice(b"PING\r\n");
        });
        queued.is_ok() && matches!(tokio::time::timeout(wait, pong).await, Ok(Ok(())))
    }

    /// Queues `msg` (into `stream`) replying to `reply`, with no PubAck awaited: a fast batch's
    /// message, whose answers the batch's own subscription reads. Fails while the connection
    /// is down (the batch's reader then sees no answer, and the message is re-sent).
    pub(crate) fn publish_to(
        &self,
        stream: &str,
        msg: &OutboundMessage,
        reply: &str,
    ) -> Result<(), PublishError> {
        self.queue(|state| {
            let Shared { out, headers, .. } = state;
            headers.write_hpub(out, stream, msg, proto::ReplyTo::Subject(reply));
        })
    }

    /// Queues an empty message to `subject` replying to `reply` (a fast batch's commit).
    pub(crate) fn publish_empty(&self, subject: &str, reply: &str) -> Result<(), PublishError> {
        self.queue(|state| proto::write_empty_pub(&mut state.out, subject, reply))
    }

    /// Runs `write` (appending frames) on the shared state and wakes the writer; fails as
    /// unknown while the connection is down.
    fn queue<T>(&self, write: impl FnOnce(&mut Shared) -> T) -> Result<T, PublishError> {
        let inner = &self.inner;
        let written = {
            let mut state = inner.lock();
            if !state.live {
                return Err(not_connected(&inner.settings));
            }
            write(&mut state)
        };
        inner.wake_writer.notify_one();
        Ok(written)
    }
}

/// A fast batch's reply subjects and answers (see [`LeanConnection::batch_replies`]).
pub(crate) struct BatchReplies {
    /// `<batch prefix>.<token>`: the batch's messages reply to `<inbox>.<flow>.fail.…`.
    pub(crate) inbox: String,
    token: String,
    answers: mpsc::UnboundedReceiver<Bytes>,
    inner: Arc<Inner>,
}

impl BatchReplies {
    /// The next answer's payload; `None` once the connection was lost.
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.answers.recv().await
    }
}

impl Drop for BatchReplies {
    fn drop(&mut self) {
        self.inner.lock().batch_replies.remove(&self.token);
    }
}

fn not_connected(settings: &WireSettings) -> PublishError {
    PublishError::new(
        PublishErrorKind::Unknown,
        format!(
            "not connected to NATS at {} (reconnecting)",
            settings.display_url
        ),
    )
}

/// The headers of `msg` exactly as the lean path frames them, as `(name, value)` lines in
/// order (tests compare them with [`crate::JetStreamPublisher::headers`]).
#[cfg(test)]
pub(crate) fn framed_header_lines(stream: &str, msg: &OutboundMessage) -> Vec<(String, String)> {
    let mut out = BytesMut::new();
    WireHeaders::default().write_hpub(
        &mut out,
        stream,
        msg,
        proto::ReplyTo::Numbered("_INBOX.t", 0),
    );
    let text = std::str::from_utf8(&out).expect("utf-8 frame");
    let (line, rest) = text.split_once("\r\n").expect("a control line");
    let header_len: usize = line
        .split(' ')
        .nth(3)
        .and_then(|n| n.parse().ok())
        .expect("a header length");
    proto::header_block_lines(&rest.as_bytes()[..header_len]).expect("a header block")
}

#[cfg(test)]
mod parser_props;
#[cfg(test)]
mod pub_ack_props;
#[cfg(test)]
mod tests;
