//! IO-free, panic-free decoder for PostgreSQL's `pgoutput` logical
//! replication protocol, `proto_version` 1 (PostgreSQL 15–18, with
//! `messages 'true'`).
//!
//! # Format
//! Each XLogData frame of a logical replication stream carries one message:
//! a tag byte followed by big-endian fields. Strings are NUL-terminated
//! (UTF-8 under `client_encoding` UTF8), LSNs and timestamps are Int64.
//!
//! | tag | message | fields after the tag |
//! |-----|---------|----------------------|
//! | `B` | [`Begin`] | final LSN, commit time, xid |
//! | `C` | [`Commit`] | flags, commit LSN, end LSN, commit time |
//! | `O` | [`Origin`] | commit LSN, name |
//! | `R` | [`Relation`] | oid, namespace, name, replica identity, Int16 n, n × (flags, name, type oid, typmod) |
//! | `Y` | [`TypeInfo`] | oid, namespace, name |
//! | `I` | [`Insert`] | oid, `N`, TupleData |
//! | `U` | [`Update`] | oid, optional (`K`\|`O`, TupleData), `N`, TupleData |
//! | `D` | [`Delete`] | oid, `K`\|`O`, TupleData |
//! | `T` | [`Truncate`] | Int32 n, options, n × oid |
//! | `M` | [`Message`] | flags, LSN, prefix, Int32 length, content |
//!
//! TupleData is an Int16 column count, then per column a kind byte: `n`
//! (null), `u` (unchanged TOAST), or `t`/`b` (text/binary) followed by an
//! Int32 length and the bytes. Streaming and two-phase messages
//! (proto_version 2+) are rejected as unknown tags.
//!
//! # Safety rules
//! * [`decode`] never panics: every read goes through a bounds-checked
//!   cursor and failures are returned as [`DecodeError`] with the byte
//!   offset of the failing field.
//! * No allocation is sized from an unchecked count: a count must fit in
//!   the remaining bytes at its minimal entry size first
//!   ([`DecodeErrorKind::CountExceedsInput`]).
//! * Column values and message payloads are zero-copy [`bytes::Bytes`]
//!   slices of the input; only names are copied into `String`s.
//! * Decoding is strict: a message must use the whole buffer.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

mod cursor;
mod decode;
mod error;
mod lsn;
mod message;

pub use decode::decode;
pub use error::{DecodeError, DecodeErrorKind};
pub use lsn::{Lsn, ParseLsnError};
pub use message::{
    Begin, Column, Commit, Delete, Insert, LogicalMessage, Message, Oid, OldTuple, Origin,
    PG_EPOCH_UNIX_MICROS, Relation, Truncate, TupleData, TupleValue, TypeInfo, Update,
    pg_time_to_unix_micros,
};
