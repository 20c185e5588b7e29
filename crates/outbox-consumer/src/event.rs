//! The typed event read from one relay message.

use std::time::SystemTime;

use async_nats::HeaderMap;
use bytes::Bytes;
pub use outbox_contract::{
    HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_COMMIT_LSN, HEADER_COMMIT_TIME,
    HEADER_EVENT_TYPE, HEADER_MSG_ID, HEADER_SCHEMA, HEADER_TABLE, HEADER_TRACEPARENT,
    HEADER_TX_INDEX, HEADER_XID, Lsn,
};
use serde::de::DeserializeOwned;

/// Why a JetStream message could not be read as an [`Event`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The message has no (or an empty) `Nats-Msg-Id` header, so it has no event id.
    #[error("message has no Nats-Msg-Id header (event id)")]
    MissingEventId,
    /// The message did not come from a JetStream consumer (no `$JS.ACK` reply subject).
    #[error("not a JetStream message: {0}")]
    NotJetStream(String),
}

/// One outbox event as delivered to a handler.
///
/// Optional headers that are absent or cannot be parsed are `None`; the raw values stay
/// available in [`Event::headers`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Event {
    /// Event id (`Nats-Msg-Id`): the outbox row id, stable across re-sends.
    pub id: String,
    /// NATS subject, e.g. `outbox.Order.order-created`.
    pub subject: String,
    /// JetStream stream sequence of this copy (a re-sent duplicate has a new sequence).
    pub stream_sequence: u64,
    /// How many times JetStream has delivered this message to this consumer (1 = first).
    pub delivered: u64,
    /// `Outbox-Commit-Lsn`.
    pub commit_lsn: Option<Lsn>,
    /// `Outbox-Xid`.
    pub xid: Option<u32>,
    /// `Outbox-Commit-Time`.
    pub commit_time: Option<SystemTime>,
    /// `Outbox-Table` (`schema.table`).
    pub table: Option<String>,
    /// `Outbox-Tx-Index`.
    pub tx_index: Option<u32>,
    /// `Outbox-Aggregate-Type`.
    pub aggregate_type: Option<String>,
    /// `Outbox-Aggregate-Id`.
    pub aggregate_id: Option<String>,
    /// `Outbox-Event-Type`.
    pub event_type: Option<String>,
    /// `traceparent`.
    pub traceparent: Option<String>,
    /// `Outbox-Schema`: the KV key (`<name>.<version>`) of the contract the relay checked the
    /// payload against.
    pub schema: Option<String>,
    /// All headers as received.
    pub headers: HeaderMap,
    /// The outbox row's payload column, byte for byte.
    pub payload: Bytes,
    /// The ledger already had this event and the consumer was told to re-apply it
    /// ([`ConsumerBuilder::reapply`](crate::ConsumerBuilder::reapply)): the handler runs again
    /// and its writes, with the replaced ledger row, commit together.
    pub reapplied: bool,
}

impl Event {
    /// An event with the given id, subject and payload and nothing else; for handler unit tests.
    pub fn new(
        id: impl Into<String>,
        subject: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Self {
        Self {
            id: id.into(),
            subject: subject.into(),
            stream_sequence: 0,
            delivered: 1,
            commit_lsn: None,
            xid: None,
            commit_time: None,
            table: None,
            tx_index: None,
            aggregate_type: None,
            aggregate_id: None,
            event_type: None,
            traceparent: None,
            schema: None,
            headers: HeaderMap::new(),
            payload: payload.into(),
            reapplied: false,
        }
    }

    /// Reads a message pulled from a JetStream consumer.
    pub fn from_message(msg: &async_nats::jetstream::Message) -> Result<Self, EventError> {
        let info = msg
            .info()
            .map_err(|e| EventError::NotJetStream(e.to_string()))?;
        let (seq, delivered) = (
            info.stream_sequence,
            u64::try_from(info.delivered).unwrap_or(0),
        );
        Self::from_parts(
            msg.subject.as_str(),
            msg.headers.as_ref(),
            msg.payload.clone(),
            seq,
            delivered,
        )
    }

    /// Builds an event from a message's parts.
    pub fn from_parts(
        subject: &str,
        headers: Option<&HeaderMap>,
        payload: Bytes,
        stream_sequence: u64,
        delivered: u64,
    ) -> Result<Self, EventError> {
        let empty = HeaderMap::new();
        let headers = headers.unwrap_or(&empty);
        let get = |name: &str| {
            headers
                .get(name)
                .map(|v| v.as_str().trim())
                .filter(|v| !v.is_empty())
        };
        let owned = |name: &str| get(name).map(str::to_owned);
        // A scheduled event's delivered copy has no `Nats-Msg-Id` (JetStream strips it): its
        // id is in `Outbox-Event-Id`.
        let id = owned(HEADER_MSG_ID)
            .or_else(|| owned(outbox_contract::HEADER_EVENT_ID))
            .ok_or(EventError::MissingEventId)?;
        Ok(Self {
            id,
            subject: subject.to_owned(),
            stream_sequence,
            delivered,
            commit_lsn: get(HEADER_COMMIT_LSN).and_then(|v| v.parse().ok()),
            xid: get(HEADER_XID).and_then(|v| v.parse().ok()),
            commit_time: get(HEADER_COMMIT_TIME).and_then(|v| humantime::parse_rfc3339(v).ok()),
            table: owned(HEADER_TABLE),
            tx_index: get(HEADER_TX_INDEX).and_then(|v| v.parse().ok()),
            aggregate_type: owned(HEADER_AGGREGATE_TYPE),
            aggregate_id: owned(HEADER_AGGREGATE_ID),
            event_type: owned(HEADER_EVENT_TYPE),
            traceparent: owned(HEADER_TRACEPARENT),
            schema: owned(HEADER_SCHEMA),
            headers: headers.clone(),
            payload,
            reapplied: false,
        })
    }

    /// Deserializes the payload as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// The raw value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, *v);
        }
        h
    }

    #[test]
    fn a_scheduled_events_delivered_copy_is_known_by_outbox_event_id() {
        let h = headers(&[("Outbox-Event-Id", "42"), ("Nats-Scheduler", "s.42")]);
        let ev = Event::from_parts("outbox.a", Some(&h), Bytes::new(), 9, 1).unwrap();
        assert_eq!(ev.id, "42");
        let both = headers(&[("Nats-Msg-Id", "41"), ("Outbox-Event-Id", "42")]);
        let ev = Event::from_parts("outbox.a", Some(&both), Bytes::new(), 9, 1).unwrap();
        assert_eq!(ev.id, "41");
    }

    #[test]
    fn parses_every_relay_header() {
        let h = headers(&[
            ("Nats-Msg-Id", "42"),
            ("Outbox-Commit-Lsn", "0/16B3748"),
            ("Outbox-Xid", "771"),
            ("Outbox-Commit-Time", "2026-11-29T11:38:44.123456Z"),
            ("Outbox-Table", "public.outbox"),
            ("Outbox-Tx-Index", "2"),
            ("Outbox-Aggregate-Type", "Order"),
            ("Outbox-Aggregate-Id", "7"),
            ("Outbox-Event-Type", "order-created"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("Outbox-Schema", "order-created.565aaced9d08"),
        ]);
        let ev = Event::from_parts(
            "outbox.Order.order-created",
            Some(&h),
            Bytes::from_static(br#"{"n":1}"#),
            9,
            3,
        )
        .expect("event");
        assert_eq!(ev.id, "42");
        assert_eq!(ev.stream_sequence, 9);
        assert_eq!(ev.delivered, 3);
        assert_eq!(ev.commit_lsn, Some(Lsn(0x16B3748)));
        assert_eq!(
            ev.commit_lsn.map(|l| l.to_string()).as_deref(),
            Some("0/16B3748")
        );
        assert_eq!(ev.xid, Some(771));
        let expected = UNIX_EPOCH + Duration::from_micros(1_795_952_324_123_456);
        assert_eq!(ev.commit_time, Some(expected));
        assert_eq!(ev.table.as_deref(), Some("public.outbox"));
        assert_eq!(ev.tx_index, Some(2));
        assert_eq!(ev.aggregate_type.as_deref(), Some("Order"));
        assert_eq!(ev.aggregate_id.as_deref(), Some("7"));
        assert_eq!(ev.event_type.as_deref(), Some("order-created"));
        assert!(ev.traceparent.is_some());
        assert_eq!(ev.schema.as_deref(), Some("order-created.565aaced9d08"));
        #[derive(serde::Deserialize)]
        struct P {
            n: u32,
        }
        assert_eq!(ev.json::<P>().expect("json").n, 1);
        assert_eq!(ev.header("Outbox-Xid"), Some("771"));
    }

    #[test]
    fn tolerates_absent_and_garbled_optional_headers() {
        let h = headers(&[
            ("Nats-Msg-Id", "x"),
            ("Outbox-Commit-Lsn", "nonsense"),
            ("Outbox-Xid", "-1"),
            ("Outbox-Commit-Time", "yesterday"),
            ("Outbox-Tx-Index", ""),
        ]);
        let ev = Event::from_parts("s", Some(&h), Bytes::new(), 1, 1).expect("event");
        assert_eq!(ev.id, "x");
        assert_eq!(ev.commit_lsn, None);
        assert_eq!(ev.xid, None);
        assert_eq!(ev.commit_time, None);
        assert_eq!(ev.tx_index, None);
        assert_eq!(ev.table, None);
        assert_eq!(ev.schema, None);
        assert!(ev.json::<serde_json::Value>().is_err());
    }

    #[test]
    fn accepts_backfilled_messages() {
        // `outbox-relay backfill`: the row's commit is unknown (see docs/message-format.md).
        let h = headers(&[
            ("Nats-Msg-Id", "42"),
            ("Outbox-Commit-Lsn", "0/0"),
            ("Outbox-Xid", "0"),
            ("Outbox-Commit-Time", "2026-11-29T11:38:44.123456Z"),
            ("Outbox-Table", "public.outbox"),
            ("Outbox-Tx-Index", "17"),
            (outbox_contract::HEADER_BACKFILL, "true"),
        ]);
        let ev = Event::from_parts("outbox.Order.created", Some(&h), Bytes::new(), 5, 1)
            .expect("a backfilled message is an event");
        assert_eq!(ev.id, "42");
        assert_eq!(ev.commit_lsn, Some(Lsn(0)));
        assert_eq!(ev.xid, Some(0));
        assert!(ev.commit_time.is_some());
        assert_eq!(ev.tx_index, Some(17));
        assert_eq!(ev.header(outbox_contract::HEADER_BACKFILL), Some("true"));
    }

    #[test]
    fn missing_event_id_is_an_error() {
        assert_eq!(
            Event::from_parts("s", None, Bytes::new(), 1, 1).err(),
            Some(EventError::MissingEventId)
        );
        let h = headers(&[("Nats-Msg-Id", " ")]);
        assert_eq!(
            Event::from_parts("s", Some(&h), Bytes::new(), 1, 1).err(),
            Some(EventError::MissingEventId)
        );
    }
}
