//! `headers_json` on a column that is the header object itself (MassTransit, Eventuate,
//! Watermill, Brighter), beside the mapped and CloudEvents headers; `bytea` columns.

use super::*;
use crate::route::HeaderObjectError;

/// MassTransit, Eventuate, Watermill, Brighter: a column that is the header object itself.
fn headers_table(headers_type: u32) -> Router {
    let config = OutboxTableConfig {
        headers_json: Some("headers".into()),
        cloudevents: Some(CloudEventsConfig {
            source: "/orders".into(),
            type_column: "type".into(),
            time_column: None,
            subject_column: None,
        }),
        ..OutboxTableConfig::with_defaults("public.outbox")
    };
    let mut router = Router::new(&[config]).unwrap();
    let mut rel = debezium_relation(41);
    rel.columns.push(pgoutput::Column {
        flags: 0,
        name: "headers".into(),
        type_oid: headers_type,
        type_modifier: -1,
    });
    router.on_relation_live(rel).unwrap();
    router
}

fn headers_row(headers: Option<&str>) -> Insert {
    insert(
        41,
        &[
            Some("e1"),
            Some("Order"),
            Some("7"),
            Some("Created"),
            Some("{}"),
            None,
            headers,
        ],
    )
}

#[test]
fn a_header_object_column_expands_beside_the_mapped_headers() {
    let router = headers_table(oid::JSONB);
    let msg = router
        .route_insert(
            &headers_row(Some(
                r#"{"MT-Activity-Id": "00-ab-cd-01", "Retry": 2, "Price": 12.50, "Redelivered": false, "Host": {"Machine": "w1"}, "Gone": null}"#,
            )),
            &tx(),
            0,
        )
        .unwrap()
        .unwrap();
    assert_eq!(msg.header("MT-Activity-Id"), Some("00-ab-cd-01"));
    assert_eq!(msg.header("Retry"), Some("2"));
    assert_eq!(msg.header("Price"), Some("12.50"));
    assert_eq!(msg.header("Redelivered"), Some("false"));
    assert_eq!(msg.header("Host"), Some(r#"{"Machine":"w1"}"#));
    assert_eq!(msg.header("Gone"), None);
    assert_eq!(msg.header("Outbox-Event-Type"), Some("Created"));
    assert_eq!(msg.header("ce-type"), Some("Created"));
    let none = router.route_insert(&headers_row(None), &tx(), 0).unwrap();
    assert_eq!(none.unwrap().header("Retry"), None, "NULL: no headers");

    // Headers the mapping sets itself (from `headers`, or CloudEvents') are not overridden.
    for (object, name) in [
        (r#"{"Outbox-Event-Type": "Forged"}"#, "Outbox-Event-Type"),
        (r#"{"outbox-aggregate-id": "8"}"#, "outbox-aggregate-id"),
        (r#"{"ce-type": "Forged"}"#, "ce-type"),
        (r#"{"CE-Source": "/x"}"#, "CE-Source"),
    ] {
        let err = router
            .route_insert(&headers_row(Some(object)), &tx(), 0)
            .unwrap_err();
        assert_eq!(
            err,
            RouteError::InvalidHeaderObject {
                table: "public.outbox".into(),
                event_id: "e1".into(),
                column: "headers".into(),
                reason: HeaderObjectError::Mapped(name.into()),
            }
        );
        assert!(err.to_string().contains("remove one of the two"), "{err}");
    }
    let bad_json = router
        .route_insert(&headers_row(Some("{\"a\": ")), &tx(), 0)
        .unwrap_err();
    assert!(
        matches!(
            &bad_json,
            RouteError::InvalidHeaderObject {
                reason: HeaderObjectError::NotJson(_),
                ..
            }
        ),
        "{bad_json}"
    );
    assert!(
        bad_json.to_string().contains("write a JSON object"),
        "{bad_json}"
    );
}

#[test]
fn a_bytea_header_object_column_is_a_table_shape_error() {
    let config = OutboxTableConfig {
        headers_json: Some("headers".into()),
        ..OutboxTableConfig::with_defaults("public.outbox")
    };
    let mut router = Router::new(&[config]).unwrap();
    let mut rel = debezium_relation(42);
    rel.columns.push(pgoutput::Column {
        flags: 0,
        name: "headers".into(),
        type_oid: oid::BYTEA,
        type_modifier: -1,
    });
    let err = router.on_relation_live(rel).unwrap_err();
    assert!(err.is_schema_mismatch(), "{err}");
    assert!(err.to_string().contains("mapped as headers_json"), "{err}");
}

#[test]
fn a_bytea_payload_member_is_sliced_from_the_decoded_bytes() {
    let config = OutboxTableConfig {
        payload_pointer: Some("/body".into()),
        ..OutboxTableConfig::with_defaults("public.outbox")
    };
    let mut router = Router::new(&[config]).unwrap();
    let mut rel = debezium_relation(43);
    rel.columns[4].type_oid = oid::BYTEA;
    router.on_relation_live(rel).unwrap();
    let envelope = r#"{"body": {"é": 12.50}}"#;
    let hex: String = envelope.bytes().map(|b| format!("{b:02x}")).collect();
    let row = insert(
        43,
        &[
            Some("e1"),
            Some("A"),
            Some("1"),
            Some("T"),
            Some(&format!("\\x{hex}")),
            None,
        ],
    );
    let msg = router.route_insert(&row, &tx(), 0).unwrap().unwrap();
    assert_eq!(&msg.payload[..], r#"{"é": 12.50}"#.as_bytes());
}
