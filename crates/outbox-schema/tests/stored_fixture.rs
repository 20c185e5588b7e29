//! `tests/fixtures/stored.json` is what the relay stores for `fixtures/contracts/order-placed.json`
//! (its KV key and exact bytes) and how it judges a few payloads. The Python and TypeScript
//! consumers' tests read the same file, so all three check a payload alike; this test fails
//! when the relay's bundle or verdicts change without the file (`UPDATE_FIXTURES=1` rewrites it).

use std::path::Path;

use outbox_schema::{Contract, Limits, Violation};
use serde_json::{Value, json};

const CASES: [(&str, Option<(&str, &str)>); 6] = [
    (
        r#"{"order_id":"o-1","customer":"c-7","total":{"cents":1250,"currency":"EUR"}}"#,
        None,
    ),
    (
        r#"{"order_id":"o-2","customer":"c-7","total":{"cents":5,"currency":"USD"},"lines":[{"sku":"a"}]}"#,
        None,
    ),
    (
        r#"{"order_id":"o-3","customer":"c-7","total":{"cents":"1250","currency":"EUR"}}"#,
        Some(("/total/cents", "type")),
    ),
    (
        r#"{"order_id":"o-4","customer":"c-7"}"#,
        Some(("", "required")),
    ),
    (
        r#"{"order_id":"o-5","customer":"c-7","total":{"cents":1,"currency":"GBP"}}"#,
        Some(("/total/currency", "enum")),
    ),
    (
        r#"{"order_id":"x-6","customer":"c-7","total":{"cents":1,"currency":"EUR"}}"#,
        Some(("/order_id", "pattern")),
    ),
];

#[test]
fn the_stored_fixture_is_what_the_relay_stores_and_judges() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let contract =
        Contract::load(&dir.join("contracts/order-placed.json"), None).expect("fixture compiles");
    let limits = Limits::default();
    let cases: Vec<Value> = CASES
        .iter()
        .map(|(payload, expected)| {
            let verdict = contract.check(payload.as_bytes(), &limits);
            match (expected, verdict) {
                (None, Ok(())) => json!({"payload": payload, "valid": true}),
                (Some((pointer, keyword)), Err(Violation::Keyword { pointer: p, keyword: k, .. }))
                    if p == *pointer && k == *keyword =>
                {
                    json!({"payload": payload, "valid": false, "pointer": pointer, "keyword": keyword})
                }
                (expected, verdict) => panic!("{payload}: expected {expected:?}, got {verdict:?}"),
            }
        })
        .collect();
    let stored = std::str::from_utf8(contract.stored()).expect("utf-8");
    let fixture = json!({
        "description": "What outbox-relay stores for contracts/order-placed.json (KV key and exact bytes) and its verdict on each payload; written by crates/outbox-schema/tests/stored_fixture.rs",
        "key": contract.key(),
        "stored": stored,
        "cases": cases,
    });
    let text = format!(
        "{}\n",
        serde_json::to_string_pretty(&fixture).expect("json")
    );
    let path = dir.join("stored.json");
    if std::env::var_os("UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &text).expect("write fixture");
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == text,
        "{} is out of date; run with UPDATE_FIXTURES=1 to rewrite it:\n{text}",
        path.display()
    );
    let fetched = Contract::from_stored(contract.key(), stored.as_bytes()).expect("compiles");
    assert_eq!(fetched.key(), contract.key());
}
