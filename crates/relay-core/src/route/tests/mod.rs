use super::*;
use bytes::Bytes;
use pgoutput::{Column, Lsn, TupleData, TupleValue};

use crate::value::oid;

fn relation(id: Oid, schema: &str, name: &str, columns: &[(&str, u32)]) -> Relation {
    Relation {
        id,
        namespace: schema.into(),
        name: name.into(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|(n, t)| Column {
                flags: 0,
                name: (*n).into(),
                type_oid: *t,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn insert(relation_id: Oid, values: &[Option<&str>]) -> Insert {
    Insert {
        relation_id,
        new: TupleData {
            values: values
                .iter()
                .map(|v| match v {
                    None => TupleValue::Null,
                    Some(s) => TupleValue::Text(Bytes::copy_from_slice(s.as_bytes())),
                })
                .collect(),
        },
    }
}

fn debezium_relation(id: Oid) -> Relation {
    relation(
        id,
        "public",
        "outbox",
        &[
            ("id", 2950),
            ("aggregatetype", 1043),
            ("aggregateid", 1043),
            ("type", 1043),
            ("payload", oid::JSONB),
            ("tracingspancontext", 1043),
        ],
    )
}

impl Router {
    /// A Relation message of a transaction after the start-up catalog read.
    fn on_relation_live(&mut self, relation: Relation) -> Result<(), RouteError> {
        self.on_relation(relation, Some(Lsn(u64::MAX)))
    }
}

fn tx() -> TxContext {
    TxContext::new(731, Lsn(0x16B3748), 0)
}

#[test]
fn default_mapping_routes_a_debezium_outbox_row() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(16384)).unwrap();
    let payload = r#"{"orderId": 7, "note": "ünïcødé 😀"}"#;
    let row = insert(
        16384,
        &[
            Some("8a1f4c2e-0000-4000-8000-000000000001"),
            Some("Order"),
            Some("7"),
            Some("OrderCreated"),
            Some(payload),
            Some("traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n"),
        ],
    );
    let msg = router.route_insert(&row, &tx(), 3).unwrap().unwrap();
    assert_eq!(msg.subject, "outbox.Order.OrderCreated");
    assert_eq!(msg.event_id, "8a1f4c2e-0000-4000-8000-000000000001");
    assert_eq!(
        msg.payload,
        Bytes::from(payload),
        "payload is forwarded byte-exact"
    );
    assert_eq!(
        msg.header("Nats-Msg-Id"),
        Some("8a1f4c2e-0000-4000-8000-000000000001")
    );
    assert_eq!(msg.header("Outbox-Commit-Lsn"), Some("0/16B3748"));
    assert_eq!(msg.header("Outbox-Xid"), Some("731"));
    assert_eq!(
        msg.header("Outbox-Commit-Time"),
        Some("2000-01-01T00:00:00.000000Z")
    );
    assert_eq!(msg.header("Outbox-Table"), Some("public.outbox"));
    assert_eq!(msg.header("Outbox-Tx-Index"), Some("3"));
    assert_eq!(msg.header("Outbox-Aggregate-Type"), Some("Order"));
    assert_eq!(msg.header("Outbox-Aggregate-Id"), Some("7"));
    assert_eq!(msg.header("Outbox-Event-Type"), Some("OrderCreated"));
    assert_eq!(
        msg.header("traceparent"),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
}

#[test]
fn optional_header_column_may_be_absent_and_null_headers_are_omitted() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("outbox")]).unwrap();
    let mut rel = debezium_relation(1);
    rel.columns.pop(); // no tracingspancontext column at all
    router.on_relation_live(rel).unwrap();
    let row = insert(1, &[Some("e1"), Some("A"), None, Some("T"), Some("{}")]);
    let msg = router.route_insert(&row, &tx(), 0).unwrap().unwrap();
    assert_eq!(msg.header("traceparent"), None);
    assert_eq!(msg.header("Outbox-Aggregate-Id"), None);
}

#[test]
fn other_tables_are_ignored_and_unknown_relations_are_errors() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router
        .on_relation_live(relation(2, "public", "orders", &[("id", oid::INT8)]))
        .unwrap();
    router
        .on_relation_live(debezium_relation(3).clone())
        .unwrap();
    let mut other_schema = debezium_relation(4);
    other_schema.namespace = "audit".into();
    router.on_relation_live(other_schema).unwrap();
    assert!(
        router
            .route_insert(&insert(2, &[Some("1")]), &tx(), 0)
            .unwrap()
            .is_none()
    );
    let six = [Some("e"), Some("a"), Some("b"), Some("c"), Some("{}"), None];
    assert!(
        router
            .route_insert(&insert(4, &six), &tx(), 0)
            .unwrap()
            .is_none()
    );
    assert!(router.is_outbox(3));
    assert_eq!(
        router.route_insert(&insert(99, &[]), &tx(), 0),
        Err(RouteError::UnknownRelation(99))
    );
}

#[test]
fn notification_outbox_works_by_configuration_alone() {
    let config = OutboxTableConfig {
        table: "public.notification_outbox".into(),
        event_id: "id".into(),
        subject: "notifications.{tenant_id}.{event_type}".into(),
        payload: PAYLOAD_WHOLE_ROW.into(),
        headers: [("Tenant-Id".to_owned(), "tenant_id".to_owned())].into(),
        payload_format: PayloadFormat::Raw,
        ttl_column: None,
        schedule_column: None,
        schedule_subject: None,
        cloudevents: None,
        headers_json: None,
        headers_json_pointer: None,
        payload_pointer: None,
        row_filter: None,
        contracts: None,
    };
    let mut router = Router::new(&[config]).unwrap();
    router
        .on_relation_live(relation(
            7,
            "public",
            "notification_outbox",
            &[
                ("id", oid::INT8),
                ("request_id", oid::INT8),
                ("tenant_id", 1043),
                ("order_id", oid::INT8),
                ("event_type", 1043),
                ("status", 1043),
                ("attempts", oid::INT4),
                ("published_at", 1184),
            ],
        ))
        .unwrap();
    let row = insert(
        7,
        &[
            Some("42"),
            Some("1001"),
            Some("acme.eu"),
            Some("555"),
            Some("ORDER_PLACED"),
            Some("PENDING"),
            Some("0"),
            None,
        ],
    );
    let msg = router.route_insert(&row, &tx(), 0).unwrap().unwrap();
    assert_eq!(msg.subject, "notifications.acme%2Eeu.ORDER_PLACED");
    assert_eq!(msg.event_id, "42");
    assert_eq!(msg.header("Tenant-Id"), Some("acme.eu"));
    let body: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(body["id"], 42);
    assert_eq!(body["request_id"], 1001);
    assert_eq!(body["tenant_id"], "acme.eu");
    assert_eq!(body["status"], "PENDING");
    assert_eq!(body["attempts"], 0);
    assert!(body["published_at"].is_null());
}

#[test]
fn bytea_payload_is_decoded() {
    let mut config = OutboxTableConfig::with_defaults("public.blobs");
    config.subject = "blobs.{kind}".into();
    config.headers.clear();
    let mut router = Router::new(&[config]).unwrap();
    router
        .on_relation_live(relation(
            5,
            "public",
            "blobs",
            &[("id", oid::INT8), ("kind", 25), ("payload", oid::BYTEA)],
        ))
        .unwrap();
    let msg = router
        .route_insert(
            &insert(5, &[Some("1"), Some("k"), Some("\\x00ff0a")]),
            &tx(),
            0,
        )
        .unwrap()
        .unwrap();
    assert_eq!(msg.payload, Bytes::from_static(&[0, 255, 10]));
}

#[test]
fn bad_rows_fail_closed_with_the_reason() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(1)).unwrap();
    let route = |vals: &[Option<&str>]| router.route_insert(&insert(1, vals), &tx(), 0);
    assert!(matches!(
        route(&[None, Some("A"), Some("1"), Some("T"), Some("{}"), None]),
        Err(RouteError::MissingEventId { .. })
    ));
    assert!(matches!(
        route(&[Some(""), Some("A"), Some("1"), Some("T"), Some("{}"), None]),
        Err(RouteError::MissingEventId { .. })
    ));
    assert!(matches!(
        route(&[Some("e"), Some(""), Some("1"), Some("T"), Some("{}"), None]),
        Err(RouteError::EmptySubjectValue { ref column, .. }) if column == "aggregatetype"
    ));
    assert!(matches!(
        route(&[Some("e"), Some("A"), Some("1"), None, Some("{}"), None]),
        Err(RouteError::EmptySubjectValue { ref column, .. }) if column == "type"
    ));
    assert!(matches!(
        route(&[Some("e"), Some("A"), Some("1\r\nX-Evil: 1"), Some("T"), Some("{}"), None]),
        Err(RouteError::InvalidHeaderValue { ref header, .. }) if header == "Outbox-Aggregate-Id"
    ));
    assert!(matches!(
        route(&[Some("e"), Some("A")]),
        Err(RouteError::ColumnCount {
            got: 2,
            expected: 6,
            ..
        })
    ));
}

#[test]
fn subject_values_never_escape_their_token() {
    let mut config = OutboxTableConfig::with_defaults("public.outbox");
    config.headers.clear(); // a tab is fine in a subject token (escaped), not in a header
    let mut router = Router::new(&[config]).unwrap();
    router.on_relation_live(debezium_relation(1)).unwrap();
    for hostile in [
        "a.b",
        "*",
        ">",
        "a b",
        "a\tb",
        "$JS.API.STREAM.DELETE.X",
        "😀",
        "עברית",
    ] {
        let row = insert(
            1,
            &[
                Some("e"),
                Some(hostile),
                Some("1"),
                Some("T"),
                Some("{}"),
                None,
            ],
        );
        let msg = router.route_insert(&row, &tx(), 0).unwrap().unwrap();
        let tokens: Vec<&str> = msg.subject.split('.').collect();
        assert_eq!(tokens.len(), 3, "{hostile} -> {}", msg.subject);
        assert_eq!(tokens[0], "outbox");
        assert!(
            !msg.subject.contains(['*', '>', ' ', '\t']),
            "{}",
            msg.subject
        );
    }
}

#[test]
fn drifted_schema_names_the_missing_column() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    let mut rel = debezium_relation(1);
    rel.columns[3].name = "event_type".into(); // `type` gone (first sight: cannot tell a rename)
    let err = router.on_relation_live(rel).unwrap_err();
    assert!(
        matches!(err, RouteError::MissingColumn { ref column, role: "subject", .. } if column == "type"),
        "{err}"
    );
    assert!(err.is_schema_mismatch());
    let row = insert(
        1,
        &[Some("e"), Some("A"), Some("1"), Some("T"), Some("{}"), None],
    );
    assert!(matches!(
        router.route_insert(&row, &tx(), 0),
        Err(RouteError::MissingColumn { ref column, role: "subject", .. }) if column == "type"
    ));
    // A later Relation message (after the DDL is fixed) heals the route.
    router.on_relation_live(debezium_relation(1)).unwrap();
    assert!(router.route_insert(&row, &tx(), 0).unwrap().is_some());
}

#[test]
fn config_validation_names_the_problem() {
    let mut c = OutboxTableConfig::with_defaults("public.outbox");
    c.subject = "outbox..{type}".into();
    assert!(matches!(
        Router::new(&[c]),
        Err(ConfigError::Subject { .. })
    ));
    let mut c = OutboxTableConfig::with_defaults("public.outbox");
    c.headers.insert("Nats-Msg-Id".into(), "id".into());
    assert!(matches!(
        Router::new(&[c]),
        Err(ConfigError::ReservedHeader(_))
    ));
    let mut c = OutboxTableConfig::with_defaults("public.outbox");
    c.headers.insert("outbox-backfill".into(), "type".into());
    assert!(matches!(
        Router::new(&[c]),
        Err(ConfigError::ReservedHeader(_))
    ));
    let c = OutboxTableConfig::with_defaults("outbox");
    let d = OutboxTableConfig::with_defaults("public.outbox");
    assert!(matches!(
        Router::new(&[c, d]),
        Err(ConfigError::DuplicateTable(_))
    ));
    assert!(matches!(
        Router::new(&[OutboxTableConfig::with_defaults("a.b.c")]),
        Err(ConfigError::TableName(_))
    ));
}

#[test]
fn json_payload_format_refuses_invalid_json_and_utf8() {
    let mut config = OutboxTableConfig::with_defaults("public.outbox");
    config.payload_format = PayloadFormat::Json;
    let mut router = Router::new(&[config]).unwrap();
    let mut rel = debezium_relation(1);
    rel.columns[4].type_oid = 25; // text payload
    router.on_relation_live(rel).unwrap();
    let ok = insert(
        1,
        &[
            Some("e1"),
            Some("A"),
            Some("1"),
            Some("T"),
            Some(r#"{"a":"😀"}"#),
            None,
        ],
    );
    assert!(router.route_insert(&ok, &tx(), 0).unwrap().is_some());
    let bad = insert(
        1,
        &[
            Some("e2"),
            Some("A"),
            Some("1"),
            Some("T"),
            Some("{not json"),
            None,
        ],
    );
    let err = router.route_insert(&bad, &tx(), 0).unwrap_err();
    assert!(
        matches!(err, RouteError::InvalidPayload { ref event_id, .. } if event_id == "e2"),
        "{err}"
    );
    let mut bad_utf8 = insert(
        1,
        &[Some("e3"), Some("A"), Some("1"), Some("T"), Some("x"), None],
    );
    bad_utf8.new.values[4] = TupleValue::Text(Bytes::from_static(b"\"\xff\""));
    let err = router.route_insert(&bad_utf8, &tx(), 0).unwrap_err();
    assert!(err.to_string().contains("UTF-8"), "{err}");
}

#[test]
fn a_mapped_column_type_change_is_refused_by_name() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(1)).unwrap();
    let mut changed = debezium_relation(1);
    changed.columns[1].type_oid = 25; // aggregatetype varchar -> text
    assert!(
        router
            .on_relation_live(changed)
            .unwrap_err()
            .is_schema_mismatch()
    );
    let row = insert(
        1,
        &[
            Some("e1"),
            Some("A"),
            Some("1"),
            Some("T"),
            Some("{}"),
            None,
        ],
    );
    let err = router.route_insert(&row, &tx(), 0).unwrap_err();
    assert!(
        matches!(err, RouteError::ColumnTypeChanged { ref column, was: 1043, now: 25, .. } if column == "aggregatetype"),
        "{err}"
    );
    // An added column keeps going.
    let mut added = debezium_relation(1);
    added.columns.push(Column {
        flags: 0,
        name: "extra".into(),
        type_oid: 25,
        type_modifier: -1,
    });
    router.on_relation_live(added).unwrap();
    let row = insert(
        1,
        &[
            Some("e2"),
            Some("A"),
            Some("1"),
            Some("T"),
            Some("{}"),
            None,
            None,
        ],
    );
    assert!(router.route_insert(&row, &tx(), 0).unwrap().is_some());
    // The raw row of a dead letter names every column.
    let (table, raw) = router.raw_row(&row).unwrap();
    assert_eq!(&*table, "public.outbox");
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(v["id"], "e2");
    assert!(v["extra"].is_null());
}

mod contracts;
mod envelopes;
mod header_objects;
mod native;
mod relations;

#[test]
fn dead_letters_of_rows_without_a_known_commit_are_named_by_the_row() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(1)).unwrap();
    let row = |id: &str| insert(1, &[Some(id), None, Some("1"), Some("t"), Some("{}"), None]);
    let reason = "NULL aggregatetype";
    // From the WAL: named by commit LSN and position, as before.
    let live = router
        .dead_letter_row("dlq", &row("a"), &tx(), 3, &reason)
        .unwrap();
    assert_eq!(live.event_id, "dlq:public.outbox:0/16B3748:3");
    // Read by a backfill (commit LSN 0/0): the position repeats in every page, the row does not.
    let backfill = TxContext::new(0, Lsn(0), 0);
    let dead = |id: &str, index: u64| {
        router
            .dead_letter_row("dlq", &row(id), &backfill, index, &reason)
            .unwrap()
            .event_id
    };
    assert!(
        dead("a", 0).starts_with("dlq:public.outbox:row:"),
        "{}",
        dead("a", 0)
    );
    assert_eq!(
        dead("a", 0),
        dead("a", 7),
        "the same row, read again in another page"
    );
    assert_ne!(
        dead("a", 0),
        dead("b", 0),
        "another row at the same position"
    );
}

#[test]
fn a_dead_letter_of_a_table_renamed_to_a_name_with_a_line_break_holds_no_line_break() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(1)).unwrap();
    let mut renamed = debezium_relation(1);
    renamed.name = "out\r\nbox".into();
    // Renamed: an error for the relay (it stops, or dead-letters the table's rows).
    assert!(router.on_relation(renamed, None).is_err());
    let row = insert(
        1,
        &[Some("a"), None, Some("1"), Some("t"), Some("{}"), None],
    );
    let dead = router
        .dead_letter_row("dlq", &row, &tx(), 3, &"renamed")
        .expect("a dead letter");
    for (name, value) in &dead.headers {
        assert!(!value.contains(['\r', '\n']), "{name}: {value:?}");
    }
    assert!(!dead.event_id.contains(['\r', '\n']), "{:?}", dead.event_id);
}
