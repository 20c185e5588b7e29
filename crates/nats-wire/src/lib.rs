//! A JetStream publishing connection of its own, written for the relay's hot path: `HPUB`
//! frames whose shared header lines (a transaction's) are serialised once per run, one `SUB`
//! for every PubAck, PubAcks matched by publish number and read without serde in the common
//! case, and one deadline sweep instead of a timer per message. It carries every publish mode:
//! messages answered by a PubAck, atomic batches (members without a reply, a commit with one,
//! its answer handed over as it came) and fast batches (answers on a second subscription made
//! with `CONNECT`, so none can come before it is there).
//!
//! Bytes and headers in (any message type, read through [`Framing`]), a stored sequence
//! ([`Stored`]) or a typed refusal ([`WireError`]) out. It knows nothing of the relay; the
//! relay adapts it to its `Publisher` (crate `relay-nats`).
//!
//! - [`proto`]: framing and parsing, no IO (property-tested against arbitrary bytes).
//! - `connect`: servers, credentials ([`Credentials`], resolved by the caller) and TLS; the
//!   handshake.
//! - `connection::session`: the connection's life (reader, writer, reconnects).
//! - `pending`: the outstanding publishes and PubAck parsing.
//!
//! The small functions of the per-message path are `#[inline]`: the connection is generic over
//! the caller's [`Framing`], so its hot loop is compiled in the caller's crate, where functions
//! of this crate are not inlined without it (callgrind, relay-nats' `examples/publish_cost`).

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

mod connect;
mod connection;
mod error;
mod headers;
mod message;
mod pending;
mod proto;

pub use connect::{ConnectOptions, Credentials, ServerErrorObserver, ServerUrl};
pub use connection::{BatchReplies, Connection, framed_header_lines};
pub use error::{ApiError, WireError, WireErrorKind};
pub use message::{Framing, Header, Plain, PlainMessage, own_lines, same_values, shared_lines};
pub use pending::{
    Outcome, RawOutcome, Stored, ack_domain_matches, parse_pub_ack, parse_pub_ack_from,
    parse_pub_ack_in,
};
pub use proto::fast_batch_reply_suffix_len;

/// The `-ERR` texts after which nats-server closes the connection because of what the client
/// sent (lower case; the server's capitalization varies between them): `maximum control line
/// exceeded` (server/parser.go), `Maximum Payload Violation` (server/client.go), `Unknown
/// Protocol Operation` (a parse error).
const CLOSING_PROTOCOL_ERRORS: [&str; 3] = [
    "maximum control line exceeded",
    "maximum payload violation",
    "unknown protocol operation",
];

/// Whether the server closes the connection after `-ERR '<text>'` because of what the client
/// sent (sent again, the same message is closed on again).
pub fn is_closing_protocol_error(text: &str) -> bool {
    let lower = text.to_lowercase();
    CLOSING_PROTOCOL_ERRORS.iter().any(|e| lower.contains(e))
}

#[cfg(test)]
mod parser_props;
#[cfg(test)]
mod pub_ack_props;
#[cfg(test)]
mod tests;
