//! Framework-shaped tables through the router: `{levels:column}` subjects, `headers_json`
//! header objects, and `payload_pointer`/`headers_json_pointer` members of an envelope column
//! (CAP's `"Content"`: `{"Headers": {...}, "Value": ...}`).

use std::collections::BTreeMap;

use super::*;
use crate::route::{HeaderObjectError, MemberError};
use crate::subject::LevelsError;

const TEXT: u32 = 25;
const VARCHAR: u32 = 1043;
const TIMESTAMP: u32 = 1114;

/// CAP's `published` table (DotNetCore.CAP.PostgreSql), in schema `cap`.
fn cap_relation() -> Relation {
    relation(
        40,
        "cap",
        "published",
        &[
            ("Id", oid::INT8),
            ("Version", VARCHAR),
            ("Name", VARCHAR),
            ("Content", TEXT),
            ("Retries", oid::INT4),
            ("Added", TIMESTAMP),
            ("ExpiresAt", TIMESTAMP),
            ("StatusName", VARCHAR),
        ],
    )
}

fn cap_config() -> OutboxTableConfig {
    OutboxTableConfig {
        event_id: "Id".into(),
        subject: "cap.{levels:Name}".into(),
        payload: "Content".into(),
        payload_pointer: Some("/Value".into()),
        headers: BTreeMap::new(),
        headers_json: Some("Content".into()),
        headers_json_pointer: Some("/Headers".into()),
        ..OutboxTableConfig::with_defaults("cap.published")
    }
}

fn cap_router() -> Router {
    let mut router = Router::new(&[cap_config()]).unwrap();
    router.on_relation_live(cap_relation()).unwrap();
    router
}

fn cap_row(name: &str, content: Option<&str>) -> Insert {
    insert(
        40,
        &[
            Some("7"),
            Some("v1"),
            Some(name),
            content,
            Some("0"),
            Some("2026-11-29 11:38:44.123456"),
            None,
            Some("Scheduled"),
        ],
    )
}

const CAP_VALUE: &str = r#"{"orderId": 7, "price": 12.50, "qty": 1e3, "note": "caf\u00e9 ünï 😀 \"q\"", "lines": [{"sku": "a", "n": 1}]}"#;

fn cap_content(headers: &str, value: &str) -> String {
    format!(r#"{{"Headers": {headers}, "Value": {value}}}"#)
}

const CAP_HEADERS: &str = r#"{"cap-msg-id": "7", "cap-msg-name": "orders.created", "cap-msg-type": "OrderCreated", "cap-senttime": "2026-11-29 11:38:44 +00:00", "cap-corr-id": "7", "cap-corr-seq": "0", "cap-callback-name": null}"#;

#[test]
fn a_cap_envelope_routes_by_configuration_alone() {
    let router = cap_router();
    let content = cap_content(CAP_HEADERS, CAP_VALUE);
    let row = cap_row("orders.created", Some(&content));
    let msg = router.route_insert(&row, &tx(), 0).unwrap().unwrap();
    assert_eq!(msg.subject, "cap.orders.created");
    assert_eq!(msg.event_id, "7");
    assert_eq!(
        &msg.payload[..],
        CAP_VALUE.as_bytes(),
        "the member, byte-exact"
    );
    // Sliced from the row's value, not copied.
    let TupleValue::Text(column) = &row.new.values[3] else {
        unreachable!()
    };
    let start = msg.payload.as_ptr() as usize - column.as_ptr() as usize;
    assert!(start + msg.payload.len() <= column.len());
    assert_eq!(msg.header("cap-msg-id"), Some("7"));
    assert_eq!(msg.header("cap-msg-name"), Some("orders.created"));
    assert_eq!(msg.header("cap-msg-type"), Some("OrderCreated"));
    assert_eq!(
        msg.header("cap-senttime"),
        Some("2026-11-29 11:38:44 +00:00")
    );
    assert_eq!(msg.header("cap-callback-name"), None, "null is skipped");
    assert_eq!(msg.header("Outbox-Table"), Some("cap.published"));
    assert_eq!(msg.header("Nats-Msg-Id"), Some("7"));
    // The relay's own headers come first, the object's after them, in the object's order.
    let names: Vec<&str> = msg.headers.iter().map(|(n, _)| n.as_ref()).collect();
    assert_eq!(
        &names[5..],
        [
            "cap-msg-id",
            "cap-msg-name",
            "cap-msg-type",
            "cap-senttime",
            "cap-corr-id",
            "cap-corr-seq"
        ]
    );
}

#[test]
fn envelope_members_keep_the_producers_bytes() {
    let router = cap_router();
    for value in [
        r#""a string member is its JSON literal: caf\u00e9 \"q\"""#,
        "12.50",
        "1e3",
        "-0.0e-7",
        "null",
        "true",
        r#"[1, "ünï", {"x": {"y": []}}]"#,
        r#"{  "spaced" :  1 ,"tight":2}"#,
    ] {
        let content = cap_content("{}", value);
        let msg = router
            .route_insert(&cap_row("orders", Some(&content)), &tx(), 0)
            .unwrap()
            .unwrap();
        // A null member is no payload, as CAP's transports publish a null Value.
        let expected = if value == "null" { "" } else { value };
        assert_eq!(&msg.payload[..], expected.as_bytes(), "{value}");
    }
    let large = format!(
        r#"{{"blob": "{}", "n": 12.50}}"#,
        "ü\\u00e9".repeat(100_000)
    );
    let content = cap_content(CAP_HEADERS, &large);
    let msg = router
        .route_insert(&cap_row("orders", Some(&content)), &tx(), 0)
        .unwrap()
        .unwrap();
    assert_eq!(msg.payload.len(), large.len());
    assert_eq!(&msg.payload[..], large.as_bytes());
}

/// A bad row's error names the table, the column, the event id and the fix; it is a bad row
/// (dead letter or fail closed), never a table-shape error, and its dead letter is the raw row.
fn refused(router: &Router, row: &Insert) -> RouteError {
    let err = router.route_insert(row, &tx(), 0).unwrap_err();
    assert!(!err.is_schema_mismatch(), "{err}");
    let text = err.to_string();
    assert!(text.contains("event 7 in `cap.published`"), "{text}");
    let dead = router
        .dead_letter_row("outbox.dlq", row, &tx(), 0, &err)
        .expect("an outbox row");
    assert_eq!(dead.subject, "outbox.dlq");
    assert!(dead.header("Outbox-Dlq-Reason").is_some());
    err
}

#[test]
fn hostile_topics_are_bad_rows_never_other_subjects() {
    let router = cap_router();
    let content = cap_content(CAP_HEADERS, "1");
    let too_many = vec!["l"; 33].join(".");
    for (name, want) in [
        ("orders..created", LevelsError::EmptyLevel { level: 2 }),
        (".orders", LevelsError::EmptyLevel { level: 1 }),
        ("orders.", LevelsError::EmptyLevel { level: 2 }),
        (
            "orders.*",
            LevelsError::Wildcard {
                level: 2,
                text: "*".into(),
            },
        ),
        (
            "orders.>",
            LevelsError::Wildcard {
                level: 2,
                text: ">".into(),
            },
        ),
        (
            "orders created",
            LevelsError::Unprintable {
                level: 1,
                text: "orders created".into(),
            },
        ),
        (
            "orders.created\r\nPUB x",
            LevelsError::Unprintable {
                level: 2,
                text: "created\\r\\nPUB x".into(),
            },
        ),
        (too_many.as_str(), LevelsError::TooMany { max: 32 }),
    ] {
        let err = refused(&router, &cap_row(name, Some(&content)));
        let text = err.to_string();
        assert_eq!(
            err,
            RouteError::InvalidSubjectLevels {
                table: "cap.published".into(),
                event_id: "7".into(),
                column: "Name".into(),
                reason: want,
            },
            "{name:?}"
        );
        assert!(text.contains("subject column `Name`"), "{text}");
        assert!(text.contains("Fix the value"), "{text}");
        assert!(text.contains("{Name}"), "{text}");
    }
    // `$` and non-ASCII stay inside their level, escaped by the token rule.
    let msg = router
        .route_insert(&cap_row("$JS.API.caf\u{e9}", Some(&content)), &tx(), 0)
        .unwrap()
        .unwrap();
    assert_eq!(msg.subject, "cap.%24JS.API.caf%C3%A9");
    let empty = router
        .route_insert(&cap_row("", Some(&content)), &tx(), 0)
        .unwrap_err();
    assert!(
        matches!(empty, RouteError::EmptySubjectValue { .. }),
        "{empty}"
    );
}

#[test]
fn hostile_envelopes_are_bad_rows_naming_column_and_fix() {
    let router = cap_router();
    let missing = |reason: MemberError| RouteError::MissingMember {
        table: "cap.published".into(),
        event_id: "7".into(),
        column: "Content".into(),
        key: "payload_pointer",
        pointer: "/Value".into(),
        reason: Box::new(reason),
    };
    let err = refused(
        &router,
        &cap_row("orders", Some(&format!(r#"{{"Headers": {CAP_HEADERS}}}"#))),
    );
    assert_eq!(
        err,
        missing(MemberError::Missing {
            member: "/Value".into()
        })
    );
    let text = err.to_string();
    assert!(text.contains("column `Content`"), "{text}");
    assert!(text.contains("member `/Value` is missing"), "{text}");
    assert!(text.contains("fix `payload_pointer`"), "{text}");
    assert_eq!(
        refused(&router, &cap_row("orders", None)),
        missing(MemberError::Null)
    );
    let not_json = refused(&router, &cap_row("orders", Some("{\"Value\": ")));
    assert!(
        matches!(&not_json, RouteError::MissingMember { reason, .. } if matches!(**reason, MemberError::NotJson(_))),
        "{not_json}"
    );
    let twice = refused(
        &router,
        &cap_row("orders", Some(r#"{"Headers": {}, "Value": 1, "Value": 2}"#)),
    );
    assert!(twice.to_string().contains("appears twice"), "{twice}");

    let header_object = |reason: HeaderObjectError| RouteError::InvalidHeaderObject {
        table: "cap.published".into(),
        event_id: "7".into(),
        column: "Content".into(),
        reason,
    };
    for (headers, want) in [
        (
            r#"{"Nats-Msg-Id": "forged"}"#,
            HeaderObjectError::Owned("Nats-Msg-Id".into()),
        ),
        (
            r#"{"Nats-Expected-Stream": "OTHER"}"#,
            HeaderObjectError::Owned("Nats-Expected-Stream".into()),
        ),
        (
            r#"{"Nats-Batch-Commit": "1"}"#,
            HeaderObjectError::Owned("Nats-Batch-Commit".into()),
        ),
        (
            r#"{"outbox-commit-lsn": "0/0"}"#,
            HeaderObjectError::Owned("outbox-commit-lsn".into()),
        ),
        (
            r#"{"cap:name": "x"}"#,
            HeaderObjectError::Name("cap:name".into()),
        ),
        (
            r#"{"cap-msg-name": "x\r\nNats-Msg-Id: forged"}"#,
            HeaderObjectError::ControlCharacter("cap-msg-name".into()),
        ),
    ] {
        let content = cap_content(headers, "1");
        let err = refused(&router, &cap_row("orders", Some(&content)));
        assert_eq!(err, header_object(want), "{headers}");
        assert!(
            err.to_string()
                .contains("column `Content` (mapped as headers_json)")
        );
    }
    let owned = refused(
        &router,
        &cap_row("orders", Some(&cap_content(r#"{"Nats-Msg-Id": "x"}"#, "1"))),
    );
    assert!(owned.to_string().contains("never copied"), "{owned}");
    let not_object = refused(
        &router,
        &cap_row("orders", Some(&cap_content(r#"["a"]"#, "1"))),
    );
    assert!(
        matches!(
            &not_object,
            RouteError::InvalidHeaderObject {
                reason: HeaderObjectError::NotObject(_),
                ..
            }
        ),
        "{not_object}"
    );
    let no_headers = refused(&router, &cap_row("orders", Some(r#"{"Value": 1}"#)));
    assert!(
        no_headers
            .to_string()
            .contains("member `/Headers` is missing")
            && no_headers.to_string().contains("headers_json_pointer"),
        "{no_headers}"
    );
    // `"Headers": null` is no headers.
    let msg = router
        .route_insert(
            &cap_row("orders", Some(r#"{"Headers": null, "Value": 1}"#)),
            &tx(),
            0,
        )
        .unwrap()
        .unwrap();
    assert_eq!(msg.headers.len(), 5, "only the relay's own");
}

#[test]
fn new_keys_are_checked_at_start() {
    let cases = [
        (
            OutboxTableConfig {
                headers_json_pointer: Some("/Headers".into()),
                ..cap_config()
            },
            None,
        ),
        (
            OutboxTableConfig {
                headers_json: None,
                ..cap_config()
            },
            Some("`headers_json_pointer` needs `headers_json`"),
        ),
        (
            OutboxTableConfig {
                payload: PAYLOAD_WHOLE_ROW.into(),
                ..cap_config()
            },
            Some("`payload_pointer` needs a payload column"),
        ),
        (
            OutboxTableConfig {
                payload_pointer: Some("Value".into()),
                ..cap_config()
            },
            Some("`payload_pointer`: `Value` is not a JSON Pointer"),
        ),
        (
            OutboxTableConfig {
                headers_json_pointer: Some("/a~2".into()),
                ..cap_config()
            },
            Some("`headers_json_pointer`: JSON Pointer `/a~2`"),
        ),
        (
            OutboxTableConfig {
                headers_json: Some(String::new()),
                headers_json_pointer: None,
                ..cap_config()
            },
            Some("`headers_json` must name a column"),
        ),
    ];
    for (config, want) in cases {
        match (config.validate(), want) {
            (Ok(_), None) => {}
            (Err(e), Some(want)) => {
                let text = e.to_string();
                assert!(text.contains(want), "{text}");
                assert!(text.contains("outbox table `cap.published`"), "{text}");
            }
            (got, want) => panic!("{got:?}, wanted {want:?}"),
        }
    }
    let split = OutboxTableConfig {
        subject: "cap.x{levels:Name}".into(),
        ..cap_config()
    };
    assert!(matches!(
        split.validate(),
        Err(ConfigError::Subject {
            source: crate::subject::TemplateError::LevelsNotWholeTokens { .. },
            ..
        })
    ));
    let mut router = Router::new(&[cap_config()]).unwrap();
    let mut rel = cap_relation();
    rel.columns.retain(|c| c.name != "Content");
    let err = router.on_relation_live(rel).unwrap_err();
    assert!(err.to_string().contains("no column `Content`"), "{err}");
}

#[test]
fn oversized_members_and_levels_are_blamed_on_their_column() {
    let router = cap_router();
    let limits = MessageLimits {
        max_payload: 1 << 20,
        max_control_line: MessageLimits::DEFAULT_MAX_CONTROL_LINE,
        max_header_block: MessageLimits::JETSTREAM_MAX_HEADER_BYTES,
        reply_len: 52,
        extra_header_bytes: 30,
    };
    let big_header = format!(r#"{{"Big": "{}"}}"#, "h".repeat(70_000));
    // Past JetStream's header limit on its own: refused while the members are read.
    let row = cap_row("orders", Some(&cap_content(&big_header, "1")));
    let err = router.route_insert(&row, &tx(), 0).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("column `Content`"), "{text}");
    assert!(
        text.contains("member `Big` brings the header lines past"),
        "{text}"
    );
    // Within it, but over what this server allows: the size check names the member.
    let big_header = format!(r#"{{"Big": "{}"}}"#, "h".repeat(60_000));
    let limits = MessageLimits {
        max_header_block: 50_000,
        ..limits
    };
    let row = cap_row("orders", Some(&cap_content(&big_header, "1")));
    let msg = router.route_insert(&row, &tx(), 0).unwrap();
    let err = router.check_limits(&row, msg, &limits).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("column `Content` (member `Big` of headers_json)"),
        "{text}"
    );
    assert!(text.contains("header `Big`"), "{text}");
    let long_topic = vec!["level"; 30].join(".") + &"y".repeat(4_000);
    let row = cap_row(&long_topic, Some(&cap_content("{}", "1")));
    let msg = router.route_insert(&row, &tx(), 0).unwrap();
    let err = router.check_limits(&row, msg, &limits).unwrap_err();
    assert!(
        err.to_string()
            .contains("column `Name` makes the subject too large"),
        "{err}"
    );
}
