//! Decode errors: [`DecodeError`] carries the byte offset and a [`DecodeErrorKind`].

/// A pgoutput message could not be decoded.
///
/// `offset` is the byte offset into the message (0 = the tag byte) where the
/// failing field starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pgoutput decode error at byte {offset}: {kind}")]
pub struct DecodeError {
    /// Byte offset in the message where decoding failed.
    pub offset: usize,
    /// What went wrong.
    pub kind: DecodeErrorKind,
}

impl DecodeError {
    pub(crate) const fn new(offset: usize, kind: DecodeErrorKind) -> Self {
        DecodeError { offset, kind }
    }
}

/// The reason a message failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The message has no bytes at all.
    #[error("empty message")]
    Empty,
    /// The message ends in the middle of a field.
    #[error("unexpected end of message: needed {needed} bytes, {remaining} remaining")]
    UnexpectedEnd {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the message.
        remaining: usize,
    },
    /// The first byte is not a proto_version 1 message tag.
    #[error("unknown message tag {0:#04x}")]
    UnknownMessageTag(u8),
    /// A TupleData column kind other than `n`, `u`, `t`, `b`.
    #[error("unknown tuple value kind {0:#04x}")]
    UnknownTupleKind(u8),
    /// A tuple marker that is not valid at this point: Update accepts
    /// `K`/`O`/`N`, Delete `K`/`O`, Insert (and Update's new tuple) only `N`.
    #[error("unknown or unexpected tuple marker {0:#04x}")]
    UnknownOldTupleKind(u8),
    /// A C string has no terminating NUL before the end of the message.
    #[error("string without NUL terminator")]
    MissingNulTerminator,
    /// A name (relation, namespace, column, type, origin, message prefix) is not UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// A length or count field is negative.
    #[error("negative length {0}")]
    NegativeLength(i32),
    /// A count announces more entries than the remaining bytes could hold.
    #[error("count {count} exceeds what {remaining} remaining bytes can hold")]
    CountExceedsInput {
        /// The announced count.
        count: usize,
        /// Bytes left in the message after the count field.
        remaining: usize,
    },
    /// Bytes remain after a complete message.
    #[error("{0} trailing bytes after a complete message")]
    TrailingBytes(usize),
}
