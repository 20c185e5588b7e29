use super::*;
use crate::route::OutboxTableConfig;

fn router(configs: &[MessageRouteConfig]) -> Router {
    Router::new(&[OutboxTableConfig::with_defaults("public.outbox")])
        .unwrap()
        .with_messages(configs)
        .unwrap()
}

fn message(prefix: &str, content: &str) -> Message {
    Message {
        transactional: true,
        lsn: Lsn(0x1_0000_0042),
        prefix: prefix.into(),
        content: Bytes::copy_from_slice(content.as_bytes()),
    }
}

fn tx() -> TxContext {
    TxContext::new(771, Lsn(0x1_0000_0100), 0)
}

fn route(r: &Router, m: &Message) -> Result<Option<OutboundMessage>, RouteError> {
    r.route_message(m, &tx(), 3, &MessageLimits::NONE)
}

fn problem(r: &Router, content: &str) -> String {
    match route(r, &message("outbox", content)) {
        Err(e @ RouteError::Message { .. }) => e.to_string(),
        other => panic!("expected a refusal for {content}, got {other:?}"),
    }
}

#[test]
fn an_envelope_becomes_a_message_with_the_transactions_headers() {
    let r = router(&[MessageRouteConfig::with_defaults("outbox")]);
    let m = message(
        "outbox",
        r#"{"id": "ev-1", "subject": "outbox.order.created", "headers": {"Outbox-Event-Type": "created", "traceparent": "00-ab-cd-01"}, "payload": {"order": 7,  "items": [1, 2]}}"#,
    );
    let msg = route(&r, &m).unwrap().expect("configured prefix");
    assert_eq!(msg.event_id, "ev-1");
    assert_eq!(msg.subject, "outbox.order.created");
    // Byte-exact, as written in the content.
    assert_eq!(&msg.payload[..], br#"{"order": 7,  "items": [1, 2]}"#);
    assert_eq!(msg.header("Nats-Msg-Id"), Some("ev-1"));
    assert_eq!(msg.header("Outbox-Commit-Lsn"), Some("1/100"));
    assert_eq!(msg.header("Outbox-Xid"), Some("771"));
    assert_eq!(
        msg.header("Outbox-Commit-Time"),
        Some("2000-01-01T00:00:00.000000Z")
    );
    assert_eq!(msg.header("Outbox-Message-Prefix"), Some("outbox"));
    assert_eq!(msg.header("Outbox-Tx-Index"), Some("3"));
    assert_eq!(msg.header("Outbox-Table"), None);
    assert_eq!(msg.header("Outbox-Event-Type"), Some("created"));
    assert_eq!(msg.header("traceparent"), Some("00-ab-cd-01"));
    assert_eq!(msg.commit_lsn, Lsn(0x1_0000_0100));
    assert_eq!(&*msg.table, "message:outbox");
}

#[test]
fn payload_forms_and_ids() {
    let r = router(&[MessageRouteConfig::with_defaults("outbox")]);
    let body = |content: &str| route(&r, &message("outbox", content)).unwrap().unwrap();
    let m = body(r#"{"id": "a", "subject": "outbox.a", "payload": "plain \u00e9 text"}"#);
    assert_eq!(&m.payload[..], "plain é text".as_bytes());
    let m = body(r#"{"id": 42, "subject": "outbox.a", "payload": null}"#);
    assert_eq!((m.event_id.as_str(), &m.payload[..]), ("42", &b""[..]));
    let m = body(r#"{"subject": "outbox.a", "id": "b"}"#);
    assert!(m.payload.is_empty());
    let m = body(r#"{"id": "c", "subject": "outbox.a", "payload": [1,2.5e3,true]}"#);
    assert_eq!(&m.payload[..], b"[1,2.5e3,true]");
}

#[test]
fn unconfigured_prefixes_are_not_ours() {
    let r = router(&[MessageRouteConfig::with_defaults("outbox")]);
    assert_eq!(r.message_policy("other"), MessagePolicy::Unconfigured);
    assert_eq!(r.message_policy("outbox"), MessagePolicy::TransactionalOnly);
    assert_eq!(route(&r, &message("other", "not json")).unwrap(), None);
    let none = Router::new(&[]).unwrap();
    assert_eq!(none.message_policy("outbox"), MessagePolicy::Unconfigured);
}

#[test]
fn bad_envelopes_are_refused_naming_prefix_lsn_and_problem() {
    let r = router(&[MessageRouteConfig::with_defaults("outbox")]);
    for (content, needle) in [
        ("not json", "not a JSON object"),
        ("[1, 2]", "not a JSON object"),
        (r#"{"subject": "outbox.a"}"#, "no `id`"),
        (r#"{"id": "", "subject": "outbox.a"}"#, "`id` is empty"),
        (
            r#"{"id": 1.5, "subject": "outbox.a"}"#,
            "non-empty string or an integer",
        ),
        (
            r#"{"id": "a\nb", "subject": "outbox.a"}"#,
            "control character",
        ),
        (
            r#"{"id": "x", "id": "y", "subject": "outbox.a"}"#,
            "appears twice",
        ),
        (r#"{"id": "x"}"#, "no `subject`"),
        (r#"{"id": "x", "subject": 7}"#, "`subject` is not a string"),
        (r#"{"id": "x", "subject": "outbox..a"}"#, "empty token"),
        (r#"{"id": "x", "subject": "outbox.*"}"#, "wildcard"),
        (r#"{"id": "x", "subject": "outbox.a b"}"#, "whitespace"),
        (
            r#"{"id": "x", "subject": "$JS.API.STREAM.DELETE.OUTBOX"}"#,
            "starts with `$`",
        ),
        (
            r#"{"id": "x", "subject": "orders.a"}"#,
            "matches none of `subjects`",
        ),
        (
            r#"{"id": "x", "subject": "outbox.a", "headers": []}"#,
            "`headers`",
        ),
        (
            r#"{"id": "x", "subject": "outbox.a", "headers": {"Nats-Msg-Id": "y"}}"#,
            "sets itself",
        ),
        (
            r#"{"id": "x", "subject": "outbox.a", "headers": {"outbox-tx-index": "9"}}"#,
            "sets itself",
        ),
        (
            r#"{"id": "x", "subject": "outbox.a", "headers": {"A": "1", "A": "2"}}"#,
            "appears twice",
        ),
        (
            r#"{"id": "x", "subject": "outbox.a", "headers": {"A": "1\r\nB: 2"}}"#,
            "control character",
        ),
        (
            r#"{"id": "x", "subject": "outbox.a", "headers": {"A B": "1"}}"#,
            "is not a NATS header name",
        ),
    ] {
        let text = problem(&r, content);
        assert!(text.contains(needle), "{content}: {text}");
        assert!(text.contains("prefix `outbox`"), "{text}");
        assert!(text.contains("LSN 1/42"), "{text}");
    }
    let mut m = message("outbox", "");
    m.content = Bytes::from_static(b"\xff\xfe");
    let text = route(&r, &m).unwrap_err().to_string();
    assert!(text.contains("not UTF-8"), "{text}");
}

/// The envelope's `headers` follow the same rule as a table's `headers_json` (one
/// implementation): numbers and booleans as their JSON text, `null` skipped, nested values as
/// their JSON text as written.
#[test]
fn envelope_headers_take_the_header_object_rule() {
    let r = router(&[MessageRouteConfig::with_defaults("outbox")]);
    let m = message(
        "outbox",
        r#"{"id": "h", "subject": "outbox.a", "headers": {"N": 12.50, "B": false, "Z": null, "O": {"k": [1, "\u00e9"]}, "S": "caf\u00e9"}}"#,
    );
    let msg = route(&r, &m).unwrap().unwrap();
    assert_eq!(msg.header("N"), Some("12.50"));
    assert_eq!(msg.header("B"), Some("false"));
    assert_eq!(msg.header("Z"), None);
    assert_eq!(msg.header("O"), Some(r#"{"k":[1,"\u00e9"]}"#));
    assert_eq!(msg.header("S"), Some("café"));
}

#[test]
fn a_template_fills_tokens_from_envelope_fields() {
    let config = MessageRouteConfig {
        subject: Some("outbox.{aggregate}.{type}".into()),
        ..MessageRouteConfig::with_defaults("events")
    };
    let r = router(&[config]);
    let m = message(
        "events",
        r#"{"id": "e", "aggregate": "order.line", "type": 7, "subject": "ignored.x"}"#,
    );
    let msg = route(&r, &m).unwrap().unwrap();
    assert_eq!(msg.subject, "outbox.order%2Eline.7");
    for (content, needle) in [
        (r#"{"id": "e", "type": "x"}"#, "no field `aggregate`"),
        (
            r#"{"id": "e", "aggregate": "", "type": "x"}"#,
            "not a non-empty string",
        ),
        (
            r#"{"id": "e", "aggregate": {"a": 1}, "type": "x"}"#,
            "not a non-empty string",
        ),
    ] {
        let err = route(&r, &message("events", content))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{content}: {err}");
    }
}

#[test]
fn a_levels_placeholder_keeps_an_envelope_fields_dots() {
    let config = MessageRouteConfig {
        subject: Some("outbox.{levels:topic}".into()),
        ..MessageRouteConfig::with_defaults("events")
    };
    let r = router(&[config]);
    let m = message("events", r#"{"id": "e", "topic": "orders.created"}"#);
    assert_eq!(
        route(&r, &m).unwrap().unwrap().subject,
        "outbox.orders.created"
    );
    for (content, needle) in [
        (
            r#"{"id": "e", "topic": "orders..created"}"#,
            "level 2 is empty",
        ),
        (r#"{"id": "e", "topic": "orders.*"}"#, "wildcard"),
        (r#"{"id": "e", "topic": "orders.a b"}"#, "whitespace"),
    ] {
        let err = route(&r, &message("events", content))
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{content}: {err}");
        assert!(err.contains("{levels:topic}"), "{content}: {err}");
    }
}

#[test]
fn non_transactional_messages_are_refused_unless_allowed() {
    let mut m = message("outbox", r#"{"id": "n", "subject": "outbox.n"}"#);
    m.transactional = false;
    let r = router(&[MessageRouteConfig::with_defaults("outbox")]);
    let err = route(&r, &m).unwrap_err().to_string();
    assert!(err.contains("non-transactional"), "{err}");
    assert!(err.contains("allow_non_transactional"), "{err}");
    let allowed = MessageRouteConfig {
        allow_non_transactional: true,
        ..MessageRouteConfig::with_defaults("outbox")
    };
    let r = router(&[allowed]);
    assert_eq!(r.message_policy("outbox"), MessagePolicy::AnyMessage);
    let context = non_transactional_context(&m);
    assert_eq!((context.xid, context.commit_lsn), (0, m.lsn));
    let msg = r
        .route_message(&m, &context, 0, &MessageLimits::NONE)
        .unwrap()
        .unwrap();
    assert_eq!(msg.header("Outbox-Xid"), Some("0"));
    assert_eq!(msg.header("Outbox-Commit-Lsn"), Some("1/42"));
    // The message's LSN is the end of its record: confirmed as it is, never past it.
    assert_eq!(non_transactional_end(m.lsn), Lsn(0x1_0000_0042));
}

#[test]
fn too_large_is_a_refusal_and_a_dead_letter_carries_the_raw_content() {
    let r = router(&[MessageRouteConfig::with_defaults("outbox")]);
    let content = format!(
        r#"{{"id": "big", "subject": "outbox.a", "payload": "{}"}}"#,
        "x".repeat(2000)
    );
    let m = message("outbox", &content);
    let limits = MessageLimits {
        max_payload: 1024,
        ..MessageLimits::NONE
    };
    let err = r.route_message(&m, &tx(), 0, &limits).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("event big: the payload is too large"),
        "{text}"
    );
    assert_eq!(r.message_event_id(&m).as_deref(), Some("big"));
    let dead = r
        .dead_letter_message("outbox.dlq", &m, &tx(), 0, &err)
        .unwrap();
    assert_eq!(dead.event_id, "dlq:message:outbox:1/42");
    assert_eq!(dead.subject, "outbox.dlq");
    assert_eq!(dead.payload, m.content);
    assert_eq!(dead.header("Outbox-Message-Prefix"), Some("outbox"));
    assert!(
        dead.header("Outbox-Dlq-Reason")
            .unwrap()
            .contains("too large")
    );
}

#[test]
fn configuration_is_checked() {
    let ok = MessageRouteConfig::with_defaults("outbox");
    assert_eq!(ok.sample_subjects(), ["outbox.x"]);
    let refuse = |c: MessageRouteConfig| {
        Router::new(&[])
            .unwrap()
            .with_messages(&[c])
            .unwrap_err()
            .to_string()
    };
    assert!(refuse(MessageRouteConfig::with_defaults("")).contains("non-empty"));
    let twice = Router::new(&[])
        .unwrap()
        .with_messages(&[ok.clone(), ok.clone()])
        .unwrap_err();
    assert_eq!(twice, MessageConfigError::Duplicate("outbox".into()));
    for filter in ["", "a..b", "a.>.b", "$SYS.>", "a.b*", "a b"] {
        let c = MessageRouteConfig {
            subjects: vec![filter.into()],
            ..ok.clone()
        };
        assert!(refuse(c).contains("is not a subject filter"), "{filter}");
    }
    let c = MessageRouteConfig {
        subjects: vec![],
        ..ok.clone()
    };
    assert!(refuse(c).contains("at least one"));
    let c = MessageRouteConfig {
        subject: Some("orders.{type}".into()),
        ..ok.clone()
    };
    assert!(refuse(c).contains("outside `subjects`"));
    let c = MessageRouteConfig {
        subject: Some("outbox.{type".into()),
        ..ok.clone()
    };
    assert!(refuse(c).contains("bad subject template"));
    let c = MessageRouteConfig {
        subjects: vec!["outbox.*.created".into(), "audit.>".into()],
        ..ok.clone()
    };
    assert_eq!(c.sample_subjects(), ["outbox.x.created", "audit.x"]);
    let c = MessageRouteConfig {
        subject: Some("outbox.{a}.{b}".into()),
        ..ok
    };
    assert_eq!(c.sample_subjects(), ["outbox.x.x"]);
}

#[test]
fn an_envelope_of_100000_keys_with_one_repeated_is_refused_within_a_second() {
    // About 1.3 MB: distinct keys, then one of the early ones again, past the names the check
    // compares one by one (a scan per key would cost billions of comparisons here).
    let keys: Vec<String> = (0..100_000).map(|i| format!("\"k{i}\": 0")).collect();
    let content = format!(
        r#"{{"id": "x", "subject": "outbox.a", {}, "k3": 1}}"#,
        keys.join(", ")
    );
    let started = std::time::Instant::now();
    let refused = problem(
        &router(&[MessageRouteConfig::with_defaults("outbox")]),
        &content,
    );
    assert!(refused.contains("`k3` appears twice"), "{refused}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}
