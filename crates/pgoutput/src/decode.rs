//! The decoder: [`decode`] one message from its bytes.

use bytes::Bytes;

use crate::Lsn;
use crate::cursor::Cursor;
use crate::error::{DecodeError, DecodeErrorKind};
use crate::message::{
    Begin, Column, Commit, Delete, Insert, LogicalMessage, Message, OldTuple, Origin, Relation,
    Truncate, TupleData, TupleValue, TypeInfo, Update,
};

/// Smallest encoding of one Relation column: flags, empty name NUL, type OID, typmod.
const MIN_COLUMN_SIZE: usize = 1 + 1 + 4 + 4;
/// Smallest encoding of one tuple value: the kind byte alone (`n` or `u`).
const MIN_VALUE_SIZE: usize = 1;
/// Size of one relation OID in a Truncate message.
const OID_SIZE: usize = 4;

/// Decodes one pgoutput (proto_version 1) message: the payload of one
/// XLogData (`w`) frame.
///
/// Never panics. Text, Binary and Message payload bytes are zero-copy slices
/// of `buf`. The whole buffer must be exactly one message: extra bytes give
/// [`DecodeErrorKind::TrailingBytes`].
///
/// # Errors
/// A [`DecodeError`] with the offset of the offending field if the input is
/// empty, truncated, has an unknown tag or tuple kind, a bad string, a
/// negative length, an impossible count, or trailing bytes.
pub fn decode(buf: &Bytes) -> Result<LogicalMessage, DecodeError> {
    let mut c = Cursor::new(buf);
    let tag = c
        .u8()
        .map_err(|_| DecodeError::new(0, DecodeErrorKind::Empty))?;
    let msg = match tag {
        b'B' => LogicalMessage::Begin(Begin {
            final_lsn: lsn(&mut c)?,
            commit_time: c.i64()?,
            xid: c.u32()?,
        }),
        b'C' => LogicalMessage::Commit(Commit {
            flags: c.u8()?,
            commit_lsn: lsn(&mut c)?,
            end_lsn: lsn(&mut c)?,
            commit_time: c.i64()?,
        }),
        b'O' => LogicalMessage::Origin(Origin {
            commit_lsn: lsn(&mut c)?,
            name: c.cstr()?,
        }),
        b'R' => LogicalMessage::Relation(relation(&mut c)?),
        b'Y' => LogicalMessage::Type(TypeInfo {
            id: c.u32()?,
            namespace: c.cstr()?,
            name: c.cstr()?,
        }),
        b'I' => {
            let relation_id = c.u32()?;
            new_tuple_marker(&mut c)?;
            LogicalMessage::Insert(Insert {
                relation_id,
                new: tuple(&mut c)?,
            })
        }
        b'U' => update(&mut c)?,
        b'D' => {
            let relation_id = c.u32()?;
            let at = c.pos();
            let old = match c.u8()? {
                b'K' => OldTuple::Key(tuple(&mut c)?),
                b'O' => OldTuple::Full(tuple(&mut c)?),
                other => {
                    return Err(DecodeError::new(
                        at,
                        DecodeErrorKind::UnknownOldTupleKind(other),
                    ));
                }
            };
            LogicalMessage::Delete(Delete { relation_id, old })
        }
        b'T' => LogicalMessage::Truncate(truncate(&mut c)?),
        b'M' => LogicalMessage::Message(Message {
            transactional: c.u8()? & 1 != 0,
            lsn: lsn(&mut c)?,
            prefix: c.cstr()?,
            content: c.len_prefixed()?,
        }),
        other => {
            return Err(DecodeError::new(
                0,
                DecodeErrorKind::UnknownMessageTag(other),
            ));
        }
    };
    match c.remaining() {
        0 => Ok(msg),
        n => Err(c.err(DecodeErrorKind::TrailingBytes(n))),
    }
}

fn lsn(c: &mut Cursor<'_>) -> Result<Lsn, DecodeError> {
    c.u64().map(Lsn)
}

fn relation(c: &mut Cursor<'_>) -> Result<Relation, DecodeError> {
    let id = c.u32()?;
    let namespace = c.cstr()?;
    let name = c.cstr()?;
    let replica_identity = c.u8()?;
    let at = c.pos();
    let n = usize::from(c.u16()?);
    c.check_count(at, n, MIN_COLUMN_SIZE)?;
    let mut columns = Vec::with_capacity(n);
    for _ in 0..n {
        columns.push(Column {
            flags: c.u8()?,
            name: c.cstr()?,
            type_oid: c.u32()?,
            type_modifier: c.i32()?,
        });
    }
    Ok(Relation {
        id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn update(c: &mut Cursor<'_>) -> Result<LogicalMessage, DecodeError> {
    let relation_id = c.u32()?;
    let at = c.pos();
    let old = match c.u8()? {
        b'K' => Some(OldTuple::Key(tuple(c)?)),
        b'O' => Some(OldTuple::Full(tuple(c)?)),
        b'N' => None,
        other => {
            return Err(DecodeError::new(
                at,
                DecodeErrorKind::UnknownOldTupleKind(other),
            ));
        }
    };
    if old.is_some() {
        new_tuple_marker(c)?;
    }
    Ok(LogicalMessage::Update(Update {
        relation_id,
        old,
        new: tuple(c)?,
    }))
}

/// Consumes the `N` byte that introduces a new tuple.
fn new_tuple_marker(c: &mut Cursor<'_>) -> Result<(), DecodeError> {
    let at = c.pos();
    match c.u8()? {
        b'N' => Ok(()),
        other => Err(DecodeError::new(
            at,
            DecodeErrorKind::UnknownOldTupleKind(other),
        )),
    }
}

fn truncate(c: &mut Cursor<'_>) -> Result<Truncate, DecodeError> {
    let at = c.pos();
    let n = c.i32()?;
    let n =
        usize::try_from(n).map_err(|_| DecodeError::new(at, DecodeErrorKind::NegativeLength(n)))?;
    let options = c.u8()?;
    c.check_count(at, n, OID_SIZE)?;
    let mut relation_ids = Vec::with_capacity(n);
    for _ in 0..n {
        relation_ids.push(c.u32()?);
    }
    Ok(Truncate {
        options,
        relation_ids,
    })
}

fn tuple(c: &mut Cursor<'_>) -> Result<TupleData, DecodeError> {
    let at = c.pos();
    let n = usize::from(c.u16()?);
    c.check_count(at, n, MIN_VALUE_SIZE)?;
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        let at = c.pos();
        values.push(match c.u8()? {
            b'n' => TupleValue::Null,
            b'u' => TupleValue::UnchangedToast,
            b't' => TupleValue::Text(c.len_prefixed()?),
            b'b' => TupleValue::Binary(c.len_prefixed()?),
            other => {
                return Err(DecodeError::new(
                    at,
                    DecodeErrorKind::UnknownTupleKind(other),
                ));
            }
        });
    }
    Ok(TupleData { values })
}
