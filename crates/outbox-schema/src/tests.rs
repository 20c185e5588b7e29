use std::path::Path;

use super::*;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write schema");
    path
}

const ORDER: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["order_id", "total"],
  "properties": {
    "order_id": {"type": "string"},
    "total": {"$ref": "money.json"}
  }
}"#;
const MONEY: &str = r#"{"type": "object", "required": ["cents"], "properties": {"cents": {"type": "integer", "minimum": 0}}}"#;

#[test]
fn a_contract_with_a_local_ref_checks_payloads_and_names_the_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "order-placed.json", ORDER);
    write(dir.path(), "money.json", MONEY);
    let contract = Contract::load(&path, None).expect("compiles");
    assert_eq!(contract.name(), "order-placed");
    assert_eq!(contract.version().len(), 12);
    assert_eq!(
        contract.key(),
        format!("order-placed.{}", contract.version())
    );
    let limits = Limits::default();
    assert_eq!(
        contract.check(br#"{"order_id":"o-1","total":{"cents":5}}"#, &limits),
        Ok(())
    );
    let violation = contract
        .check(br#"{"order_id":"o-1","total":{"cents":"5"}}"#, &limits)
        .expect_err("a string is not an integer");
    let Violation::Keyword {
        pointer,
        keyword,
        expected,
        found,
        ..
    } = &violation
    else {
        panic!("not a keyword violation: {violation:?}");
    };
    assert_eq!(pointer, "/total/cents");
    assert_eq!(keyword, "type");
    assert_eq!(expected, "\"integer\"");
    assert_eq!(found, "\"5\"");
    let text = violation.to_string();
    assert!(
        text.starts_with("at /total/cents: keyword `type` expected \"integer\", found \"5\""),
        "{text}"
    );

    let missing = contract
        .check(br#"{"order_id":"o-1"}"#, &limits)
        .expect_err("total is required");
    assert!(
        missing.to_string().contains("keyword `required`"),
        "{missing}"
    );
    assert!(missing.to_string().contains("\"total\""), "{missing}");
}

#[test]
fn the_stored_bundle_checks_the_same_without_the_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "order.json", ORDER);
    write(dir.path(), "money.json", MONEY);
    let contract = Contract::load(&path, Some("order_placed")).expect("compiles");
    let stored = contract.stored().to_vec();
    drop(dir);
    let fetched =
        Contract::from_stored(contract.key(), &stored).expect("the bundle compiles alone");
    let limits = Limits::default();
    let bad = br#"{"order_id":"o-1","total":{"cents":-1}}"#;
    assert_eq!(
        fetched.check(bad, &limits).map_err(|v| v.to_string()),
        contract.check(bad, &limits).map_err(|v| v.to_string())
    );
    assert!(fetched.check(bad, &limits).is_err());
    let tampered = String::from_utf8(stored)
        .expect("utf-8")
        .replace("\"minimum\":0", "\"minimum\":-5");
    let refused =
        Contract::from_stored(contract.key(), tampered.as_bytes()).expect_err("bytes changed");
    assert!(
        matches!(refused, SchemaError::VersionMismatch { .. }),
        "{refused}"
    );
}

#[test]
fn a_changed_referenced_file_is_a_new_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "order.json", ORDER);
    write(dir.path(), "money.json", MONEY);
    let first = Contract::load(&path, None).expect("compiles");
    write(
        dir.path(),
        "money.json",
        &MONEY.replace("\"minimum\": 0", "\"minimum\": 1"),
    );
    let second = Contract::load(&path, None).expect("compiles");
    assert_ne!(first.version(), second.version());
}

#[test]
fn draft_7_is_accepted_and_other_drafts_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seven = write(
        dir.path(),
        "seven.json",
        r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","required":["a"]}"#,
    );
    let contract = Contract::load(&seven, None).expect("draft 7 compiles");
    assert!(contract.check(b"{}", &Limits::default()).is_err());
    let four = write(
        dir.path(),
        "four.json",
        r#"{"$schema":"http://json-schema.org/draft-04/schema#","type":"object"}"#,
    );
    let error = Contract::load(&four, None)
        .expect_err("draft 4 refused")
        .to_string();
    assert!(
        error.contains("four.json") && error.contains("`$schema`"),
        "{error}"
    );
}

#[test]
fn a_remote_ref_is_refused_naming_the_file_and_keyword() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(
        dir.path(),
        "remote.json",
        r#"{"type":"object","properties":{"a":{"$ref":"https://example.com/a.json"}}}"#,
    );
    let error = Contract::load(&path, None).expect_err("remote ref refused");
    assert!(matches!(error, SchemaError::Reference { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("remote.json") && text.contains("`$ref`"),
        "{text}"
    );
    assert!(text.contains("example.com"), "{text}");
    let missing = write(dir.path(), "missing.json", r#"{"$ref":"nowhere.json"}"#);
    let text = Contract::load(&missing, None)
        .expect_err("missing file")
        .to_string();
    assert!(
        text.contains("missing.json") && text.contains("nowhere.json"),
        "{text}"
    );
}

#[test]
fn a_schema_that_does_not_compile_names_the_keyword() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(
        dir.path(),
        "typo.json",
        r#"{"type":"object","properties":{"a":{"type":"strin"}}}"#,
    );
    let error = Contract::load(&path, None).expect_err("bad type name");
    let SchemaError::Invalid {
        keyword, location, ..
    } = &error
    else {
        panic!("not a compile error: {error}");
    };
    assert_eq!(keyword, "type");
    assert_eq!(location, "/properties/a/type");
    let text = error.to_string();
    assert!(text.contains("typo.json"), "{text}");
    let broken = write(dir.path(), "broken.json", "{\"type\":");
    assert!(matches!(
        Contract::load(&broken, None),
        Err(SchemaError::NotJson { .. })
    ));
}

#[test]
fn payloads_past_the_bounds_or_not_json_are_violations_naming_the_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "any.json", r#"{"type":"object"}"#);
    let contract = Contract::load(&path, None).expect("compiles");
    let limits = Limits {
        max_bytes: 64,
        max_depth: 4,
    };
    let deep = "[".repeat(200_000);
    let error = contract
        .check(deep.as_bytes(), &Limits::default())
        .expect_err("too deep");
    assert!(error.to_string().contains("max_depth"), "{error}");
    let large = format!("{{\"a\":\"{}\"}}", "x".repeat(100));
    let error = contract
        .check(large.as_bytes(), &limits)
        .expect_err("too large");
    assert!(error.to_string().contains("max_bytes"), "{error}");
    assert!(matches!(
        contract.check(b"not json", &limits),
        Err(Violation::NotJson { .. })
    ));
    assert!(matches!(
        contract.check(&[0xff, 0xfe], &limits),
        Err(Violation::NotJson { .. })
    ));
}

#[test]
fn found_values_are_cut_to_a_bounded_length() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(
        dir.path(),
        "short.json",
        r#"{"type":"object","properties":{"a":{"maxLength":3}}}"#,
    );
    let contract = Contract::load(&path, None).expect("compiles");
    let payload = format!("{{\"a\":\"{}\"}}", "y".repeat(10_000));
    let error = contract
        .check(payload.as_bytes(), &Limits::default())
        .expect_err("too long");
    assert!(
        error.to_string().len() < 800,
        "{} chars",
        error.to_string().len()
    );
}

#[test]
fn names_are_kv_key_parts() {
    assert!(check_name("order-placed_v2").is_ok());
    for bad in ["", "a.b", "a b", "ü", &"x".repeat(65)] {
        assert!(check_name(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn the_stored_bundle_does_not_depend_on_where_the_files_are() {
    let stored = |parent: &Path| {
        let dir = parent.join("contracts");
        std::fs::create_dir_all(dir.join("shared")).expect("mkdir");
        let path = write(
            &dir,
            "order.json",
            &ORDER.replace("money.json", "shared/money.json"),
        );
        write(&dir.join("shared"), "money.json", MONEY);
        Contract::load(&path, None).expect("compiles")
    };
    let one = tempfile::tempdir().expect("tempdir");
    let two = tempfile::tempdir().expect("tempdir");
    let (a, b) = (stored(one.path()), stored(two.path()));
    assert_eq!(a.key(), b.key());
    assert_eq!(a.stored(), b.stored());
    let text = String::from_utf8_lossy(a.stored()).into_owned();
    assert!(text.contains("\"file:///shared/money.json\""), "{text}");
    assert!(!text.contains(&one.path().display().to_string()), "{text}");
}
