//! The lean connection's life: a supervisor task connects (through the configured and the
//! learned servers, with bounded backoff), then reads and writes until the connection is lost,
//! resolves everything outstanding as unknown at once, and connects again.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{BATCH_TOKEN_PREFIX, Inner};
use crate::connect::{self, Opened, Reader, ServerUrl, Writer};
use crate::error::{WireError, WireErrorKind};
use crate::proto::{self, ServerOp};
use crate::{Framing, is_closing_protocol_error};

/// Servers learned from `INFO` `connect_urls`, at most: a cluster announces a few.
pub(crate) const MAX_DISCOVERED: usize = 64;

/// How often the reader looks for PubAcks past their deadline.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// How often the client pings an idle-looking server, and how many unanswered pings mean the
/// connection is dead (a half-open TCP connection otherwise looks alive forever).
const PING_EVERY: Duration = Duration::from_secs(20);
const MAX_PINGS_OUT: u32 = 2;
/// Backoff between passes through the server list.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Why a connection ended.
enum Loss {
    Io(std::io::Error),
    Protocol(proto::ProtocolError),
    Stale,
    Stopped,
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                f.write_str("the server closed the connection")
            }
            Self::Io(e) => write!(f, "{e}"),
            Self::Protocol(e) => write!(f, "{e}"),
            Self::Stale => f.write_str("no PONG to the client's PINGs (stale connection)"),
            Self::Stopped => f.write_str("the publisher was dropped"),
        }
    }
}

/// Connects and reconnects until `stop`'s sender is dropped.
pub(crate) async fn supervise<F: Framing>(inner: Arc<Inner<F>>, mut stop: watch::Receiver<()>) {
    let mut backoff = Duration::ZERO;
    let mut next = 0usize;
    let mut failures = 0u32;
    loop {
        if !backoff.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
        }
        let servers = inner.servers();
        let mut opened = None;
        let mut last_error = String::new();
        let subscribe = inner.subscribe_frame();
        for i in 0..servers.len() {
            let index = (next + i) % servers.len();
            let server = &servers[index];
            let attempt = tokio::select! {
                result = connect::open(&inner.settings, server, &subscribe) => result,
                _ = stop.changed() => return,
            };
            match attempt {
                Ok(o) => {
                    opened = Some((index, o));
                    break;
                }
                Err(connect::OpenError::Refused(text))
                    if !inner.ever_connected.load(Ordering::Relaxed) =>
                {
                    // async-nats connected with the same credentials, so this is about a
                    // second connection (a connection limit, say): keep publishing, on it.
                    tracing::warn!(server = %format!("{}:{}", server.host, server.port), error = %text, "publishing through async-nats: the server refused the lean publish connection (a second connection with the relay's credentials; check the account's or user's connection limit)");
                    inner.refused.store(true, Ordering::Relaxed);
                    inner.up.send_modify(|_| {});
                    return;
                }
                Err(e) => {
                    last_error = format!("{}:{}: {e}", server.host, server.port);
                }
            }
        }
        let Some((index, opened)) = opened else {
            failures += 1;
            // Once loudly; then quietly while the outage lasts.
            if failures == 1 {
                tracing::warn!(url = %inner.settings.display_url, error = %last_error, "cannot connect the lean publish connection to NATS; retrying");
            } else {
                tracing::debug!(url = %inner.settings.display_url, error = %last_error, "cannot connect the lean publish connection to NATS; retrying");
            }
            backoff = (backoff * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
            continue;
        };
        let server = format!("{}:{}", servers[index].host, servers[index].port);
        if !inner.ever_connected.load(Ordering::Relaxed) {
            tracing::info!(%server, server_version = %opened.info.version, "publishing each message on the relay's own NATS connection (lean publish path)");
        } else if failures > 0 {
            tracing::info!(%server, "lean publish connection to NATS restored");
        }
        failures = 0;
        backoff = Duration::ZERO;
        let loss = run(&inner, opened, &mut stop).await;
        inner.lost(&loss.to_string());
        if matches!(loss, Loss::Stopped) {
            return;
        }
        tracing::debug!(reason = %loss, "lean publish connection to NATS lost; reconnecting");
        // Reconnect at once (the first pass), starting with the next server: a killed node
        // refuses quickly, a live one takes over.
        next = index + 1;
    }
}

/// Serves one open connection until it is lost.
async fn run<F: Framing>(
    inner: &Arc<Inner<F>>,
    opened: Opened,
    stop: &mut watch::Receiver<()>,
) -> Loss {
    let Opened {
        reader,
        writer,
        info,
        leftover,
    } = opened;
    inner.connected(&info);
    tokio::select! {
        loss = read_loop(inner, reader, leftover) => loss,
        loss = write_loop(inner, writer) => loss,
        _ = stop.changed() => Loss::Stopped,
    }
}

async fn write_loop<F: Framing>(inner: &Inner<F>, mut writer: Writer) -> Loss {
    let mut spare = BytesMut::with_capacity(64 * 1024);
    loop {
        inner.wake_writer.notified().await;
        inner.take_frames(&mut spare);
        if spare.is_empty() {
            continue;
        }
        // One write for whatever accumulated: frames queued while it is under way go in the
        // next one.
        let written = async {
            writer.write_all(&spare).await?;
            writer.flush().await
        };
        if let Err(e) = written.await {
            return Loss::Io(e);
        }
        spare.clear();
    }
}

async fn read_loop<F: Framing>(inner: &Inner<F>, mut reader: Reader, mut buf: BytesMut) -> Loss {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_ping = Instant::now();
    loop {
        loop {
            let limit = proto::message_limit(inner.max_payload.load(Ordering::Relaxed));
            match proto::parse_op(&mut buf, limit) {
                Ok(Some(op)) => inner.on_op(op),
                Ok(None) => break,
                Err(e) => return Loss::Protocol(e),
            }
        }
        buf.reserve(32 * 1024);
        tokio::select! {
            read = reader.read_buf(&mut buf) => match read {
                Ok(0) => return Loss::Io(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) => return Loss::Io(e),
            },
            _ = sweep.tick() => {
                let now = Instant::now();
                inner.expire(now);
                if now.duration_since(last_ping) >= PING_EVERY {
                    last_ping = now;
                    if !inner.ping() {
                        return Loss::Stale;
                    }
                }
            }
        }
    }
}

impl<F: Framing> Inner<F> {
    /// Configured servers first, then those the cluster announced.
    fn servers(&self) -> Vec<ServerUrl> {
        let state = self.lock();
        let mut servers = self.settings.servers.clone();
        servers.extend(state.discovered.iter().cloned());
        servers
    }

    /// `SUB <reply prefix>.* 1` and `SUB <batch prefix>.> 2`, sent with `CONNECT`: every PubAck
    /// comes on the first, every fast batch's answer on the second, both on this connection and
    /// subscribed before anything is published (no answer can come before its subscription).
    fn subscribe_frame(&self) -> BytesMut {
        let mut frame = BytesMut::new();
        proto::write_sub(&mut frame, &format!("{}.*", self.reply_prefix), 1);
        proto::write_sub(&mut frame, &format!("{}.>", self.batch_prefix), 2);
        frame
    }

    fn connected(&self, info: &proto::ServerInfo) {
        self.learn(info);
        {
            let mut state = self.lock();
            state.live = true;
            state.out.clear();
            state.closing = None;
            state.pings_out = 0;
        }
        self.ever_connected.store(true, Ordering::Relaxed);
        self.up.send_replace(true);
    }

    /// The connection is gone: every outstanding publish resolves at once, as closed by the
    /// server when a protocol `-ERR` about what was sent came before the loss.
    fn lost(&self, reason: &str) {
        self.up.send_replace(false);
        let mut state = self.lock();
        state.live = false;
        state.out.clear();
        // Each fast batch's reader sees its answers end, and re-sends what is outstanding.
        state.batch_replies.clear();
        // Nobody waits for a flush of frames the connection lost.
        state.pongs.clear();
        let closing = state.closing.take();
        if let Some(error) = &closing {
            tracing::warn!(error = %error, "NATS closed the connection over what the relay sent");
        }
        state.pending.drain(|| match &closing {
            Some(error) => WireError::new(
                WireErrorKind::ClosedByServer,
                format!("NATS closed the connection after this message was sent: -ERR '{error}'"),
            ),
            None => WireError::unknown(format!(
                "the NATS connection was lost before the PubAck came ({reason})"
            )),
        });
    }

    fn learn(&self, info: &proto::ServerInfo) {
        if info.max_payload > 0 {
            self.max_payload.store(info.max_payload, Ordering::Relaxed);
        }
        if info.connect_urls.is_empty() {
            return;
        }
        let mut state = self.lock();
        for url in &info.connect_urls {
            // A server (or something posing as one) cannot grow the list without end.
            if state.discovered.len() >= MAX_DISCOVERED {
                break;
            }
            let Ok(server) = ServerUrl::parse(url) else {
                continue;
            };
            let known = |s: &ServerUrl| s.host == server.host && s.port == server.port;
            if !self.settings.servers.iter().any(known) && !state.discovered.iter().any(known) {
                tracing::debug!(server = %url, "learned a NATS server for failover");
                state.discovered.push(server);
            }
        }
    }

    /// Moves the frames waiting to be written into `into` (emptied by the caller).
    fn take_frames(&self, into: &mut BytesMut) {
        let mut state = self.lock();
        std::mem::swap(&mut state.out, into);
    }

    fn queue(&self, frame: &[u8]) {
        self.lock().out.extend_from_slice(frame);
        self.wake_writer.notify_one();
    }

    /// Sends a keepalive `PING`; `false` when too many went unanswered.
    fn ping(&self) -> bool {
        {
            let mut state = self.lock();
            if state.pings_out >= MAX_PINGS_OUT {
                return false;
            }
            state.pings_out += 1;
            state.pongs.push_back(None);
        }
        self.queue(b"PING\r\n");
        true
    }

    /// A `PONG` answers the oldest `PING` out: the server has read everything sent before it.
    fn on_pong(&self) {
        let mut state = self.lock();
        state.pings_out = 0;
        if let Some(Some(waiter)) = state.pongs.pop_front() {
            let _ = waiter.send(());
        }
    }

    fn expire(&self, now: Instant) {
        let mut state = self.lock();
        if state.pending.len() == 0 {
            return;
        }
        let timeout = self.ack_timeout;
        state.pending.expire(now, || {
            WireError::unknown(format!("no PubAck within nats.ack_timeout ({timeout:?})"))
        });
    }

    fn on_op(&self, op: ServerOp) {
        match op {
            ServerOp::Msg {
                subject,
                headers,
                payload,
            } => self.on_reply(&subject, headers.as_ref(), &payload),
            ServerOp::Ping => self.queue(b"PONG\r\n"),
            ServerOp::Pong => self.on_pong(),
            ServerOp::Ok => {}
            ServerOp::Info(text) => match text.parse() {
                Ok(info) => self.learn(&info),
                Err(e) => tracing::debug!(error = %e, "ignoring an INFO update"),
            },
            ServerOp::Err(text) => self.on_server_error(&text),
        }
    }

    fn on_reply(&self, subject: &[u8], headers: Option<&Bytes>, payload: &Bytes) {
        let Some(rest) = subject
            .strip_prefix(self.reply_prefix.as_bytes())
            .and_then(|rest| rest.strip_prefix(b"."))
        else {
            return;
        };
        if let Some(token) = rest.strip_prefix(BATCH_TOKEN_PREFIX) {
            // `<batch prefix>.<batch token>.<flow>.<gap mode>.<seq>.<operation>.$FI`: to the
            // batch's reader, if it still reads.
            let token = token.split(|&b| b == b'.').next().unwrap_or_default();
            let state = self.lock();
            if let Some(reader) = std::str::from_utf8(token)
                .ok()
                .and_then(|token| state.batch_replies.get(token))
            {
                let _ = reader.send(payload.clone());
            }
            return;
        }
        let Some(n) = proto::parse_reply_token(rest) else {
            return;
        };
        let status = headers.and_then(|h| proto::status_code(h));
        self.lock().pending.resolve(n, status, payload);
    }

    fn on_server_error(&self, text: &str) {
        if is_closing_protocol_error(text) {
            // The server closes the connection next: the loss counts as a server close.
            self.lock().closing = Some(text.into());
            return;
        }
        if let Some(observe) = &self.settings.on_server_error {
            observe(text);
        }
        // `Permissions Violation for Publish to "<subject>"`: no PubAck will come for
        // publishes to it; say so now instead of after the ack timeout.
        if let Some(subject) = text
            .split_once("Permissions Violation for Publish to \"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(subject, _)| subject)
        {
            self.lock().pending.resolve_subject(subject, || {
                WireError::new(
                    WireErrorKind::Denied,
                    format!("NATS refused to let this connection publish to `{subject}` ({text})"),
                )
            });
        }
    }
}
