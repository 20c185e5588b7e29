//! Decoded message types, one struct per pgoutput message.

use bytes::Bytes;

use crate::Lsn;

/// A PostgreSQL object id (relation or type).
pub type Oid = u32;

/// Microseconds between the Unix epoch and the PostgreSQL epoch (2000-01-01 UTC).
pub const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// Converts a PostgreSQL timestamp (microseconds since 2000-01-01 UTC, as in
/// [`Begin::commit_time`]) to microseconds since the Unix epoch (saturating).
#[must_use]
pub const fn pg_time_to_unix_micros(pg_micros: i64) -> i64 {
    pg_micros.saturating_add(PG_EPOCH_UNIX_MICROS)
}

/// One decoded pgoutput message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    /// `B`: start of a transaction.
    Begin(Begin),
    /// `C`: end of a transaction.
    Commit(Commit),
    /// `O`: the transaction was replayed from another origin.
    Origin(Origin),
    /// `R`: schema of a relation; precedes its first row change.
    Relation(Relation),
    /// `Y`: a non-built-in type used by a following Relation.
    Type(TypeInfo),
    /// `I`: a row was inserted.
    Insert(Insert),
    /// `U`: a row was updated.
    Update(Update),
    /// `D`: a row was deleted.
    Delete(Delete),
    /// `T`: relations were truncated.
    Truncate(Truncate),
    /// `M`: a `pg_logical_emit_message` payload.
    Message(Message),
}

impl LogicalMessage {
    /// The wire tag byte of this message (`b'B'`, `b'C'`, ...).
    #[must_use]
    pub const fn tag(&self) -> u8 {
        match self {
            LogicalMessage::Begin(_) => b'B',
            LogicalMessage::Commit(_) => b'C',
            LogicalMessage::Origin(_) => b'O',
            LogicalMessage::Relation(_) => b'R',
            LogicalMessage::Type(_) => b'Y',
            LogicalMessage::Insert(_) => b'I',
            LogicalMessage::Update(_) => b'U',
            LogicalMessage::Delete(_) => b'D',
            LogicalMessage::Truncate(_) => b'T',
            LogicalMessage::Message(_) => b'M',
        }
    }

    /// The relation a Relation/Insert/Update/Delete message is about.
    #[must_use]
    pub const fn relation_id(&self) -> Option<Oid> {
        match self {
            LogicalMessage::Relation(r) => Some(r.id),
            LogicalMessage::Insert(m) => Some(m.relation_id),
            LogicalMessage::Update(m) => Some(m.relation_id),
            LogicalMessage::Delete(m) => Some(m.relation_id),
            _ => None,
        }
    }
}

/// Start of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 UTC (see [`pg_time_to_unix_micros`]).
    pub commit_time: i64,
    /// Transaction id.
    pub xid: u32,
}

/// End of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// Flags (currently always 0).
    pub flags: u8,
    /// LSN of the commit record (equals [`Begin::final_lsn`]).
    pub commit_lsn: Lsn,
    /// LSN just past the commit record: confirm this once the transaction is durable.
    pub end_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 UTC.
    pub commit_time: i64,
}

/// The transaction originated on another node (replication origin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Commit LSN on the origin server.
    pub commit_lsn: Lsn,
    /// Origin name.
    pub name: String,
}

/// Schema of a relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Relation OID.
    pub id: Oid,
    /// Schema name (empty for `pg_catalog`).
    pub namespace: String,
    /// Relation name.
    pub name: String,
    /// Replica identity setting: `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    /// Columns in tuple order (generated and dropped columns excluded).
    pub columns: Vec<Column>,
}

impl Relation {
    /// Position of the column called `name`, which is also its index in
    /// [`TupleData::values`] of this relation's rows.
    #[must_use]
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The column called `name`.
    #[must_use]
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Flags: [`Column::FLAG_KEY`] if the column is part of the replica identity key.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: Oid,
    /// Type modifier (`atttypmod`, -1 if none).
    pub type_modifier: i32,
}

impl Column {
    /// Flag bit: the column is part of the key.
    pub const FLAG_KEY: u8 = 1;

    /// Whether the column is part of the replica identity key.
    #[must_use]
    pub const fn is_key(&self) -> bool {
        self.flags & Self::FLAG_KEY != 0
    }
}

/// A non-built-in data type referenced by a relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeInfo {
    /// Type OID.
    pub id: Oid,
    /// Schema name (empty for `pg_catalog`).
    pub namespace: String,
    /// Type name.
    pub name: String,
}

/// A row insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// Relation OID (announced by an earlier [`Relation`]).
    pub relation_id: Oid,
    /// The new row.
    pub new: TupleData,
}

/// A row update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Relation OID.
    pub relation_id: Oid,
    /// Old key or full old row, present when the key changed (`K`) or
    /// replica identity is FULL (`O`).
    pub old: Option<OldTuple>,
    /// The new row; unchanged TOASTed values are [`TupleValue::UnchangedToast`].
    pub new: TupleData,
}

/// A row delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// Relation OID.
    pub relation_id: Oid,
    /// Identity of the deleted row.
    pub old: OldTuple,
}

/// The old row sent with an Update or Delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `K`: key columns only (other columns are [`TupleValue::Null`]).
    Key(TupleData),
    /// `O`: the full old row (replica identity FULL).
    Full(TupleData),
}

impl OldTuple {
    /// The tuple, whichever kind.
    #[must_use]
    pub const fn tuple(&self) -> &TupleData {
        match self {
            OldTuple::Key(t) | OldTuple::Full(t) => t,
        }
    }
}

/// A TRUNCATE of one or more relations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Option bits: [`Truncate::CASCADE`], [`Truncate::RESTART_IDENTITY`].
    pub options: u8,
    /// OIDs of the truncated relations.
    pub relation_ids: Vec<Oid>,
}

impl Truncate {
    /// Option bit: `CASCADE`.
    pub const CASCADE: u8 = 1;
    /// Option bit: `RESTART IDENTITY`.
    pub const RESTART_IDENTITY: u8 = 2;

    /// Whether `CASCADE` was given.
    #[must_use]
    pub const fn cascade(&self) -> bool {
        self.options & Self::CASCADE != 0
    }

    /// Whether `RESTART IDENTITY` was given.
    #[must_use]
    pub const fn restart_identity(&self) -> bool {
        self.options & Self::RESTART_IDENTITY != 0
    }
}

/// A logical decoding message (`pg_logical_emit_message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Emitted inside a transaction (between Begin and Commit) rather than immediately.
    pub transactional: bool,
    /// LSN of the message.
    pub lsn: Lsn,
    /// The prefix given to `pg_logical_emit_message`.
    pub prefix: String,
    /// Payload, a zero-copy slice of the input buffer.
    pub content: Bytes,
}

/// Column values of one row, in [`Relation::columns`] order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TupleData {
    /// One value per column.
    pub values: Vec<TupleValue>,
}

impl TupleData {
    /// Value of column `index`, if present.
    #[must_use]
    pub fn get(&self, index: usize) -> Option<&TupleValue> {
        self.values.get(index)
    }

    /// Number of columns.
    #[must_use]
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the tuple has no columns.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// One column value of a [`TupleData`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    /// `n`: SQL NULL.
    Null,
    /// `u`: a TOASTed value that did not change (the real value is not sent).
    UnchangedToast,
    /// `t`: text format value, raw bytes as sent (not UTF-8 validated); zero-copy.
    Text(Bytes),
    /// `b`: binary format value (only with the `binary` option); zero-copy.
    Binary(Bytes),
}

impl TupleValue {
    /// The bytes of a Text or Binary value; `None` for Null and UnchangedToast.
    #[must_use]
    pub const fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            TupleValue::Text(b) | TupleValue::Binary(b) => Some(b),
            TupleValue::Null | TupleValue::UnchangedToast => None,
        }
    }

    /// The value as `&str` if it is a Text value holding valid UTF-8.
    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            TupleValue::Text(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// Whether the value is SQL NULL.
    #[must_use]
    pub const fn is_null(&self) -> bool {
        matches!(self, TupleValue::Null)
    }
}
