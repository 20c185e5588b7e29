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

/// docs/contracts.md prints the fixture's two files as its example and the version they give:
/// the printed files are the fixture's, byte for byte, and every `order-placed.<version>` it
/// shows is the fixture's key.
#[test]
fn the_docs_print_the_fixture_files_and_the_version_they_give() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("../../docs/contracts.md")).expect("docs");
    let fixtures = root.join("tests/fixtures/contracts");
    for file in ["order-placed.json", "shared/money.json"] {
        let heading = format!("`contracts/{file}`:\n\n```json\n");
        let start = docs
            .find(&heading)
            .unwrap_or_else(|| panic!("docs/contracts.md prints no {file}"))
            + heading.len();
        let printed = &docs[start..start + docs[start..].find("```").expect("block ends")];
        let fixture = std::fs::read_to_string(fixtures.join(file)).expect("fixture");
        assert_eq!(
            printed, fixture,
            "docs/contracts.md prints {file} otherwise than the fixture"
        );
    }
    let contract = Contract::load(&fixtures.join("order-placed.json"), None).expect("compiles");
    let shown: Vec<&str> = docs
        .match_indices("order-placed.")
        .map(|(at, _)| &docs[at..])
        .map(|rest| &rest[..rest.len().min("order-placed.".len() + 12)])
        .filter(|key| {
            key["order-placed.".len()..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit())
        })
        .filter(|key| key.len() == "order-placed.".len() + 12)
        .collect();
    assert!(!shown.is_empty(), "docs/contracts.md shows no version");
    for key in shown {
        assert_eq!(
            key,
            contract.key(),
            "docs/contracts.md shows another version"
        );
    }
}
