//! The wire contract between outbox-relay and the services that consume its messages.
//!
//! One definition of every header name the relay writes and `outbox-consumer` reads, of the
//! headers the dead letters carry, of the `Nats-*` headers that must not follow a message
//! that is re-published elsewhere, and of the LSN text form (`0/16B3748`). The relay
//! (`relay-core`, `relay-nats`), the decoder (`pgoutput`) and the consumer library use these,
//! so the two ends cannot drift apart. See `docs/message-format.md` and `docs/consumers.md`.
//!
//! No dependencies, no IO.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

mod lsn;
mod reserved;

pub use lsn::{Lsn, ParseLsnError};
pub use reserved::{
    HEADER_ORIGINAL_PREFIX, RESERVED_PREFIX, SERVER_ACTION_HEADERS, STREAM_BINDING_HEADERS,
    is_reserved, original_name,
};

// --- Headers on every relay message -------------------------------------------------------

/// JetStream's deduplication header; the relay sets it to the event id, which consumers use as
/// the idempotency key.
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";
/// JetStream refuses the message unless this stream stores it; the relay sets its configured
/// stream, so a subject captured by another stream fails instead of landing there.
pub const HEADER_EXPECTED_STREAM: &str = "Nats-Expected-Stream";
/// JetStream stores the message only if the stream's last message has this `Nats-Msg-Id`: the
/// relay chains each event on the one committed before it while that one is not yet known
/// stored, so the stream keeps commit order under broker faults.
pub const HEADER_EXPECTED_LAST_MSG_ID: &str = "Nats-Expected-Last-Msg-Id";
/// JetStream stores the message (an atomic batch, checked at its commit) only if the stream's
/// last sequence is this one: in `atomic-batch` mode, on a batch's first message, the
/// sequence at which the event committed before it is stored.
pub const HEADER_EXPECTED_LAST_SEQUENCE: &str = "Nats-Expected-Last-Sequence";
/// LSN of the commit record of the transaction that inserted the row, in [`Lsn`]'s text form.
pub const HEADER_COMMIT_LSN: &str = "Outbox-Commit-Lsn";
/// PostgreSQL transaction id of that transaction.
pub const HEADER_XID: &str = "Outbox-Xid";
/// Commit time of that transaction, RFC 3339 UTC with microseconds.
pub const HEADER_COMMIT_TIME: &str = "Outbox-Commit-Time";
/// The source table, `schema.table`.
pub const HEADER_TABLE: &str = "Outbox-Table";
/// 0-based position of the event among the outbox events of its transaction.
pub const HEADER_TX_INDEX: &str = "Outbox-Tx-Index";
/// The `pg_logical_emit_message` prefix a table-free event came from; such events carry it
/// instead of `Outbox-Table`.
pub const HEADER_MESSAGE_PREFIX: &str = "Outbox-Message-Prefix";

/// The headers every message the relay publishes for an outbox row carries, whatever the
/// mapping; the mapped headers come on top.
pub const RELAY_HEADERS: [&str; 7] = [
    HEADER_MSG_ID,
    HEADER_EXPECTED_STREAM,
    HEADER_COMMIT_LSN,
    HEADER_XID,
    HEADER_COMMIT_TIME,
    HEADER_TABLE,
    HEADER_TX_INDEX,
];

// --- Header of messages published by `outbox-relay backfill` ---------------------------------

/// Set to `true` on a message that `outbox-relay backfill` published from a row read from the
/// table (not from the WAL): its transaction is unknown, so `Outbox-Commit-Lsn` is `0/0`,
/// `Outbox-Xid` is `0` and `Outbox-Commit-Time` is when the backfill read the row. Absent on
/// the relay's own messages. See `docs/message-format.md` and `docs/replay.md`.
pub const HEADER_BACKFILL: &str = "Outbox-Backfill";

// --- Headers of the default mapping (present when the row has the column) -----------------

/// Aggregate type (default mapping, column `aggregatetype`).
pub const HEADER_AGGREGATE_TYPE: &str = "Outbox-Aggregate-Type";
/// Aggregate id (default mapping, column `aggregateid`).
pub const HEADER_AGGREGATE_ID: &str = "Outbox-Aggregate-Id";
/// Event type (default mapping, column `type`).
pub const HEADER_EVENT_TYPE: &str = "Outbox-Event-Type";
/// W3C trace context (default mapping, optional column `tracingspancontext`).
pub const HEADER_TRACEPARENT: &str = "traceparent";

// --- Broker-native headers mapped from optional outbox columns (docs/message-format.md) -----

/// Per-message TTL (nats-server 2.11+, a stream with `allow_msg_ttl`): whole seconds after
/// which JetStream removes the message.
pub const HEADER_NATS_TTL: &str = "Nats-TTL";
/// Delayed delivery (nats-server 2.12+, a stream with `allow_msg_schedules`): `@at <RFC 3339>`.
/// The message is stored on a schedule subject of its own and JetStream publishes a copy to
/// [`HEADER_SCHEDULE_TARGET`] at that time, then removes the schedule.
pub const HEADER_SCHEDULE: &str = "Nats-Schedule";
/// The subject a scheduled message is delivered to (the event's subject).
pub const HEADER_SCHEDULE_TARGET: &str = "Nats-Schedule-Target";
/// The TTL the delivered copy of a scheduled message gets (`Nats-TTL` on the schedule itself
/// would expire the schedule).
pub const HEADER_SCHEDULE_TTL: &str = "Nats-Schedule-TTL";
/// The event id, on scheduled messages only: JetStream strips `Nats-Msg-Id` from the copy it
/// delivers, so consumers (and the relay's start-up scan) read the id from here instead.
pub const HEADER_EVENT_ID: &str = "Outbox-Event-Id";

/// The broker-native headers the relay sets from `ttl_column` / `schedule_column`; a mapping
/// may not set them through `headers` (that would skip the server and stream checks).
pub const NATIVE_HEADERS: [&str; 5] = [
    HEADER_NATS_TTL,
    HEADER_SCHEDULE,
    HEADER_SCHEDULE_TARGET,
    HEADER_SCHEDULE_TTL,
    HEADER_EVENT_ID,
];

// --- CloudEvents binary content mode (CloudEvents NATS protocol binding, `[outbox.cloudevents]`)

/// CloudEvents `id`: the event id.
pub const HEADER_CE_ID: &str = "ce-id";
/// CloudEvents `source`: configured per table.
pub const HEADER_CE_SOURCE: &str = "ce-source";
/// CloudEvents `type`: from the type column.
pub const HEADER_CE_TYPE: &str = "ce-type";
/// CloudEvents `time`: the commit time, or a configured column, RFC 3339 UTC.
pub const HEADER_CE_TIME: &str = "ce-time";
/// CloudEvents `specversion`: always [`CE_SPECVERSION`].
pub const HEADER_CE_SPECVERSION: &str = "ce-specversion";
/// CloudEvents `subject`: from a configured column, when set.
pub const HEADER_CE_SUBJECT: &str = "ce-subject";
/// The CloudEvents version the headers follow.
pub const CE_SPECVERSION: &str = "1.0";
/// Every CloudEvents header name prefix (`ce-`): a table with CloudEvents on may not map
/// another `ce-*` header through `headers`.
pub const CE_PREFIX: &str = "ce-";

// --- Event contracts (docs/contracts.md) ---------------------------------------------------

/// The contract an event was checked against before it was published: its key in the
/// contracts KV bucket, `<name>.<version>`, where the version is the first 12 hex digits of the
/// SHA-256 of the stored schema. Absent on events of an event type without a contract.
pub const HEADER_SCHEMA: &str = "Outbox-Schema";
/// The NATS KV bucket the relay stores contracts in, unless configured otherwise.
pub const CONTRACTS_BUCKET: &str = "outbox-contracts";

// --- Dead letters ---------------------------------------------------------------------------

/// Why the message is a dead letter. Set by the relay on a row it cannot route (with
/// `dead_letter_subject` configured) and by `outbox-consumer` on an event it parks.
pub const HEADER_DLQ_REASON: &str = "Outbox-Dlq-Reason";

/// Whether `name` is a header the relay sets itself on some message (any case): a mapping (or
/// an emitted message's envelope) may not set it, or it would overwrite or shadow the relay's.
#[must_use]
pub fn is_relay_owned(name: &str) -> bool {
    RELAY_HEADERS
        .iter()
        .chain(&[
            HEADER_BACKFILL,
            HEADER_MESSAGE_PREFIX,
            HEADER_DLQ_REASON,
            HEADER_SCHEMA,
        ])
        .chain(&NATIVE_HEADERS)
        .any(|own| own.eq_ignore_ascii_case(name))
}
/// Consumer dead letter: the subject the message was delivered on.
pub const HEADER_DLQ_SUBJECT: &str = "Outbox-Dlq-Subject";
/// Consumer dead letter: the event id (`Nats-Msg-Id` of the original message).
pub const HEADER_DLQ_EVENT_ID: &str = "Outbox-Dlq-Event-Id";
/// Consumer dead letter: how many times the message had been delivered.
pub const HEADER_DLQ_DELIVERIES: &str = "Outbox-Dlq-Deliveries";
/// Consumer dead letter: the consumer (service) that parked it.
pub const HEADER_DLQ_CONSUMER: &str = "Outbox-Dlq-Consumer";
/// Consumer dead letter: stream and sequence of the original message, `STREAM:SEQ`.
pub const HEADER_DLQ_SOURCE: &str = "Outbox-Dlq-Source";

#[cfg(test)]
mod tests {
    #[test]
    fn relay_owned_headers_are_found_in_any_case() {
        for own in [
            "nats-msg-id",
            "OUTBOX-DLQ-REASON",
            "Outbox-Backfill",
            "Outbox-Message-Prefix",
        ] {
            assert!(is_relay_owned(own), "{own}");
        }
        assert!(is_relay_owned("nats-ttl") && is_relay_owned("Outbox-Event-Id"));
        assert!(!is_relay_owned("Outbox-Event-Type"));
        assert!(!is_relay_owned("traceparent"));
    }

    use super::*;

    #[test]
    fn relay_headers_are_distinct_and_only_the_jetstream_ones_are_reserved() {
        for (i, a) in RELAY_HEADERS.iter().enumerate() {
            for b in &RELAY_HEADERS[i + 1..] {
                assert!(!a.eq_ignore_ascii_case(b), "{a} twice");
            }
        }
        let reserved: Vec<&str> = RELAY_HEADERS
            .into_iter()
            .filter(|h| is_reserved(h))
            .collect();
        assert_eq!(reserved, [HEADER_MSG_ID, HEADER_EXPECTED_STREAM]);
        for own in [
            HEADER_AGGREGATE_TYPE,
            HEADER_AGGREGATE_ID,
            HEADER_EVENT_TYPE,
            HEADER_TRACEPARENT,
            HEADER_BACKFILL,
            HEADER_DLQ_REASON,
            HEADER_DLQ_SUBJECT,
            HEADER_DLQ_EVENT_ID,
            HEADER_DLQ_DELIVERIES,
            HEADER_DLQ_CONSUMER,
            HEADER_DLQ_SOURCE,
        ] {
            assert!(!is_reserved(own), "{own}");
        }
    }
}
