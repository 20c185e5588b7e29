//! The connection: the handle the caller publishes through, and the state its tasks share.
//! Every message and every answer of every publish mode goes on it: PubAcks (on one wildcard
//! `SUB`, matched by publish number), atomic batches (members without a reply, the commit with
//! one, its answer handed over as it came) and fast batches (answers on a second `SUB` made
//! with `CONNECT`, routed to each batch's reader).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::connect::{self, ConnectOptions};
use crate::error::WireError;
use crate::headers::WireHeaders;
use crate::pending::{self, Outcome, RawOutcome};
use crate::{Framing, proto};

mod session;

/// After `<reply prefix>.`, what starts a fast batch's reply subjects: `b.<batch token>.…`.
pub(crate) const BATCH_TOKEN_PREFIX: &[u8] = b"b.";

/// A publishing connection for messages read through `F`. It connects on first use and keeps
/// reconnecting; dropping the last handle stops its task and closes it.
pub struct Connection<F: Framing> {
    pub(crate) inner: Arc<Inner<F>>,
    /// Dropped with the handle: the supervisor sees its receiver close and stops.
    _stop: watch::Sender<()>,
    stop: watch::Receiver<()>,
    started: AtomicBool,
}

impl<F: Framing> std::fmt::Debug for Connection<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<F: Framing> {
    pub(crate) settings: Arc<ConnectOptions>,
    /// `<inbox prefix>.<unique>`: publish `n` replies to `<reply_prefix>.<16 hex digits of n>`.
    pub(crate) reply_prefix: String,
    /// `<reply prefix>.b`: a fast batch's replies are `<batch prefix>.<batch token>.…`.
    pub(crate) batch_prefix: String,
    pub(crate) ack_timeout: Duration,
    pub(crate) state: Mutex<Shared<F>>,
    pub(crate) wake_writer: Notify,
    /// The server's `max_payload` (0 before the first `INFO`).
    pub(crate) max_payload: AtomicUsize,
    pub(crate) ever_connected: AtomicBool,
    /// The server refused the first connection: publish through async-nats instead.
    pub(crate) refused: AtomicBool,
    pub(crate) up: watch::Sender<bool>,
}

/// What the publishing side and the connection's tasks share, behind one lock.
pub(crate) struct Shared<F: Framing> {
    /// A connection is up and takes frames.
    pub(crate) live: bool,
    /// Frames not yet written.
    pub(crate) out: BytesMut,
    pub(crate) pending: pending::Pending<F>,
    pub(crate) next_n: u64,
    pub(crate) headers: WireHeaders,
    /// A protocol `-ERR` after which the server closes the connection.
    pub(crate) closing: Option<Arc<str>>,
    /// Servers learned from `INFO` `connect_urls`.
    pub(crate) discovered: Vec<connect::ServerUrl>,
    pub(crate) pings_out: u32,
    /// One entry per `PING` out, in order: who waits for its `PONG` (a flush), if anyone.
    pub(crate) pongs: VecDeque<Option<oneshot::Sender<()>>>,
    /// The readers of the open fast batches, by batch token.
    pub(crate) batch_replies: HashMap<String, mpsc::UnboundedSender<Bytes>>,
}

impl<F: Framing> Default for Shared<F> {
    fn default() -> Self {
        Self {
            live: false,
            out: BytesMut::new(),
            pending: pending::Pending::default(),
            next_n: 0,
            headers: WireHeaders::default(),
            closing: None,
            discovered: Vec::new(),
            pings_out: 0,
            pongs: VecDeque::new(),
            batch_replies: HashMap::new(),
        }
    }
}

impl<F: Framing> Inner<F> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared<F>> {
        // A poisoned lock only means a panic elsewhere mid-update; the state stays usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<F: Framing> Connection<F> {
    /// A connection made from `settings`, opened on first use; a publish without an answer
    /// within `ack_timeout` ends as unknown.
    pub fn new(settings: Arc<ConnectOptions>, ack_timeout: Duration) -> Self {
        let (stop_tx, stop) = watch::channel(());
        let reply_prefix = format!("{}.{}", settings.inbox_prefix, nuid::next());
        let pending = pending::Pending::expecting(settings.stream.clone(), settings.domain.clone());
        Self {
            inner: Arc::new(Inner {
                settings,
                batch_prefix: format!("{reply_prefix}.b"),
                reply_prefix,
                ack_timeout,
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
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload.load(Ordering::Relaxed)
    }

    /// The length of a reply subject: `<reply prefix>.<16 hex digits>`.
    pub fn reply_len(&self) -> usize {
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
    pub async fn ready(&self, wait: Duration) -> bool {
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
    pub fn refused(&self) -> bool {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// Queues `msg` (into `stream`) for the writer; the receiver gets its outcome. Fails as
    /// unknown while the connection is down (the caller re-sends).
    pub fn publish(
        &self,
        stream: &str,
        msg: &Arc<F::Message>,
    ) -> Result<oneshot::Receiver<Outcome>, WireError> {
        self.publish_numbered(stream, msg, &[], pending::Pending::<F>::push)
    }

    /// [`Self::publish`], stored only if `condition` (a header line: a commit-order condition,
    /// `Nats-Expected-Last-Msg-Id` or `Nats-Expected-Last-Sequence`) holds, when set; the
    /// server answers 10070 or 10071 otherwise.
    pub fn publish_if(
        &self,
        stream: &str,
        msg: &Arc<F::Message>,
        condition: Option<(&str, &str)>,
    ) -> Result<oneshot::Receiver<Outcome>, WireError> {
        match condition {
            None => self.publish_numbered(stream, msg, &[], pending::Pending::<F>::push),
            Some(line) => self.publish_numbered(stream, msg, &[line], pending::Pending::<F>::push),
        }
    }

    /// Queues `msg` (into `stream`) with the `extra` header lines, replying to its publish
    /// number, and registers it with `register` (which says how its answer is handed over).
    fn publish_numbered<T>(
        &self,
        stream: &str,
        msg: &Arc<F::Message>,
        extra: &[(&str, &str)],
        register: impl FnOnce(&mut pending::Pending<F>, u64, Arc<F::Message>, Instant) -> T,
    ) -> Result<T, WireError> {
        let inner = &self.inner;
        self.queue(|state| {
            let n = state.next_n;
            let Shared { out, headers, .. } = &mut *state;
            let reply = proto::ReplyTo::Numbered(&inner.reply_prefix, n);
            headers.write_hpub_with::<F>(out, stream, msg, reply, extra)?;
            state.next_n += 1;
            Ok(register(
                &mut state.pending,
                n,
                msg.clone(),
                Instant::now() + inner.ack_timeout,
            ))
        })?
    }

    /// Queues `msg` (into `stream`) with the `extra` header lines and no reply: an atomic
    /// batch's message before its commit, which the server does not answer.
    pub fn publish_unanswered(
        &self,
        stream: &str,
        msg: &F::Message,
        extra: &[(&str, &str)],
    ) -> Result<(), WireError> {
        self.queue(|state| {
            let Shared { out, headers, .. } = state;
            headers.write_hpub_with::<F>(out, stream, msg, proto::ReplyTo::None, extra)
        })?
    }

    /// Queues `msg` (into `stream`) with the `extra` header lines; the receiver gets the
    /// answer as it came (an atomic batch's commit, whose PubAck names the batch).
    pub fn publish_raw(
        &self,
        stream: &str,
        msg: &Arc<F::Message>,
        extra: &[(&str, &str)],
    ) -> Result<oneshot::Receiver<RawOutcome>, WireError> {
        self.publish_numbered(stream, msg, extra, pending::Pending::<F>::push_raw)
    }

    /// A new fast batch's reply subjects on this connection: `inbox` (whose last token is the
    /// batch's id) and the answers that come on `<inbox>.>`. Fails while the connection is
    /// down; the answers end when it is lost or the handle is dropped.
    pub fn batch_replies(&self) -> Result<BatchReplies<F>, WireError> {
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
    pub fn batch_reply_len(&self, flow: usize) -> usize {
        self.inner.batch_prefix.len() + 1 + 22 + proto::fast_batch_reply_suffix_len(flow)
    }

    /// Waits until the server has read everything queued so far (a `PING` after it, and its
    /// `PONG`), at most `wait`; `false` when it did not within `wait` or the connection is down.
    pub async fn flush(&self, wait: Duration) -> bool {
        let (done, pong) = oneshot::channel();
        let queued = self.queue(|state| {
            state.pongs.push_back(Some(done));
            state.out.extend_from_slice(b"PING\r\n");
        });
        queued.is_ok() && matches!(tokio::time::timeout(wait, pong).await, Ok(Ok(())))
    }

    /// Queues `msg` (into `stream`) replying to `reply`, with the `extra` header lines (a fast
    /// batch's first message carries its condition) and no PubAck awaited: a fast batch's
    /// message, whose answers the batch's own subscription reads. Fails while the connection
    /// is down (the batch's reader then sees no answer, and the message is re-sent).
    pub fn publish_to(
        &self,
        stream: &str,
        msg: &F::Message,
        reply: &str,
        extra: &[(&str, &str)],
    ) -> Result<(), WireError> {
        self.queue(|state| {
            let Shared { out, headers, .. } = state;
            headers.write_hpub_with::<F>(out, stream, msg, proto::ReplyTo::Subject(reply), extra)
        })?
    }

    /// Queues an empty message to `subject` replying to `reply` (a fast batch's commit).
    pub fn publish_empty(&self, subject: &str, reply: &str) -> Result<(), WireError> {
        self.queue(|state| proto::write_empty_pub(&mut state.out, subject, reply))
    }

    /// Runs `write` (appending frames) on the shared state and wakes the writer; fails as
    /// unknown while the connection is down.
    fn queue<T>(&self, write: impl FnOnce(&mut Shared<F>) -> T) -> Result<T, WireError> {
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

/// A fast batch's reply subjects and answers (see [`Connection::batch_replies`]).
pub struct BatchReplies<F: Framing> {
    /// `<batch prefix>.<token>`: the batch's messages reply to `<inbox>.<flow>.fail.…`.
    pub inbox: String,
    token: String,
    answers: mpsc::UnboundedReceiver<Bytes>,
    inner: Arc<Inner<F>>,
}

impl<F: Framing> std::fmt::Debug for BatchReplies<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchReplies")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl<F: Framing> BatchReplies<F> {
    /// The next answer's payload; `None` once the connection was lost.
    pub async fn next(&mut self) -> Option<Bytes> {
        self.answers.recv().await
    }
}

impl<F: Framing> Drop for BatchReplies<F> {
    fn drop(&mut self) {
        self.inner.lock().batch_replies.remove(&self.token);
    }
}

fn not_connected(settings: &ConnectOptions) -> WireError {
    WireError::unknown(format!(
        "not connected to NATS at {} (reconnecting)",
        settings.display_url
    ))
}

/// The headers of `msg` (into `stream`) exactly as the connection frames them, as
/// `(name, value)` lines in order: for a caller that checks another publish path sends the
/// same set.
pub fn framed_header_lines<F: Framing>(stream: &str, msg: &F::Message) -> Vec<(String, String)> {
    let mut out = BytesMut::new();
    if WireHeaders::default()
        .write_hpub::<F>(
            &mut out,
            stream,
            msg,
            proto::ReplyTo::Numbered("_INBOX.t", 0),
        )
        .is_err()
    {
        return Vec::new();
    }
    let text = std::str::from_utf8(&out).expect("utf-8 frame");
    let (line, rest) = text.split_once("\r\n").expect("a control line");
    let header_len: usize = line
        .split(' ')
        .nth(3)
        .and_then(|n| n.parse().ok())
        .expect("a header length");
    proto::header_block_lines(&rest.as_bytes()[..header_len]).expect("a header block")
}
