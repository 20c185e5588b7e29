//! The NATS client protocol as far as the lean publish path speaks it: frames written into a
//! buffer and server operations parsed out of one. No IO here.
//!
//! Client → server: `CONNECT`, `PING`, `PONG`, `SUB`, `HPUB`. Server → client: `INFO`, `MSG`,
//! `HMSG`, `PING`, `PONG`, `+OK`, `-ERR` (<https://docs.nats.io/reference/reference-protocols/nats-protocol>).

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// `NATS/1.0\r\n`: the first line of every header block.
pub(crate) const HEADER_VERSION_LINE: &[u8] = b"NATS/1.0\r\n";

/// The server's `INFO`, the fields the lean connection uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ServerInfo {
    #[serde(default)]
    pub(crate) version: String,
    #[serde(default)]
    pub(crate) max_payload: usize,
    #[serde(default)]
    pub(crate) headers: bool,
    #[serde(default)]
    pub(crate) tls_required: bool,
    #[serde(default)]
    pub(crate) nonce: Option<String>,
    /// Other servers of the cluster a client may fail over to (`host:port`).
    #[serde(default)]
    pub(crate) connect_urls: Vec<String>,
}

/// The client's `CONNECT`.
#[derive(Debug, Serialize)]
pub(crate) struct ConnectInfo<'a> {
    pub(crate) verbose: bool,
    pub(crate) pedantic: bool,
    pub(crate) tls_required: bool,
    pub(crate) name: &'a str,
    pub(crate) lang: &'a str,
    pub(crate) version: &'a str,
    pub(crate) protocol: u8,
    pub(crate) echo: bool,
    pub(crate) headers: bool,
    pub(crate) no_responders: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pass: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) auth_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) jwt: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) nkey: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sig: Option<&'a str>,
}

/// One operation the server sent.
#[derive(Debug, PartialEq)]
pub(crate) enum ServerOp {
    Info(Box<ServerInfoText>),
    /// `MSG` or `HMSG` (the header block, if any, separate from the payload).
    Msg {
        subject: Bytes,
        headers: Option<Bytes>,
        payload: Bytes,
    },
    Ping,
    Pong,
    Ok,
    /// `-ERR '<text>'`, the quotes removed.
    Err(String),
}

/// An `INFO`'s JSON, parsed when used (so [`ServerOp`] stays comparable in tests).
#[derive(Debug, PartialEq)]
pub(crate) struct ServerInfoText(pub(crate) String);

impl ServerInfoText {
    pub(crate) fn parse(&self) -> Result<ServerInfo, ProtocolError> {
        serde_json::from_str(&self.0).map_err(|e| ProtocolError(format!("bad INFO: {e}")))
    }
}

/// The server sent something this client cannot parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("NATS protocol error: {0}")]
pub(crate) struct ProtocolError(pub(crate) String);

/// The longest control line accepted from the server before it counts as garbage (an `INFO`
/// with many `connect_urls` is the longest).
pub(crate) const MAX_SERVER_LINE: usize = 1 << 20;

/// The most bytes (headers and payload) one `MSG`/`HMSG` can carry before the server said its
/// `max_payload`: nats-server's `max_payload` is an int32. A larger length is garbage, not a
/// message to wait for (the buffer would grow without end).
pub(crate) const MAX_SERVER_MESSAGE: usize = i32::MAX as usize;

/// Room for the headers the server adds to a message it delivers (a status line, a
/// description): [`message_limit`] allows this much over `max_payload`.
const SERVER_HEADER_ROOM: usize = 4096;

/// The largest `MSG`/`HMSG` to wait for from a server that announced `max_payload` (0: not
/// yet). The server refuses any publish over `max_payload` (headers and payload together), so
/// nothing it delivers on the relay's reply subjects is larger, save for the headers it adds
/// itself; a length over that is refused at once instead of buffered.
pub(crate) fn message_limit(max_payload: usize) -> usize {
    match max_payload {
        0 => MAX_SERVER_MESSAGE,
        n => n.saturating_add(SERVER_HEADER_ROOM).min(MAX_SERVER_MESSAGE),
    }
}

/// Takes one complete operation off the front of `buf`; `None` while it is incomplete (read
/// more and call again). A message longer than `limit` bytes (see [`message_limit`]) is an error.
// Long: one `match` over the server's protocol operations, each a few lines
pub(crate) fn parse_op(
    buf: &mut BytesMut,
    limit: usize,
) -> Result<Option<ServerOp>, ProtocolError> {
    let Some(end) = find_crlf(buf) else {
        if buf.len() > MAX_SERVER_LINE {
            return Err(ProtocolError("control line too long".into()));
        }
        return Ok(None);
    };
    let line = &buf[..end];
    let (op, args) = match line.iter().position(|b| *b == b' ' || *b == b'\t') {
        Some(i) => (&line[..i], trim(&line[i + 1..])),
        None => (line, &[][..]),
    };
    let is = |name: &[u8]| op.eq_ignore_ascii_case(name);
    let bare = |op: ServerOp| {
        if args.is_empty() {
            Ok(Some(op))
        } else {
            Err(ProtocolError(format!(
                "unexpected arguments after {}",
                String::from_utf8_lossy(&line[..line.len().min(64)])
            )))
        }
    };
    let simple = if is(b"PING") {
        bare(ServerOp::Ping)?
    } else if is(b"PONG") {
        bare(ServerOp::Pong)?
    } else if is(b"+OK") {
        bare(ServerOp::Ok)?
    } else if is(b"-ERR") {
        let text = String::from_utf8_lossy(args);
        Some(ServerOp::Err(text.trim().trim_matches('\'').to_owned()))
    } else if is(b"INFO") {
        Some(ServerOp::Info(Box::new(ServerInfoText(
            String::from_utf8_lossy(args).into_owned(),
        ))))
    } else if is(b"MSG") || is(b"HMSG") {
        None
    } else {
        return Err(ProtocolError(format!(
            "unexpected operation `{}`",
            String::from_utf8_lossy(&line[..line.len().min(64)])
        )));
    };
    if let Some(op) = simple {
        buf.advance(end + 2);
        return Ok(Some(op));
    }
    // MSG <subject> <sid> [reply-to] <#bytes>
    // HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>
    let with_headers = is(b"HMSG");
    // Up to five fields, without allocating (this runs once per PubAck).
    let mut fields: [&[u8]; 5] = [&[]; 5];
    let mut count = 0;
    for field in args
        .split(|b| *b == b' ' || *b == b'\t')
        .filter(|f| !f.is_empty())
    {
        if count == fields.len() {
            count += 1;
            break;
        }
        fields[count] = field;
        count += 1;
    }
    let (subject, header_len, total_len) = match (
        with_headers,
        // More than five fields: none of the shapes below.
        fields.get(..count).unwrap_or_default(),
    ) {
        (false, [subject, _sid, total] | [subject, _sid, _, total]) => {
            (*subject, 0, number(total, limit)?)
        }
        (true, [subject, _sid, header, total] | [subject, _sid, _, header, total]) => {
            (*subject, number(header, limit)?, number(total, limit)?)
        }
        _ => {
            return Err(ProtocolError(format!(
                "malformed {}",
                String::from_utf8_lossy(&line[..line.len().min(200)])
            )));
        }
    };
    if header_len > total_len {
        return Err(ProtocolError("header length over total length".into()));
    }
    // `number` bounds both lengths by `limit` (at most MAX_SERVER_MESSAGE), so this cannot wrap.
    let frame_len = end + 2 + total_len + 2;
    if buf.len() < frame_len {
        return Ok(None);
    }
    // The lengths must land exactly on the frame's end: a payload of another length than the
    // line says would otherwise be taken short (or long) and the rest read as the next frame.
    if &buf[frame_len - 2..frame_len] != b"\r\n" {
        return Err(ProtocolError(format!(
            "no CRLF after the {total_len} bytes that {} announces",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        )));
    }
    if with_headers && !is_header_block(&buf[end + 2..end + 2 + header_len]) {
        return Err(ProtocolError(format!(
            "the {header_len} header bytes of {} are not a NATS/1.0 header block",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        )));
    }
    // The subject as a slice of the frame's bytes: no copy.
    let subject_at = subject.as_ptr() as usize - line.as_ptr() as usize;
    let subject_range = subject_at..subject_at + subject.len();
    let mut frame = buf.split_to(frame_len).freeze();
    let subject = frame.slice(subject_range);
    frame.advance(end + 2);
    frame.truncate(total_len);
    let payload = frame.split_off(header_len);
    let headers = with_headers.then_some(frame);
    Ok(Some(ServerOp::Msg {
        subject,
        headers,
        payload,
    }))
}

/// Where the first `\r\n` starts.
fn find_crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = buf[from..].iter().position(|b| *b == b'\n') {
        let at = from + at;
        if at > 0 && buf[at - 1] == b'\r' {
            return Some(at - 1);
        }
        from = at + 1;
    }
    None
}

/// `NATS/1.0`, optionally a status, then header lines, then the blank line.
fn is_header_block(block: &[u8]) -> bool {
    let Some(after_version) = block.strip_prefix(&HEADER_VERSION_LINE[..8]) else {
        return false;
    };
    (after_version.starts_with(b"\r\n") || after_version.starts_with(b" "))
        && block.len() >= HEADER_VERSION_LINE.len() + 2
        && block.ends_with(b"\r\n\r\n")
}

/// Without the spaces and tabs (the protocol's field separators) at either end.
fn trim(bytes: &[u8]) -> &[u8] {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let start = bytes.iter().position(|b| !blank(b)).unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

/// A length field: decimal digits only (`usize::from_str` would also take a `+`), at most
/// `limit` (itself at most [`MAX_SERVER_MESSAGE`]).
fn number(field: &[u8], limit: usize) -> Result<usize, ProtocolError> {
    let bad = |why: &str| {
        ProtocolError(format!(
            "bad length `{}`{why}",
            String::from_utf8_lossy(&field[..field.len().min(32)])
        ))
    };
    if field.is_empty() || !field.iter().all(u8::is_ascii_digit) {
        return Err(bad(""));
    }
    // Digits only, so a failed parse means more than a u64 holds.
    let n = std::str::from_utf8(field)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    usize::try_from(n)
        .ok()
        .filter(|n| *n <= limit.min(MAX_SERVER_MESSAGE))
        .ok_or_else(|| {
            bad(&format!(
                " (over {limit}, the largest message the server's max_payload allows)"
            ))
        })
}

/// The status code of a header block's first line (`NATS/1.0 503` → 503), if it has one.
#[inline]
pub(crate) fn status_code(headers: &[u8]) -> Option<u16> {
    let first = headers.split(|b| *b == b'\r').next()?;
    let rest = first.strip_prefix(b"NATS/1.0")?;
    let code = trim(rest).split(|b| *b == b' ').next()?;
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// `CONNECT {json}\r\n`.
pub(crate) fn write_connect(out: &mut BytesMut, info: &ConnectInfo<'_>) {
    out.put_slice(b"CONNECT ");
    // Serialising a struct of strings and bools into a Vec cannot fail.
    let json = serde_json::to_vec(info).unwrap_or_default();
    out.put_slice(&json);
    out.put_slice(b"\r\n");
}

/// `SUB <subject> <sid>\r\n`.
pub(crate) fn write_sub(out: &mut BytesMut, subject: &str, sid: u64) {
    out.put_slice(b"SUB ");
    out.put_slice(subject.as_bytes());
    out.put_u8(b' ');
    put_decimal(out, sid);
    out.put_slice(b"\r\n");
}

/// The length of the reply token for publish number `n`: always 16 hex digits, so the reply
/// subject's length (which counts toward the server's `max_control_line`) is fixed.
pub(crate) const REPLY_TOKEN_LEN: usize = 16;

/// The reply token of publish number `n`.
#[inline]
pub(crate) fn put_reply_token(out: &mut BytesMut, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..REPLY_TOKEN_LEN).rev() {
        out.put_u8(HEX[((n >> (shift * 4)) & 0xf) as usize]);
    }
}

/// Publish number `n` back from a reply token; `None` for anything else.
#[inline]
pub(crate) fn parse_reply_token(token: &[u8]) -> Option<u64> {
    if token.len() != REPLY_TOKEN_LEN {
        return None;
    }
    token.iter().try_fold(0u64, |n, b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some((n << 4) | u64::from(digit))
    })
}

/// The bytes of one header line `<name>: <value>\r\n`.
#[inline]
pub(crate) fn header_line_len(name: &str, value: &str) -> usize {
    name.len() + 2 + value.len() + 2
}

/// Appends `<name>: <value>\r\n`.
#[inline]
pub(crate) fn put_header_line(out: &mut BytesMut, name: &str, value: &str) {
    out.put_slice(name.as_bytes());
    out.put_slice(b": ");
    out.put_slice(value.as_bytes());
    out.put_slice(b"\r\n");
}

/// What a fast batch's reply subject adds to the batch's inbox, at most, with `flow` messages
/// between flow acks: `.<flow>.fail.<20-digit batch sequence>.<operation>.$FI`.
pub fn fast_batch_reply_suffix_len(flow: usize) -> usize {
    1 + flow.to_string().len() + ".fail.".len() + 20 + ".0.$FI".len()
}

/// The reply subject of a frame.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReplyTo<'a> {
    /// Publish number `n`: `<prefix>.<16 hex digits of n>`, its PubAck matched by the number.
    Numbered(&'a str, u64),
    /// A subject of the caller's: a fast batch's, whose answers the batch's own subscription
    /// reads (`publisher::fast_batch`).
    Subject(&'a str),
    /// No reply: an atomic batch's message before its commit, which the server does not answer.
    None,
}

impl ReplyTo<'_> {
    #[inline]
    fn len(self) -> usize {
        match self {
            Self::Numbered(prefix, _) => prefix.len() + 1 + REPLY_TOKEN_LEN,
            Self::Subject(subject) => subject.len(),
            Self::None => 0,
        }
    }

    /// Writes ` <reply>` (nothing for [`Self::None`]).
    #[inline]
    fn put(self, out: &mut BytesMut) {
        match self {
            Self::Numbered(prefix, n) => {
                out.put_u8(b' ');
                out.put_slice(prefix.as_bytes());
                out.put_u8(b'.');
                put_reply_token(out, n);
            }
            Self::Subject(subject) => {
                out.put_u8(b' ');
                out.put_slice(subject.as_bytes());
            }
            Self::None => {}
        }
    }
}

/// One `HPUB`: `HPUB <subject> [<reply>] <hdr_len> <total_len>\r\n`, the header block (`head` —
/// the version line and lines prepared once — then the lines `tail` writes, `tail_len` bytes,
/// then the blank line), the payload, `\r\n`.
#[inline]
pub(crate) fn write_hpub(
    out: &mut BytesMut,
    subject: &str,
    reply: ReplyTo<'_>,
    head: &[u8],
    tail_len: usize,
    tail: impl FnOnce(&mut BytesMut),
    payload: &[u8],
) {
    let header_len = head.len() + tail_len + 2;
    let total_len = header_len + payload.len();
    out.reserve(subject.len() + reply.len() + 64 + total_len);
    out.put_slice(b"HPUB ");
    out.put_slice(subject.as_bytes());
    reply.put(out);
    out.put_u8(b' ');
    put_decimal(out, header_len as u64);
    out.put_u8(b' ');
    put_decimal(out, total_len as u64);
    out.put_slice(b"\r\n");
    out.put_slice(head);
    let before = out.len();
    tail(out);
    debug_assert_eq!(out.len() - before, tail_len, "tail_len is what tail writes");
    out.put_slice(b"\r\n");
    out.put_slice(payload);
    out.put_slice(b"\r\n");
}

/// One `PUB` without payload or headers: `PUB <subject> <reply> 0\r\n\r\n` (a fast batch's
/// commit).
pub(crate) fn write_empty_pub(out: &mut BytesMut, subject: &str, reply: &str) {
    out.reserve(subject.len() + reply.len() + 12);
    out.put_slice(b"PUB ");
    out.put_slice(subject.as_bytes());
    out.put_u8(b' ');
    out.put_slice(reply.as_bytes());
    out.put_slice(b" 0\r\n\r\n");
}

#[inline]
fn put_decimal(out: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[i..]);
}

/// The `(name, value)` lines of a header block (after the version line): for checks of what
/// was framed.
pub(crate) fn header_block_lines(block: &[u8]) -> Option<Vec<(String, String)>> {
    let text = std::str::from_utf8(block).ok()?;
    let body = text.strip_prefix("NATS/1.0")?;
    let body = body.split_once("\r\n")?.1;
    let body = body.strip_suffix("\r\n")?;
    body.split("\r\n")
        .filter(|l| !l.is_empty())
        .map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.to_owned(), value.trim_start().to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests;
