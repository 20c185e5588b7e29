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

/// A contract directory `contracts/` (holding `order.json`, which refers to `reference`) beside
/// `secret.json`; returns the contract file.
fn referring_to(parent: &Path, reference: &str) -> std::path::PathBuf {
    let dir = parent.join("contracts");
    std::fs::create_dir_all(dir.join("shared")).expect("mkdir");
    write(parent, "secret.json", r#"{"const": "s3cret"}"#);
    write(&dir.join("shared"), "money.json", MONEY);
    write(
        &dir,
        "order.json",
        &ORDER.replace("money.json", &reference.replace('"', "\\\"")),
    )
}

#[test]
fn a_ref_outside_the_contracts_directory_is_refused_naming_file_ref_and_fix() {
    let parent = tempfile::tempdir().expect("tempdir");
    referring_to(parent.path(), "shared/money.json");
    let secret = parent.path().join("secret.json");
    let absolute = secret.display().to_string();
    let file_uri = files::file_uri(&std::fs::canonicalize(&secret).expect("canonical"));
    for reference in [
        "../secret.json",
        "shared/../../secret.json",
        "./shared/../../contracts/../secret.json",
        absolute.as_str(),
        file_uri.as_str(),
        "../secret.json#/const",
        "../../../../../../../../etc/passwd",
    ] {
        let path = referring_to(parent.path(), reference);
        let error = Contract::load(&path, None).expect_err(reference);
        let SchemaError::Outside {
            reference: named, ..
        } = &error
        else {
            panic!("{reference}: not refused as outside: {error}");
        };
        assert_eq!(named, reference);
        let text = error.to_string();
        for needle in [
            path.display().to_string(),
            format!("`$ref` `{reference}`"),
            "outside".to_owned(),
            "copy the file under".to_owned(),
        ] {
            assert!(
                text.contains(&needle),
                "{reference}: no {needle:?} in {text}"
            );
        }
        assert!(!text.contains("s3cret"), "{text}");
    }
    // Files below the contract's directory, by any path that stays in it, are fine.
    for reference in ["shared/money.json", "./shared/../shared/money.json"] {
        let path = referring_to(parent.path(), reference);
        Contract::load(&path, None).unwrap_or_else(|e| panic!("{reference}: {e}"));
    }
}

#[test]
fn a_ref_outside_the_contracts_directory_is_refused_in_a_file_it_reaches_too() {
    let parent = tempfile::tempdir().expect("tempdir");
    let path = referring_to(parent.path(), "shared/money.json");
    let nested = write(
        &parent.path().join("contracts/shared"),
        "money.json",
        r#"{"type":"object","properties":{"cents":{"$ref":"../../secret.json"}}}"#,
    );
    let error = Contract::load(&path, None).expect_err("nested ref outside");
    let text = error.to_string();
    assert!(
        matches!(error, SchemaError::Outside { .. })
            && text.contains(&nested.display().to_string()),
        "{text}"
    );
}

#[cfg(unix)]
#[test]
fn a_symbolic_link_out_of_the_contracts_directory_is_refused() {
    let parent = tempfile::tempdir().expect("tempdir");
    let path = referring_to(parent.path(), "shared/link.json");
    let contracts = parent.path().join("contracts");
    std::os::unix::fs::symlink(
        parent.path().join("secret.json"),
        contracts.join("shared/link.json"),
    )
    .expect("symlink");
    let error = Contract::load(&path, None).expect_err("link out refused");
    assert!(matches!(error, SchemaError::Outside { .. }), "{error}");
    assert!(error.to_string().contains("`shared/link.json`"), "{error}");
    // A directory linked from elsewhere is outside too; a link that stays inside is fine.
    std::fs::create_dir(parent.path().join("elsewhere")).expect("mkdir");
    write(&parent.path().join("elsewhere"), "money.json", MONEY);
    std::os::unix::fs::symlink(parent.path().join("elsewhere"), contracts.join("linked"))
        .expect("symlink");
    let path = referring_to(parent.path(), "linked/money.json");
    let error = Contract::load(&path, None).expect_err("linked directory refused");
    assert!(matches!(error, SchemaError::Outside { .. }), "{error}");
    std::os::unix::fs::symlink(
        contracts.join("shared/money.json"),
        contracts.join("inside.json"),
    )
    .expect("symlink");
    let path = referring_to(parent.path(), "inside.json");
    Contract::load(&path, None).expect("a link that stays inside");
}

#[test]
fn the_retriever_refuses_files_outside_its_root() {
    let parent = tempfile::tempdir().expect("tempdir");
    referring_to(parent.path(), "shared/money.json");
    let root = std::fs::canonicalize(parent.path().join("contracts")).expect("canonical");
    let retriever = files::LocalFiles { root: root.clone() };
    let uri = |path: &Path| jsonschema::uri::from_str(&files::file_uri(path)).expect("a URI");
    let outside = jsonschema::Retrieve::retrieve(&retriever, &uri(&root.join("../secret.json")))
        .expect_err("outside");
    assert!(outside.to_string().contains("outside"), "{outside}");
    jsonschema::Retrieve::retrieve(&retriever, &uri(&root.join("shared/money.json")))
        .expect("inside");
}

#[test]
fn document_refs_point_into_the_document_that_embeds_the_bundle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let contracts = dir.path().join("contracts");
    std::fs::create_dir_all(contracts.join("shared")).expect("mkdir");
    let path = write(
        &contracts,
        "order.json",
        &ORDER.replace("money.json", "shared/money.json"),
    );
    write(&contracts.join("shared"), "money.json", MONEY);
    let contract = Contract::load(&path, None).expect("compiles");
    let at = "/components/messages/m/payload/schema";
    let embedded = document_refs(contract.schema(), at);
    let reference = embedded["properties"]["total"]["$ref"]
        .as_str()
        .expect("a $ref");
    assert_eq!(
        reference,
        "#/components/messages/m/payload/schema/$defs/file:~1~1~1shared~1money.json"
    );
    let document =
        serde_json::json!({"components": {"messages": {"m": {"payload": {"schema": embedded}}}}});
    assert_eq!(
        document.pointer(&reference[1..]),
        contract
            .schema()
            .pointer("/$defs/file:~1~1~1shared~1money.json")
    );
    // The stored bundle is what it was.
    assert_eq!(
        contract.schema()["properties"]["total"]["$ref"],
        "shared/money.json"
    );
}
