//! `contract.json` is the machine-readable copy of this crate that the Python and TypeScript
//! consumers (`consumers/`) read. These tests fail when the file and the crate drift apart: a
//! constant added, removed or changed on either side, a list reordered, the LSN form changed.

use std::collections::BTreeMap;

use outbox_contract::*;
use serde_json::Value;

const CONTRACT: &str = include_str!("../contract.json");
/// The crate's sources, scanned for `pub const` items so that a new constant cannot be
/// forgotten in the file.
const SOURCES: [(&str, &str); 2] = [
    ("src/lib.rs", include_str!("../src/lib.rs")),
    ("src/reserved.rs", include_str!("../src/reserved.rs")),
];

fn contract() -> Value {
    serde_json::from_str(CONTRACT).expect("contract.json is valid JSON")
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .expect("an object")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("a string").to_owned()))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

/// `pub const NAME: &str = "value";` items of the sources, by name.
fn source_str_constants() -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for (file, text) in SOURCES {
        for line in text.lines() {
            let Some(rest) = line.trim().strip_prefix("pub const ") else {
                continue;
            };
            let Some((name, value)) = rest.split_once(": &str = ") else {
                continue;
            };
            let value = value
                .strip_suffix(';')
                .and_then(|v| v.strip_prefix('"'))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{file}: cannot read the value of {name}"));
            found.insert(name.to_owned(), value.to_owned());
        }
    }
    found
}

/// `pub const NAME: [&str; N]` items of the sources.
fn source_list_names() -> Vec<String> {
    let mut names: Vec<String> = SOURCES
        .iter()
        .flat_map(|(_, text)| text.lines())
        .filter_map(|line| line.trim().strip_prefix("pub const "))
        .filter_map(|rest| rest.split_once(": [&str; "))
        .map(|(name, _)| name.to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn every_string_constant_is_in_the_file_with_its_value() {
    let file = string_map(&contract()["constants"]);
    let source = source_str_constants();
    assert!(source.len() > 30, "the source scan found {source:?}");
    assert_eq!(
        file, source,
        "contract.json `constants` and the crate's `pub const …: &str` differ"
    );
    // The scan reads text; check the values through the compiled constants too.
    let compiled = [
        ("HEADER_MSG_ID", HEADER_MSG_ID),
        ("HEADER_EXPECTED_STREAM", HEADER_EXPECTED_STREAM),
        ("HEADER_EXPECTED_LAST_MSG_ID", HEADER_EXPECTED_LAST_MSG_ID),
        (
            "HEADER_EXPECTED_LAST_SEQUENCE",
            HEADER_EXPECTED_LAST_SEQUENCE,
        ),
        ("HEADER_COMMIT_LSN", HEADER_COMMIT_LSN),
        ("HEADER_XID", HEADER_XID),
        ("HEADER_COMMIT_TIME", HEADER_COMMIT_TIME),
        ("HEADER_TABLE", HEADER_TABLE),
        ("HEADER_TX_INDEX", HEADER_TX_INDEX),
        ("HEADER_MESSAGE_PREFIX", HEADER_MESSAGE_PREFIX),
        ("HEADER_BACKFILL", HEADER_BACKFILL),
        ("HEADER_AGGREGATE_TYPE", HEADER_AGGREGATE_TYPE),
        ("HEADER_AGGREGATE_ID", HEADER_AGGREGATE_ID),
        ("HEADER_EVENT_TYPE", HEADER_EVENT_TYPE),
        ("HEADER_TRACEPARENT", HEADER_TRACEPARENT),
        ("HEADER_NATS_TTL", HEADER_NATS_TTL),
        ("HEADER_SCHEDULE", HEADER_SCHEDULE),
        ("HEADER_SCHEDULE_TARGET", HEADER_SCHEDULE_TARGET),
        ("HEADER_SCHEDULE_TTL", HEADER_SCHEDULE_TTL),
        ("HEADER_EVENT_ID", HEADER_EVENT_ID),
        ("HEADER_CE_ID", HEADER_CE_ID),
        ("HEADER_CE_SOURCE", HEADER_CE_SOURCE),
        ("HEADER_CE_TYPE", HEADER_CE_TYPE),
        ("HEADER_CE_TIME", HEADER_CE_TIME),
        ("HEADER_CE_SPECVERSION", HEADER_CE_SPECVERSION),
        ("HEADER_CE_SUBJECT", HEADER_CE_SUBJECT),
        ("CE_SPECVERSION", CE_SPECVERSION),
        ("CE_PREFIX", CE_PREFIX),
        ("HEADER_SCHEMA", HEADER_SCHEMA),
        ("CONTRACTS_BUCKET", CONTRACTS_BUCKET),
        ("HEADER_DLQ_REASON", HEADER_DLQ_REASON),
        ("HEADER_DLQ_SUBJECT", HEADER_DLQ_SUBJECT),
        ("HEADER_DLQ_EVENT_ID", HEADER_DLQ_EVENT_ID),
        ("HEADER_DLQ_DELIVERIES", HEADER_DLQ_DELIVERIES),
        ("HEADER_DLQ_CONSUMER", HEADER_DLQ_CONSUMER),
        ("HEADER_DLQ_SOURCE", HEADER_DLQ_SOURCE),
        ("RESERVED_PREFIX", RESERVED_PREFIX),
        ("HEADER_ORIGINAL_PREFIX", HEADER_ORIGINAL_PREFIX),
    ];
    for (name, value) in compiled {
        assert_eq!(file.get(name).map(String::as_str), Some(value), "{name}");
    }
    assert_eq!(compiled.len(), file.len(), "a constant is not compared");
}

#[test]
fn every_list_is_in_the_file_in_order() {
    let lists = &contract()["lists"];
    let mut file_names: Vec<String> = lists.as_object().expect("lists").keys().cloned().collect();
    file_names.sort();
    assert_eq!(file_names, source_list_names());
    let compiled: [(&str, &[&str]); 4] = [
        ("RELAY_HEADERS", &RELAY_HEADERS),
        ("NATIVE_HEADERS", &NATIVE_HEADERS),
        ("STREAM_BINDING_HEADERS", &STREAM_BINDING_HEADERS),
        ("SERVER_ACTION_HEADERS", &SERVER_ACTION_HEADERS),
    ];
    for (name, list) in compiled {
        assert_eq!(strings(&lists[name]), list, "{name}");
    }
}

#[test]
fn the_reserved_rule_examples_hold() {
    // The rule in prose is for the other languages; its examples are the crate's behaviour.
    assert!(contract()["rules"]["reserved"].as_str().is_some());
    assert_eq!(
        original_name("Nats-Expected-Stream").as_deref(),
        Some("Outbox-Original-Expected-Stream")
    );
    assert_eq!(
        original_name("nats-msg-id").as_deref(),
        Some("Outbox-Original-msg-id")
    );
}

#[test]
fn the_lsn_examples_and_pattern_match_the_crate() {
    let lsn = &contract()["lsn"];
    let value = |v: &Value| -> u64 { v.as_str().expect("decimal string").parse().expect("u64") };
    for ex in lsn["format_examples"].as_array().expect("format_examples") {
        let (v, text) = (value(&ex["value"]), ex["text"].as_str().expect("text"));
        assert_eq!(Lsn(v).to_string(), text);
        assert_eq!(text.parse::<Lsn>(), Ok(Lsn(v)), "{text}");
    }
    for ex in lsn["parse_examples"].as_array().expect("parse_examples") {
        let text = ex["text"].as_str().expect("text");
        assert_eq!(text.parse::<Lsn>(), Ok(Lsn(value(&ex["value"]))), "{text}");
    }
    let invalid = strings(&lsn["invalid"]);
    assert!(invalid.len() > 10);
    for bad in &invalid {
        assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parses in the crate");
    }
    assert_eq!(
        lsn["pattern"].as_str(),
        Some("^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"),
        "the pattern changed: update the LSN parser (src/lsn.rs) and the examples with it"
    );
}
