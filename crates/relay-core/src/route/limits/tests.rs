use bytes::Bytes;
use pgoutput::{Column, Lsn, Relation, TupleData};

use super::*;
use crate::message::TxContext;
use crate::route::OutboxTableConfig;

/// What async-nats 0.51 sends for a JetStream publish: reply `_INBOX.<nuid>.<nuid>` (52
/// bytes), and the publisher's `Nats-Expected-Stream: OUTBOX`.
fn nats_defaults() -> MessageLimits {
    MessageLimits {
        max_payload: 1 << 20,
        max_control_line: MessageLimits::DEFAULT_MAX_CONTROL_LINE,
        max_header_block: MessageLimits::JETSTREAM_MAX_HEADER_BYTES,
        reply_len: 52,
        extra_header_bytes: MessageLimits::header_line_len("Nats-Expected-Stream", "OUTBOX"),
    }
}

fn message(subject: &str, headers: &[(&str, &str)], payload: usize) -> OutboundMessage {
    OutboundMessage {
        headers: headers
            .iter()
            .map(|(n, v)| (Arc::from(*n), Arc::from(*v)))
            .collect(),
        ..OutboundMessage::bare(subject, "ev-1", Bytes::from(vec![b'x'; payload]), Lsn(1))
    }
}

#[test]
fn the_header_block_is_framing_plus_one_line_per_header() {
    let limits = MessageLimits {
        extra_header_bytes: 0,
        ..nats_defaults()
    };
    let msg = message("a", &[("K", "v")], 0);
    // "NATS/1.0\r\n" "Nats-Msg-Id: ev-1\r\n" "K: v\r\n" "\r\n"
    assert_eq!(limits.header_block_len(&msg), 10 + 19 + 6 + 2);
    let with_stream = nats_defaults().header_block_len(&msg);
    assert_eq!(with_stream, 37 + "Nats-Expected-Stream: OUTBOX\r\n".len());
}

#[test]
fn the_control_line_counts_subject_reply_and_both_sizes() {
    let limits = nats_defaults();
    // "outbox.a" SP 52-byte reply SP "123" SP "4567"
    assert_eq!(
        limits.control_line_len(8, 123, 4567),
        8 + 1 + 52 + 1 + 3 + 1 + 4
    );
    let no_reply = MessageLimits {
        reply_len: 0,
        ..limits
    };
    assert_eq!(no_reply.control_line_len(8, 9, 10), 8 + 1 + 1 + 1 + 2);
    assert_eq!(digits(0), 1);
    assert_eq!(digits(9), 1);
    assert_eq!(digits(10), 2);
    assert_eq!(digits(1_048_576), 7);
}

#[test]
fn a_subject_fits_up_to_the_last_byte_of_the_control_line() {
    let limits = nats_defaults();
    let probe = message("", &[], 10);
    let header = limits.header_block_len(&probe);
    let fixed = limits.control_line_len(0, header, header + 10);
    let longest = "s".repeat(MessageLimits::DEFAULT_MAX_CONTROL_LINE - fixed);
    assert_eq!(limits.check(&message(&longest, &[], 10)), Ok(()));
    let over = limits
        .check(&message(&format!("{longest}s"), &[], 10))
        .unwrap_err();
    assert_eq!(over.part, Part::Subject);
    assert_eq!(over.limit, Limit::ControlLine);
    assert_eq!((over.size, over.max), (4097, 4096));
    assert!(
        over.to_string().contains("max_control_line of 4096"),
        "{over}"
    );
    // The 5,000-character subject of the report.
    let report = message(&format!("outbox.l.{}", "k".repeat(5_000)), &[], 2);
    assert_eq!(limits.check(&report).unwrap_err().limit, Limit::ControlLine);
}

#[test]
fn headers_count_against_max_payload_and_jetstreams_header_limit_not_the_line() {
    let limits = nats_defaults();
    // A 5,000-byte header value is fine: the control line only carries its size.
    assert_eq!(
        limits.check(&message("a", &[("Note", &"n".repeat(5_000))], 2)),
        Ok(())
    );
    // A header block over 65,535 bytes, whatever the payload.
    let huge = "h".repeat(70_000);
    let over = limits.check(&message("a", &[("Note", &huge), ("K", "v")], 0));
    let over = over.unwrap_err();
    assert_eq!(over.part, Part::Header("Note".into()));
    assert_eq!(over.limit, Limit::HeaderBlock);
    assert!(over.to_string().contains("65535"), "{over}");
    // Headers plus payload over max_payload: the larger of the two is blamed.
    let small = MessageLimits {
        max_payload: 4_096,
        ..limits
    };
    let over = small.check(&message("a", &[("Note", &"n".repeat(5_000))], 2));
    assert_eq!(over.unwrap_err().part, Part::Header("Note".into()));
    let over = small.check(&message("a", &[], 5_000)).unwrap_err();
    assert_eq!((over.part, over.limit), (Part::Payload, Limit::MaxPayload));
    // Exactly max_payload fits.
    let exact = message("a", &[], 0);
    let room = 4_096 - small.header_block_len(&exact);
    assert_eq!(small.check(&message("a", &[], room)), Ok(()));
    assert!(small.check(&message("a", &[], room + 1)).is_err());
    assert_eq!(
        MessageLimits::NONE.check(&message(&huge, &[], 5_000_000)),
        Ok(())
    );
}

fn router() -> Router {
    let config: OutboxTableConfig = toml_like(
        "public.outbox",
        "outbox.{kind}.{sub}",
        &[("Note", "note"), ("Kind", "kind")],
    );
    let mut router = Router::new(&[config]).expect("valid mapping");
    let columns = ["id", "kind", "sub", "note", "payload"];
    let relation = Relation {
        id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|n| Column {
                flags: 0,
                name: (*n).into(),
                type_oid: 25,
                type_modifier: -1,
            })
            .collect(),
    };
    router
        .on_relation(relation, Some(Lsn(u64::MAX)))
        .expect("mapping fits");
    router
}

fn toml_like(table: &str, subject: &str, headers: &[(&str, &str)]) -> OutboxTableConfig {
    OutboxTableConfig {
        event_id: "id".into(),
        subject: subject.into(),
        payload: "payload".into(),
        headers: headers
            .iter()
            .map(|(h, c)| ((*h).to_owned(), (*c).to_owned()))
            .collect(),
        ..OutboxTableConfig::with_defaults(table)
    }
}

fn row(values: [&str; 5]) -> Insert {
    Insert {
        relation_id: 1,
        new: TupleData {
            values: values
                .iter()
                .map(|v| TupleValue::Text(Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
        },
    }
}

fn route(router: &Router, insert: &Insert) -> Result<Option<OutboundMessage>, RouteError> {
    let tx = TxContext::new(7, Lsn(0x100), 0);
    let msg = router.route_insert(insert, &tx, 0)?;
    router.check_limits(insert, msg, &nats_defaults())
}

#[test]
fn the_router_names_the_column_that_made_the_message_too_large() {
    let router = router();
    let long = "k".repeat(5_000);
    let fits = row(["ev-ok", "a", "b", "n", "{}"]);
    assert!(route(&router, &fits).expect("fits").is_some());

    // The longest of the subject's columns is blamed.
    let error = route(&router, &row(["ev-long", "a", &long, "n", "{}"])).unwrap_err();
    let text = error.to_string();
    for needle in [
        "ev-long",
        "public.outbox",
        "column `sub`",
        "subject",
        "max_control_line of 4096",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let huge = "h".repeat(70_000);
    let error = route(&router, &row(["ev-huge", "a", "b", &huge, "{}"])).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("column `note`") && text.contains("header `Note`"),
        "{text}"
    );
    let big = "p".repeat(1 << 20);
    let error = route(&router, &row(["ev-big", "a", "b", "n", &big])).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("column `payload`") && text.contains("max_payload"),
        "{text}"
    );
    // An oversized event id is blamed on its column and cut in the text.
    let long_id = "i".repeat(70_000);
    let error = route(&router, &row([&long_id, "a", "b", "n", "{}"])).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("column `id`") && text.len() < 1_000, "{text}");
}
