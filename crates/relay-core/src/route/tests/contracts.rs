//! `[outbox.contracts]` on the routing path: the header, byte-exact payloads, the refusals.

use std::sync::Arc;

use super::*;
use crate::route::{ContractRefusal, ContractsConfig, LoadedContract, TableContracts};

const ORDER_PLACED: &str =
    r#"{"type":"object","required":["orderId"],"properties":{"orderId":{"type":"integer"}}}"#;

/// A router of the default mapping with `contracts` (JSON) compiled, each file a schema text.
fn router_with(
    contracts: serde_json::Value,
    files: &[(&str, &str)],
) -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("schema");
    }
    let mut config = OutboxTableConfig::with_defaults("public.outbox");
    let contracts: ContractsConfig = serde_json::from_value(contracts).expect("contracts config");
    config.contracts = Some(contracts);
    let root = dir.path().to_path_buf();
    let mut router = Router::new(&[config])
        .unwrap()
        .with_contracts(|_, contracts| {
            TableContracts::new(contracts, |file| {
                let path = root.join(file.path());
                let contract =
                    outbox_schema::Contract::load(&path, file.name()).map_err(|e| e.to_string())?;
                Ok::<_, String>(Arc::new(LoadedContract::new(
                    contract,
                    file.path().display().to_string(),
                )))
            })
            .map(Arc::new)
        })
        .expect("contracts compile");
    router.on_relation_live(debezium_relation(16384)).unwrap();
    (router, dir)
}

fn row(event_type: &str, payload: &str) -> Insert {
    insert(
        16384,
        &[
            Some("e-1"),
            Some("Order"),
            Some("7"),
            Some(event_type),
            Some(payload),
            None,
        ],
    )
}

#[test]
fn a_valid_payload_is_published_byte_for_byte_and_names_its_contract() {
    let (router, _dir) = router_with(
        serde_json::json!({"types": {"OrderPlaced": "order-placed.json"}}),
        &[("order-placed.json", ORDER_PLACED)],
    );
    // Spacing and member order a re-encoding would change.
    let payload = "{ \"orderId\" : 7,\n  \"note\":\"ünï\" }";
    let msg = router
        .route_insert(&row("OrderPlaced", payload), &tx(), 0)
        .unwrap()
        .expect("an outbox row");
    assert_eq!(&msg.payload[..], payload.as_bytes());
    let key = router.contracts()[0].1.contract().key().to_owned();
    assert!(key.starts_with("order-placed."), "{key}");
    assert_eq!(
        msg.header(outbox_contract::HEADER_SCHEMA),
        Some(key.as_str())
    );
    assert_eq!(router.contracts()[0].1.checked(), 1);
    // A type without a contract is published unchecked, without the header.
    let other = router
        .route_insert(&row("OrderShipped", "not even json"), &tx(), 1)
        .unwrap()
        .expect("an outbox row");
    assert_eq!(other.header(outbox_contract::HEADER_SCHEMA), None);
}

#[test]
fn a_violation_is_a_route_error_naming_contract_pointer_and_keyword() {
    let (router, _dir) = router_with(
        serde_json::json!({"types": {"OrderPlaced": "order-placed.json"}}),
        &[("order-placed.json", ORDER_PLACED)],
    );
    let error = router
        .route_insert(&row("OrderPlaced", r#"{"orderId":"7"}"#), &tx(), 0)
        .expect_err("a string is not an integer");
    let RouteError::Contract {
        event_id, refusal, ..
    } = &error
    else {
        panic!("not a contract refusal: {error}");
    };
    assert_eq!(event_id, "e-1");
    assert!(matches!(**refusal, ContractRefusal::Violation { .. }));
    let text = error.to_string();
    for part in [
        "order-placed.",
        "/orderId",
        "`type`",
        "\"integer\"",
        "\"7\"",
    ] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
    assert!(
        !error.is_schema_mismatch(),
        "a bad row, not a table-shape stop"
    );
    let loaded = &router.contracts()[0].1;
    assert_eq!((loaded.checked(), loaded.refused()), (1, 1));
    assert_eq!(
        loaded.last_refused().map(|r| r.event_id),
        Some("e-1".into())
    );
}

#[test]
fn required_contracts_refuse_an_event_type_without_one() {
    let (router, _dir) = router_with(
        serde_json::json!({"types": {"OrderPlaced": "order-placed.json"}, "required": true}),
        &[("order-placed.json", ORDER_PLACED)],
    );
    let error = router
        .route_insert(&row("OrderShipped", "{}"), &tx(), 0)
        .expect_err("no contract for OrderShipped");
    assert!(error.to_string().contains("`OrderShipped`"), "{error}");
}

#[test]
fn subject_patterns_match_when_the_type_has_no_contract() {
    let (router, _dir) = router_with(
        serde_json::json!({
            "type_header": "Outbox-Aggregate-Type",
            "subjects": {"outbox.Order.>": "any-order.json", "outbox.>": "anything.json"}
        }),
        &[
            (
                "any-order.json",
                r#"{"type":"object","required":["orderId"]}"#,
            ),
            ("anything.json", r#"{"type":"object"}"#),
        ],
    );
    let error = router
        .route_insert(&row("OrderPlaced", "{}"), &tx(), 0)
        .expect_err("the more specific pattern applies");
    assert!(error.to_string().contains("any-order."), "{error}");
}

#[test]
fn a_payload_past_the_depth_bound_is_refused_naming_the_bound() {
    let (router, _dir) = router_with(
        serde_json::json!({"types": {"OrderPlaced": "order-placed.json"}, "max_depth": 8}),
        &[("order-placed.json", ORDER_PLACED)],
    );
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let error = router
        .route_insert(&row("OrderPlaced", &deep), &tx(), 0)
        .expect_err("too deep");
    assert!(error.to_string().contains("max_depth"), "{error}");
}
