//! The lean path's header blocks: a transaction's shared lines serialised once.

use std::sync::Arc;

use bytes::BytesMut;

use outbox_contract::HEADER_MSG_ID;

use crate::error::{WireError, WireErrorKind};
use crate::message::{Framing, Header, own_lines, same_values, shared_lines};
use crate::proto;

/// The lean path's header block start for the current transaction: the version line and the
/// [`shared_lines`], serialised once and copied into each `HPUB`.
#[derive(Default)]
pub(crate) struct WireHeaders {
    values: Vec<Arc<str>>,
    stream: Option<Arc<str>>,
    head: BytesMut,
    /// The own header names of the last message (by pointer: a route's names are shared
    /// `Arc`s) and whether any of them repeats a name: the same for every row of a table, so
    /// the name comparisons run once per transaction, not per message.
    own_names: Vec<Arc<str>>,
    repeats: bool,
}

impl WireHeaders {
    /// Appends the `HPUB` of `msg` (into `stream`, replying to `reply`) to `out`.
    pub(crate) fn write_hpub<F: Framing>(
        &mut self,
        out: &mut BytesMut,
        stream: &str,
        msg: &F::Message,
        reply: proto::ReplyTo<'_>,
    ) -> Result<(), WireError> {
        self.write_hpub_with::<F>(out, stream, msg, reply, &[])
    }

    /// [`Self::write_hpub`] with `extra` lines after the message's own (an atomic batch's
    /// `Nats-Batch-*` lines; the route refuses `Nats-*` names in a message's own headers, so
    /// they never repeat one).
    // Long: the per-message header writer on the publish hot path: the cached header block is
    // reused or rewritten in one pass
    /// A header name or value holding CR, LF or NUL is refused ([`WireErrorKind::Unsendable`]),
    /// nothing written: it would end the line, or the frame, early. Shared lines are checked
    /// once per run of messages, names once per set of names, values every time.
    pub(crate) fn write_hpub_with<F: Framing>(
        &mut self,
        out: &mut BytesMut,
        stream: &str,
        msg: &F::Message,
        reply: proto::ReplyTo<'_>,
        extra: &[(&str, &str)],
    ) -> Result<(), WireError> {
        let (shared, own) = (F::shared_headers(msg), F::own_headers(msg));
        let msg_id = F::msg_id(msg);
        let mut names_known = same_names(&self.own_names, own);
        if !self.matches(stream, shared) {
            if let Some((name, _)) = shared_lines(stream, shared)
                .find(|(name, value)| !line_safe(name) || !line_safe(value))
            {
                self.stream = None;
                return Err(unsendable(name));
            }
            self.values = shared.iter().map(|(_, v)| v.clone()).collect();
            self.stream = Some(stream.into());
            self.head.clear();
            self.head.extend_from_slice(proto::HEADER_VERSION_LINE);
            for (name, value) in shared_lines(stream, shared) {
                proto::put_header_line(&mut self.head, name, value);
            }
            // Shared names may have changed (another table): compare again.
            names_known = false;
        }
        if !names_known {
            if let Some((name, _)) = own.iter().find(|(name, _)| !line_safe(name)) {
                self.own_names.clear();
                return Err(unsendable(name));
            }
            self.repeats = own_lines(msg_id, own).enumerate().any(|(i, (name, _))| {
                shared_lines(stream, shared).any(|(n, _)| n == name)
                    || own_lines(msg_id, own).take(i).any(|(n, _)| n == name)
            });
            self.own_names = own.iter().map(|(name, _)| name.clone()).collect();
        }
        if self.repeats {
            // Rare: checked on their own here; the common path below checks as it measures.
            let own_values = std::iter::once((HEADER_MSG_ID, msg_id))
                .chain(own.iter().map(|(name, value)| (&**name, &**value)))
                .chain(extra.iter().copied());
            for (name, value) in own_values {
                if !line_safe(value) {
                    return Err(unsendable(name));
                }
            }
            // A name set twice: the later value replaces the earlier, as in a HeaderMap.
            let mut lines: Vec<(&str, &str)> = Vec::new();
            let extra = extra.iter().copied();
            for (name, value) in shared_lines(stream, shared)
                .chain(own_lines(msg_id, own))
                .chain(extra)
            {
                match lines.iter_mut().find(|(n, _)| *n == name) {
                    Some(line) => line.1 = value,
                    None => lines.push((name, value)),
                }
            }
            let len = lines
                .iter()
                .map(|(n, v)| proto::header_line_len(n, v))
                .sum();
            let write = |out: &mut BytesMut| {
                for (name, value) in &lines {
                    proto::put_header_line(out, name, value);
                }
            };
            proto::write_hpub(
                out,
                F::subject(msg),
                reply,
                proto::HEADER_VERSION_LINE,
                len,
                write,
                F::payload(msg),
            );
            return Ok(());
        }
        // Two loops, not a chain: `Chain` tests which half it is in at every line, and this is
        // on the path of every event (callgrind, examples/publish_cost in relay-nats).
        // The values are checked as they are measured: a word-at-a-time test for a byte below
        // 0x20 over each, and the exact search only when one has one.
        let mut len = 0;
        let mut control = false;
        for (name, value) in own_lines(msg_id, own) {
            len += proto::header_line_len(name, value);
            control |= has_control(value.as_bytes());
        }
        for &(name, value) in extra {
            len += proto::header_line_len(name, value);
            control |= has_control(value.as_bytes());
        }
        if control
            && let Some((name, _)) = own_lines(msg_id, own)
                .chain(extra.iter().copied())
                .find(|(_, value)| !line_safe(value))
        {
            return Err(unsendable(name));
        }
        let write = |out: &mut BytesMut| {
            for (name, value) in own_lines(msg_id, own) {
                proto::put_header_line(out, name, value);
            }
            for &(name, value) in extra {
                proto::put_header_line(out, name, value);
            }
        };
        proto::write_hpub(
            out,
            F::subject(msg),
            reply,
            &self.head,
            len,
            write,
            F::payload(msg),
        );
        Ok(())
    }

    #[inline]
    fn matches(&self, stream: &str, shared: &[Header]) -> bool {
        self.stream.as_deref() == Some(stream) && same_values(&self.values, shared)
    }
}

/// Whether `text` can be a header name or value on the wire: no CR, LF or NUL.
#[inline]
pub(crate) fn line_safe(text: &str) -> bool {
    let bytes = text.as_bytes();
    !has_control(bytes) || !bytes.iter().any(|&b| matches!(b, b'\r' | b'\n' | 0))
}

/// Whether `bytes` holds a byte below 0x20. On the path of every event, for short strings:
/// eight bytes at a time, where a byte below 0x20 sets its high bit in `(w - 0x20..) & !w`
/// (bytes of 0x80 and up never do), with no call.
#[inline]
fn has_control(bytes: &[u8]) -> bool {
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    const SPACE: u64 = u64::from_ne_bytes([0x20; 8]);
    let mut chunks = bytes.chunks_exact(8);
    let mut found = 0;
    for chunk in chunks.by_ref() {
        let w = u64::from_ne_bytes(chunk.try_into().unwrap_or([0x20; 8]));
        found |= w.wrapping_sub(SPACE) & !w;
    }
    found & HIGH != 0 || chunks.remainder().iter().any(|&b| b < 0x20)
}

/// The refusal of a message whose header `name` cannot be framed.
#[cold]
fn unsendable(name: &str) -> WireError {
    WireError::new(
        WireErrorKind::Unsendable {
            header: name.escape_debug().to_string(),
        },
        format!(
            "header `{}` holds a line break or NUL, which a NATS header cannot carry",
            name.escape_debug()
        ),
    )
}

/// Whether `names` are, by pointer, the names of `own`.
#[inline]
fn same_names(names: &[Arc<str>], own: &[Header]) -> bool {
    names.len() == own.len()
        && names
            .iter()
            .zip(own)
            .all(|(name, (next, _))| Arc::ptr_eq(name, next))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{Plain, PlainMessage};

    fn header(name: &Arc<str>, value: &str) -> (Arc<str>, Arc<str>) {
        (name.clone(), value.into())
    }

    /// One `WireHeaders` framing messages in turn (as the lean connection does) writes what a
    /// fresh one writes for each: the cached shared lines and the cached name check follow a
    /// change of transaction, of table and of own header names, including a repeated name.
    #[test]
    fn reused_framing_writes_what_fresh_framing_writes() {
        let [lsn, table, kind, tx_index, aggregate]: [Arc<str>; 5] = [
            "Outbox-Commit-Lsn".into(),
            "Outbox-Table".into(),
            "Outbox-Type".into(),
            "Outbox-Tx-Index".into(),
            "Outbox-Aggregate".into(),
        ];
        let tx1 = [header(&lsn, "0/1"), header(&table, "public.a")];
        let tx2 = [header(&lsn, "0/2"), header(&table, "public.a")];
        let message =
            |shared: &[(Arc<str>, Arc<str>)], own: Vec<(Arc<str>, Arc<str>)>, id: &str| {
                let mut msg = PlainMessage::new("outbox.a", id, Bytes::from_static(b"{}"));
                msg.headers = shared.iter().cloned().chain(own).collect();
                msg.shared = shared.len();
                msg
            };
        let messages = [
            message(&tx1, vec![header(&tx_index, "0"), header(&kind, "A")], "e1"),
            message(&tx1, vec![header(&tx_index, "1"), header(&kind, "B")], "e2"),
            // Shared lines that now hold one of the same own names: checked again.
            message(
                &[header(&lsn, "0/3"), header(&kind, "S")],
                vec![header(&tx_index, "0"), header(&kind, "B")],
                "e2b",
            ),
            // Another mapping: its own `Outbox-Table` replaces the shared one.
            message(
                &tx1,
                vec![header(&tx_index, "2"), header(&table, "x")],
                "e3",
            ),
            message(
                &tx1,
                vec![header(&tx_index, "3"), header(&aggregate, "7")],
                "e4",
            ),
            message(
                &tx2,
                vec![header(&tx_index, "0"), header(&table, "y")],
                "e5",
            ),
            message(&tx2, vec![header(&tx_index, "1"), header(&kind, "C")], "e6"),
            // The same names in new `Arc`s: compared by text, not only by pointer.
            message(
                &tx2,
                vec![header(&tx_index, "2"), ("Outbox-Table".into(), "z".into())],
                "e7",
            ),
        ];
        let mut reused = WireHeaders::default();
        for msg in &messages {
            let (mut again, mut fresh) = (BytesMut::new(), BytesMut::new());
            reused
                .write_hpub::<Plain>(
                    &mut again,
                    "OUTBOX",
                    msg,
                    proto::ReplyTo::Numbered("_INBOX.t", 1),
                )
                .expect("framed");
            WireHeaders::default()
                .write_hpub::<Plain>(
                    &mut fresh,
                    "OUTBOX",
                    msg,
                    proto::ReplyTo::Numbered("_INBOX.t", 1),
                )
                .expect("framed");
            assert_eq!(again, fresh, "message {}", msg.msg_id);
        }
        // The repeated name was written once, with the later value.
        let mut out = BytesMut::new();
        WireHeaders::default()
            .write_hpub::<Plain>(
                &mut out,
                "OUTBOX",
                &messages[3],
                proto::ReplyTo::Numbered("_INBOX.t", 1),
            )
            .expect("framed");
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("Outbox-Table:").count(), 1, "{text}");
        assert!(text.contains("Outbox-Table: x\r\n"), "{text}");
    }
}
