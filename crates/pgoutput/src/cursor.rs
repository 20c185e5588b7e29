//! A bounds-checked reader over one message buffer.
//!
//! Every read checks the remaining length first and returns
//! [`DecodeErrorKind::UnexpectedEnd`] instead of panicking. Byte ranges are
//! returned as zero-copy [`Bytes::slice`]s of the input.

use bytes::Bytes;

use crate::error::{DecodeError, DecodeErrorKind};

/// Checked big-endian reader over a [`Bytes`] buffer.
#[derive(Debug)]
pub(crate) struct Cursor<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at offset 0 of `buf`.
    pub(crate) fn new(buf: &'a Bytes) -> Self {
        Cursor { buf, pos: 0 }
    }

    /// Current offset from the start of the message.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn rest(&self) -> &'a [u8] {
        let buf: &'a [u8] = self.buf;
        buf.get(self.pos..).unwrap_or_default()
    }

    /// An error of `kind` located at the current offset.
    pub(crate) fn err(&self, kind: DecodeErrorKind) -> DecodeError {
        DecodeError::new(self.pos, kind)
    }

    fn end(&self, needed: usize) -> DecodeError {
        self.err(DecodeErrorKind::UnexpectedEnd {
            needed,
            remaining: self.remaining(),
        })
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let arr = *self.rest().first_chunk::<N>().ok_or_else(|| self.end(N))?;
        self.pos += N;
        Ok(arr)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        self.array::<1>().map(|[b]| b)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_be_bytes)
    }

    pub(crate) fn i32(&mut self) -> Result<i32, DecodeError> {
        self.array().map(i32::from_be_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_be_bytes)
    }

    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        self.array().map(i64::from_be_bytes)
    }

    /// `len` raw bytes as a zero-copy slice of the input.
    pub(crate) fn bytes(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        if len > self.remaining() {
            return Err(self.end(len));
        }
        let start = self.pos;
        self.pos += len;
        Ok(self.buf.slice(start..self.pos))
    }

    /// An Int32 length (negative → [`DecodeErrorKind::NegativeLength`])
    /// followed by that many bytes.
    pub(crate) fn len_prefixed(&mut self) -> Result<Bytes, DecodeError> {
        let at = self.pos;
        let len = self.i32()?;
        let len = usize::try_from(len)
            .map_err(|_| DecodeError::new(at, DecodeErrorKind::NegativeLength(len)))?;
        self.bytes(len)
    }

    /// A NUL-terminated UTF-8 string; the NUL is consumed, not returned.
    pub(crate) fn cstr(&mut self) -> Result<String, DecodeError> {
        let rest = self.rest();
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.err(DecodeErrorKind::MissingNulTerminator))?;
        let raw = rest.get(..nul).unwrap_or_default();
        let s = std::str::from_utf8(raw).map_err(|e| {
            DecodeError::new(self.pos + e.valid_up_to(), DecodeErrorKind::InvalidUtf8)
        })?;
        self.pos += nul + 1;
        Ok(s.to_owned())
    }

    /// Checks that a count read from the input can be backed by the
    /// remaining bytes, at `min_size` bytes per entry. `at` is the offset of
    /// the count field. Call before allocating `count` entries.
    pub(crate) fn check_count(
        &self,
        at: usize,
        count: usize,
        min_size: usize,
    ) -> Result<(), DecodeError> {
        let remaining = self.remaining();
        if count.saturating_mul(min_size) > remaining {
            return Err(DecodeError::new(
                at,
                DecodeErrorKind::CountExceedsInput { count, remaining },
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_checked() {
        let buf = Bytes::from_static(&[0, 1, 0xFF, 0xFF, 0xFF, 0xFE, b'a', 0, b'x']);
        let mut c = Cursor::new(&buf);
        assert_eq!(c.u16(), Ok(1));
        assert_eq!(c.i32(), Ok(-2));
        assert_eq!(c.cstr().as_deref(), Ok("a"));
        assert_eq!(c.pos(), 8);
        assert_eq!(
            c.i64(),
            Err(DecodeError::new(
                8,
                DecodeErrorKind::UnexpectedEnd {
                    needed: 8,
                    remaining: 1
                }
            ))
        );
        assert_eq!(
            c.cstr(),
            Err(DecodeError::new(8, DecodeErrorKind::MissingNulTerminator))
        );
        assert_eq!(c.bytes(1).as_deref(), Ok(&b"x"[..]));
        assert_eq!(c.remaining(), 0);
        assert!(c.u8().is_err());
        assert_eq!(c.bytes(0).as_deref(), Ok(&b""[..]));
    }

    #[test]
    fn bytes_are_zero_copy() {
        let buf = Bytes::from(vec![0, 0, 0, 3, b'a', b'b', b'c']);
        let mut c = Cursor::new(&buf);
        let v = c.len_prefixed().expect("valid");
        assert_eq!(&v[..], b"abc");
        assert_eq!(v.as_ptr(), buf[4..].as_ptr());
    }

    #[test]
    fn negative_length_and_bad_utf8() {
        let buf = Bytes::from_static(&[0xFF, 0xFF, 0xFF, 0xFF]);
        assert_eq!(
            Cursor::new(&buf).len_prefixed(),
            Err(DecodeError::new(0, DecodeErrorKind::NegativeLength(-1)))
        );
        let buf = Bytes::from_static(&[b'o', b'k', 0xC3, 0]);
        assert_eq!(
            Cursor::new(&buf).cstr(),
            Err(DecodeError::new(2, DecodeErrorKind::InvalidUtf8))
        );
    }
}
