//! The lean path's header blocks: a transaction's shared lines serialised once.

use std::sync::Arc;

use bytes::BytesMut;
use relay_core::message::OutboundMessage;

use super::proto;
use crate::header_entries::{own_entries, same_values, shared_entries, split};

/// The lean path's header block start for the current transaction: the version line and the
/// [`shared_entries`] lines, serialised once and copied into each `HPUB`.
#[derive(Default)]
pub(crate) struct WireHeaders {
    values: Vec<Arc<str>>,
    stream: Option<Arc<str>>,
    head: BytesMut,
}

impl WireHeaders {
    /// Appends the `HPUB` of `msg` (into `stream`, replying to `reply`) to `out`.
    pub(crate) fn write_hpub(
        &mut self,
        out: &mut BytesMut,
        stream: &str,
        msg: &OutboundMessage,
        reply: (&str, u64),
    ) {
        let (shared, own) = split(msg);
        if !self.matches(stream, shared) {
            self.values = shared.iter().map(|(_, v)| v.clone()).collect();
            self.stream = Some(stream.into());
            self.head.clear();
            self.head.extend_from_slice(proto::HEADER_VERSION_LINE);
            for (name, value) in shared_entries(stream, shared) {
                proto::put_header_line(&mut self.head, name, value);
            }
        }
        let repeats = own_entries(msg, own).enumerate().any(|(i, (name, _))| {
            shared_entries(stream, shared).any(|(n, _)| n == name)
                || own_entries(msg, own).take(i).any(|(n, _)| n == name)
        });
        if repeats {
            // A name set twice: the later value replaces the earlier, as in a HeaderMap.
            let mut lines: Vec<(&str, &str)> = Vec::new();
            for (name, value) in shared_entries(stream, shared).chain(own_entries(msg, own)) {
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
                &msg.subject,
                reply,
                proto::HEADER_VERSION_LINE,
                len,
                write,
                &msg.payload,
            );
            return;
        }
        let len = own_entries(msg, own)
            .map(|(n, v)| proto::header_line_len(n, v))
            .sum();
        let write = |out: &mut BytesMut| {
            for (name, value) in own_entries(msg, own) {
                proto::put_header_line(out, name, value);
            }
        };
        proto::write_hpub(
            out,
            &msg.subject,
            reply,
            &self.head,
            len,
            write,
            &msg.payload,
        );
    }

    fn matches(&self, stream: &str, shared: &[(Arc<str>, Arc<str>)]) -> bool {
        self.stream.as_deref() == Some(stream) && same_values(&self.values, shared)
    }
}
