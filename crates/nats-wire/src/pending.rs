//! The lean path's outstanding publishes, keyed by publish number: a ring, since numbers are
//! handed out in order and PubAcks normally come back in order. One deadline sweep replaces a
//! timer per message.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Framing;
use crate::error::{ApiError, WireError, WireErrorKind};

/// Whether a PubAck naming JetStream domain `received` (`None`: none) is from the `expected`
/// domain: without one expected every PubAck is. The one rule for every publish path.
#[inline]
pub fn ack_domain_matches(expected: Option<&str>, received: Option<&[u8]>) -> bool {
    match expected {
        None => true,
        Some(expected) => received == Some(expected.as_bytes()),
    }
}

/// What JetStream stored: the stream sequence, and whether the message was a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub seq: u64,
    pub duplicate: bool,
}

/// How one publish ended.
pub type Outcome = Result<Stored, WireError>;

/// How a publish whose answer its caller reads itself ended: the answer's payload (an atomic
/// batch's commit PubAck, with the batch's fields or error code), or why none came. A 503
/// status is [`no_responders`].
pub type RawOutcome = Result<bytes::Bytes, WireError>;

/// A JetStream PubAck (or its error). `stream` and `seq` are what make it one: an answer
/// without them is not taken for a stored message.
#[derive(Debug, Deserialize)]
struct PubAck {
    /// For a refusal naming the stream (this is the slow path: [`plain_pub_ack`] reads
    /// the common PubAck without allocating).
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    seq: Option<u64>,
    #[serde(default)]
    duplicate: bool,
    #[serde(default)]
    error: Option<ApiError>,
}

/// The outcome a PubAck's payload says, with no JetStream domain to check.
pub fn parse_pub_ack(payload: &[u8]) -> Outcome {
    parse_pub_ack_in(payload, None)
}

/// The outcome a PubAck's payload says; with `domain`, one that names another domain (or
/// none) is [`WireErrorKind::OtherDomain`].
pub fn parse_pub_ack_in(payload: &[u8], domain: Option<&str>) -> Outcome {
    parse_pub_ack_from(payload, None, domain)
}

/// [`parse_pub_ack_in`], and with `stream`, a PubAck naming another stream is
/// [`WireErrorKind::OtherStream`].
#[inline]
pub fn parse_pub_ack_from(payload: &[u8], stream: Option<&str>, domain: Option<&str>) -> Outcome {
    if let Some((stored, acked_by, acked_in)) = plain_pub_ack(payload)
        && stream.is_none_or(|s| s.as_bytes() == acked_by)
        && ack_domain_matches(domain, acked_in)
    {
        return Ok(stored);
    }
    let unreadable = |e: &dyn std::fmt::Display| {
        WireError::unknown(format!(
            "unreadable PubAck ({e}): {}",
            String::from_utf8_lossy(&payload[..payload.len().min(200)])
        ))
    };
    // From a `str`: serde_json skips the strings of fields it ignores without checking that
    // they are UTF-8, so bytes that are not JSON would otherwise pass.
    let text = std::str::from_utf8(payload).map_err(|e| unreadable(&e))?;
    let ack: PubAck = serde_json::from_str(text).map_err(|e| unreadable(&e))?;
    if let Some(error) = ack.error {
        return Err(WireError::new(
            WireErrorKind::Refused {
                err_code: error.err_code,
            },
            format!(
                "JetStream refused the message: {} (status {}, error code {})",
                error.description, error.code, error.err_code
            ),
        ));
    }
    match (ack.stream, ack.seq) {
        (Some(acked_by), Some(_)) if stream.is_some_and(|s| s != acked_by) => Err(WireError::new(
            WireErrorKind::OtherStream {
                expected: stream.unwrap_or_default().to_owned(),
                received: acked_by,
            },
            "a PubAck naming another stream",
        )),
        (Some(stream), Some(seq)) => {
            let received = ack.domain.filter(|d| !d.is_empty());
            if !ack_domain_matches(domain, received.as_deref().map(str::as_bytes)) {
                return Err(WireError::new(
                    WireErrorKind::OtherDomain {
                        stream,
                        expected: domain.unwrap_or_default().to_owned(),
                        received,
                    },
                    "a PubAck from another JetStream domain",
                ));
            }
            Ok(Stored {
                seq,
                duplicate: ack.duplicate,
            })
        }
        _ => Err(WireError::unknown(format!(
            "an answer that is not a PubAck (no stream or sequence): {}",
            String::from_utf8_lossy(&payload[..payload.len().min(200)])
        ))),
    }
}

/// A plain PubAck: what it stored, the stream's name and the domain's, as bytes of the answer.
type PlainAck<'a> = (Stored, &'a [u8], Option<&'a [u8]>);

/// The PubAck as nats-server writes it for a stored message, `{"stream":"S", "seq":N}` (an
/// optional `"domain":"D"` entry between, and `,"duplicate": true` at the end for a duplicate),
/// read without serde: it is on the path of every event, where serde_json's field matching was
/// a tenth of the relay's instructions per message. `None` for anything else (an error, other
/// fields, escapes in a string): [`parse_pub_ack_in`] then reads it with serde_json. With it
/// the stream's name and the `domain` entry's bytes, if any.
fn plain_pub_ack(payload: &[u8]) -> Option<PlainAck<'_>> {
    /// JSON's whitespace only (`is_ascii_whitespace` would also skip a form feed).
    fn ws(b: &[u8]) -> &[u8] {
        let n = b
            .iter()
            .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
            .count();
        &b[n..]
    }
    /// The rest after a JSON string of printable ASCII without escapes (the opening quote
    /// already taken); anything else (a control character JSON forbids, bytes that may not be
    /// UTF-8) is left to serde_json.
    fn string_end(b: &[u8]) -> Option<&[u8]> {
        let end = b
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || !(0x20..0x7f).contains(&c))?;
        (b[end] == b'"').then(|| &b[end + 1..])
    }
    fn entry<'a>(b: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
        let b = ws(b).strip_prefix(b"\"")?.strip_prefix(key)?;
        Some(ws(ws(b.strip_prefix(b"\"")?).strip_prefix(b":")?))
    }
    let name = entry(payload.strip_prefix(b"{")?, b"stream")?.strip_prefix(b"\"")?;
    let mut rest = string_end(name)?;
    let stream = &name[..name.len() - rest.len() - 1];
    rest = ws(rest).strip_prefix(b",")?;
    let mut domain = None;
    if let Some(value) = entry(rest, b"domain") {
        let text = value.strip_prefix(b"\"")?;
        let after = string_end(text)?;
        domain = Some(&text[..text.len() - after.len() - 1]);
        rest = ws(after).strip_prefix(b",")?;
    }
    rest = entry(rest, b"seq")?;
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 || digits > 20 || (digits > 1 && rest[0] == b'0') {
        return None;
    }
    let seq = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    rest = ws(&rest[digits..]);
    let duplicate = match rest.strip_prefix(b",") {
        Some(more) => {
            rest = ws(entry(more, b"duplicate")?.strip_prefix(b"true")?);
            true
        }
        None => false,
    };
    (ws(rest.strip_prefix(b"}")?).is_empty()).then_some((Stored { seq, duplicate }, stream, domain))
}

/// The outcome of a 503 status: no stream captures the subject (or its leader is being
/// elected).
pub(crate) fn no_responders(subject: &str) -> WireError {
    WireError::new(
        WireErrorKind::NoResponders,
        format!("no responders: no JetStream stream captures `{subject}` right now"),
    )
}

struct Entry<M> {
    msg: Arc<M>,
    deadline: Instant,
    done: Done,
}

/// Where a publish's outcome goes.
enum Done {
    /// The PubAck read here.
    Parsed(oneshot::Sender<Outcome>),
    /// The answer as it came.
    Raw(oneshot::Sender<RawOutcome>),
}

impl Done {
    /// Hands over `error` (the receiver may be gone: the delivery was dropped).
    fn fail(self, error: WireError) {
        match self {
            Self::Parsed(done) => drop(done.send(Err(error))),
            Self::Raw(done) => drop(done.send(Err(error))),
        }
    }

    /// Hands over the answer to a publish to `subject`: its status (from the header block),
    /// and its payload.
    #[inline]
    fn answer(
        self,
        subject: &str,
        status: Option<u16>,
        payload: &bytes::Bytes,
        stream: Option<&str>,
        domain: Option<&str>,
    ) {
        let refused = match status {
            Some(503) => Some(no_responders(subject)),
            Some(code) => Some(WireError::unknown(format!(
                "NATS answered the publish with status {code}"
            ))),
            None => None,
        };
        match (self, refused) {
            (done, Some(error)) => done.fail(error),
            (Self::Parsed(done), None) => {
                drop(done.send(parse_pub_ack_from(payload, stream, domain)));
            }
            (Self::Raw(done), None) => drop(done.send(Ok(payload.clone()))),
        }
    }
}

/// Outstanding publishes numbered `base..base + ring.len()`; a resolved one leaves a hole
/// until the ones before it resolve.
pub(crate) struct Pending<F: Framing> {
    base: u64,
    ring: VecDeque<Option<Entry<F::Message>>>,
    count: usize,
    /// `[nats] domain`: the domain every PubAck must name.
    domain: Option<Arc<str>>,
    /// `[nats] stream`: the stream every PubAck must name.
    stream: Option<Arc<str>>,
}

impl<F: Framing> Default for Pending<F> {
    fn default() -> Self {
        Self {
            base: 0,
            ring: VecDeque::new(),
            count: 0,
            domain: None,
            stream: None,
        }
    }
}

impl<F: Framing> Pending<F> {
    /// No publishes yet; their PubAcks must name `stream` and JetStream domain `domain`, each
    /// if set.
    pub(crate) fn expecting(stream: Option<Arc<str>>, domain: Option<Arc<str>>) -> Self {
        Self {
            domain,
            stream,
            ..Self::default()
        }
    }

    /// Adds publish number `n` (one more than the last added, after a [`Self::drain`] any
    /// number), its PubAck parsed here.
    pub(crate) fn push(
        &mut self,
        n: u64,
        msg: Arc<F::Message>,
        deadline: Instant,
    ) -> oneshot::Receiver<Outcome> {
        let (done, receiver) = oneshot::channel();
        self.add(n, msg, deadline, Done::Parsed(done));
        receiver
    }

    /// [`Self::push`], the answer handed over as it came.
    pub(crate) fn push_raw(
        &mut self,
        n: u64,
        msg: Arc<F::Message>,
        deadline: Instant,
    ) -> oneshot::Receiver<RawOutcome> {
        let (done, receiver) = oneshot::channel();
        self.add(n, msg, deadline, Done::Raw(done));
        receiver
    }

    fn add(&mut self, n: u64, msg: Arc<F::Message>, deadline: Instant, done: Done) {
        if self.ring.is_empty() {
            self.base = n;
        }
        debug_assert_eq!(n, self.base + self.ring.len() as u64, "numbers in order");
        self.ring.push_back(Some(Entry {
            msg,
            deadline,
            done,
        }));
        self.count += 1;
    }

    /// How many are outstanding.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Resolves publish number `n` (if outstanding) with its answer: the status of its header
    /// block, if any, and its payload.
    pub(crate) fn resolve(&mut self, n: u64, status: Option<u16>, payload: &bytes::Bytes) {
        let Some(index) = n.checked_sub(self.base) else {
            return;
        };
        let Some(slot) = usize::try_from(index)
            .ok()
            .and_then(|i| self.ring.get_mut(i))
        else {
            return;
        };
        if let Some(entry) = slot.take() {
            self.count -= 1;
            entry.done.answer(
                F::subject(&entry.msg),
                status,
                payload,
                self.stream.as_deref(),
                self.domain.as_deref(),
            );
        }
        self.trim();
    }

    /// Resolves every outstanding publish to `subject` with `error()`.
    pub(crate) fn resolve_subject(&mut self, subject: &str, error: impl Fn() -> WireError) {
        for slot in &mut self.ring {
            if slot.as_ref().is_some_and(|e| F::subject(&e.msg) == subject)
                && let Some(entry) = slot.take()
            {
                self.count -= 1;
                entry.done.fail(error());
            }
        }
        self.trim();
    }

    /// Resolves those whose deadline passed by `now` as unknown. Deadlines grow with the
    /// number, so the sweep stops at the first that has time left.
    pub(crate) fn expire(&mut self, now: Instant, error: impl Fn() -> WireError) {
        while let Some(front) = self.ring.front() {
            match front {
                Some(entry) if entry.deadline > now => break,
                _ => {}
            }
            if let Some(Some(entry)) = self.ring.pop_front() {
                self.count -= 1;
                entry.done.fail(error());
            }
            self.base += 1;
        }
    }

    /// Resolves everything with `error()` (the connection is gone).
    pub(crate) fn drain(&mut self, error: impl Fn() -> WireError) {
        for entry in self.ring.drain(..).flatten() {
            entry.done.fail(error());
        }
        self.count = 0;
    }

    #[inline]
    fn trim(&mut self) {
        while matches!(self.ring.front(), Some(None)) {
            self.ring.pop_front();
            self.base += 1;
        }
    }
}

#[cfg(test)]
mod tests;
