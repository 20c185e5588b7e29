//! Why a row could not become a message.

use pgoutput::{Lsn, Oid};

/// Why one row could not become a message. The relay fails closed on these: it stops before
/// the row's transaction and confirms nothing past it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// An Insert for a relation whose Relation message never arrived (protocol violation).
    #[error("insert into relation oid {0} arrived before its relation message")]
    UnknownRelation(Oid),
    /// A mapped column is not in the table (dropped, renamed, or never there).
    #[error(
        "outbox table `{table}` has no column `{column}` (mapped as {role}); fix the mapping or the table"
    )]
    MissingColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// What the mapping uses it for.
        role: &'static str,
    },
    /// A configured outbox table (known by its relation OID) is announced under another name:
    /// `ALTER TABLE … RENAME` or `SET SCHEMA`. The publication still streams its rows.
    #[error(
        "outbox table `{configured}` (relation oid {oid}) is now named `{now}` (renamed or moved to another schema); its rows would no longer match the configuration. Rename it back, or set [[outbox]] table = \"{now}\" and restart"
    )]
    OutboxRenamed {
        /// The table as configured.
        configured: String,
        /// Its name now.
        now: String,
        /// The relation OID.
        oid: Oid,
    },
    /// A mapped column was renamed (same position and type, another name).
    #[error(
        "outbox table `{table}`: column `{column}` (mapped as {role}) was renamed to `{now}`; rename it back, or map `{now}` in the [[outbox]] configuration, and restart"
    )]
    ColumnRenamed {
        /// The table.
        table: String,
        /// The mapped (old) name.
        column: String,
        /// The name now.
        now: String,
        /// What the mapping uses it for.
        role: &'static str,
    },
    /// A mapped column changed its type since the relay first saw the table in this session.
    #[error(
        "outbox table `{table}`: column `{column}` (mapped as {role}) changed type from oid {was} to oid {now}; restart the relay once the mapping fits the new type"
    )]
    ColumnTypeChanged {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// What the mapping uses it for.
        role: &'static str,
        /// Type OID first seen.
        was: u32,
        /// Type OID now.
        now: u32,
    },
    /// A column mapped to a native header has a type the header cannot come from.
    #[error(
        "outbox table `{table}`: column `{column}` (mapped as {role}) has type oid {type_oid}, expected {expected}; change the column's type or the mapping"
    )]
    ColumnType {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// What the mapping uses it for.
        role: &'static str,
        /// Its type OID.
        type_oid: u32,
        /// The types that work.
        expected: &'static str,
    },
    /// A value of a column mapped to a native or CloudEvents header cannot be that header.
    #[error(
        "event {event_id} in `{table}`: column `{column}` cannot be header `{header}`: {reason}"
    )]
    InvalidNativeValue {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// The column.
        column: String,
        /// The header.
        header: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The payload is not what `payload_format` declares.
    #[error("event {event_id} in `{table}`: payload column `{column}` is not valid JSON: {reason}")]
    InvalidPayload {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// The payload column.
        column: String,
        /// What is wrong.
        reason: String,
    },
    /// The payload breaks its event type's contract, or no contract matches and one is required.
    #[error("event {event_id} in `{table}`: {refusal}")]
    Contract {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// Why (boxed: the error stays small on the routing path).
        refusal: Box<crate::route::ContractRefusal>,
    },
    /// The event id was already used in this session for a different subject or payload.
    #[error(
        "event {event_id} in `{table}`: event id collision: an earlier row with this id had a different subject or payload"
    )]
    IdCollision {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
    },
    /// The row has a different number of values than its relation has columns.
    #[error("row in `{table}` has {got} values but the relation has {expected} columns")]
    ColumnCount {
        /// The table.
        table: String,
        /// Values in the row.
        got: usize,
        /// Columns in the relation.
        expected: usize,
    },
    /// The event id is NULL or empty.
    #[error("row in `{table}` has a NULL or empty event id in column `{column}`")]
    MissingEventId {
        /// The table.
        table: String,
        /// The event id column.
        column: String,
    },
    /// A subject column is NULL or empty: it cannot form a subject token.
    #[error("event {event_id} in `{table}`: subject column `{column}` is NULL or empty")]
    EmptySubjectValue {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// The column.
        column: String,
    },
    /// A `{levels:column}` value cannot be subject levels.
    #[error(
        "event {event_id} in `{table}`: subject column `{column}` (a {{levels:{column}}} placeholder) cannot be subject levels: {reason}. Fix the value where it is written, or map the column as {{{column}}} to keep it in one escaped token"
    )]
    InvalidSubjectLevels {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// The column.
        column: String,
        /// What is wrong.
        reason: crate::subject::LevelsError,
    },
    /// A `headers_json` value cannot become headers.
    #[error(
        "event {event_id} in `{table}`: column `{column}` (mapped as headers_json) cannot become headers: {reason}"
    )]
    InvalidHeaderObject {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// The column.
        column: String,
        /// What is wrong, and the fix.
        reason: crate::route::HeaderObjectError,
    },
    /// The member a `payload_pointer` or `headers_json_pointer` names is not in the value.
    #[error(
        "event {event_id} in `{table}`: column `{column}` has no member {pointer} ({key}): {reason}. Write the member where the row is written, or fix `{key}` in the [[outbox]] entry"
    )]
    MissingMember {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// The column.
        column: String,
        /// `payload_pointer` or `headers_json_pointer`.
        key: &'static str,
        /// The pointer.
        pointer: String,
        /// What is wrong (boxed: the error stays small on the routing path).
        reason: Box<crate::route::MemberError>,
    },
    /// A value holds a control character (CR, LF, ...) and cannot be a header value.
    #[error(
        "event {event_id} in `{table}`: column `{column}` holds a control character and cannot be header `{header}`"
    )]
    InvalidHeaderValue {
        /// The table.
        table: String,
        /// The event id (may be the raw value if the id itself is bad).
        event_id: String,
        /// The column.
        column: String,
        /// The header.
        header: String,
    },
    /// A value in a form the relay does not request (binary, unchanged TOAST) or a bad bytea.
    #[error("event {event_id} in `{table}`: column `{column}` has an unusable value: {reason}")]
    UnusableValue {
        /// The table.
        table: String,
        /// The event id.
        event_id: String,
        /// The column.
        column: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The message would break a limit of the NATS server (control line, header block,
    /// `max_payload`): it would be refused, or its connection closed, on every re-send.
    #[error(
        "event {event_id} in `{table}`: {origin} makes the {part} too large to publish: {reason}"
    )]
    TooLarge {
        /// The table.
        table: String,
        /// The event id (cut when long).
        event_id: String,
        /// What produced the oversized part, e.g. "column `kind`".
        origin: String,
        /// The oversized part: "subject", "header `Note`", "payload".
        part: String,
        /// The size and the limit it breaks.
        reason: String,
    },
    /// A non-transactional logical message (`pg_logical_emit_message(false, …)`) of a
    /// configured prefix without `allow_non_transactional`: PostgreSQL delivers it even when
    /// the transaction that emitted it rolls back.
    #[error(
        "non-transactional logical message (pg_logical_emit_message(false, …)) with prefix `{}` at LSN {lsn}: PostgreSQL delivers it even when its transaction rolls back, so it is not published unless allow_non_transactional = true is set on [[messages]] prefix \"{}\"",
        .prefix.escape_debug(),
        .prefix.escape_debug()
    )]
    NonTransactional {
        /// The `pg_logical_emit_message` prefix.
        prefix: String,
        /// The message's own LSN.
        lsn: Lsn,
    },
    /// A logical decoding message of a configured prefix that cannot be published: a bad
    /// envelope, a subject outside its filters, or too large.
    #[error("logical message with prefix `{}` at LSN {lsn}: {problem}", .prefix.escape_debug())]
    Message {
        /// The `pg_logical_emit_message` prefix.
        prefix: String,
        /// The message's own LSN.
        lsn: Lsn,
        /// What is wrong.
        problem: String,
    },
}

impl RouteError {
    /// Whether the table's shape no longer matches the configuration (renamed table, missing,
    /// renamed or retyped mapped column). Every later row of the table fails the same way, so
    /// this is a configuration error that stops the relay, never a dead letter.
    #[must_use]
    pub const fn is_schema_mismatch(&self) -> bool {
        matches!(
            self,
            Self::OutboxRenamed { .. }
                | Self::ColumnRenamed { .. }
                | Self::MissingColumn { .. }
                | Self::ColumnTypeChanged { .. }
                | Self::ColumnType { .. }
        )
    }
}
