use super::*;
use crate::route::header_size;

fn pointer(p: &str) -> JsonPointer {
    JsonPointer::parse(p).unwrap()
}

/// The member's text and whether it is a sub-slice of the document (no copy).
fn resolve<'a>(p: &str, document: &'a str) -> Result<&'a str, MemberError> {
    let member = pointer(p).resolve(document)?;
    let start = member.as_ptr() as usize - document.as_ptr() as usize;
    assert_eq!(
        &document[start..start + member.len()],
        member,
        "a sub-slice"
    );
    Ok(member)
}

#[test]
fn pointers_parse_by_rfc_6901() {
    assert_eq!(pointer("/Value").tokens, ["Value"]);
    assert_eq!(pointer("/Content/Headers").tokens, ["Content", "Headers"]);
    assert_eq!(pointer("/a~1b/c~0d/~01").tokens, ["a/b", "c~d", "~1"]);
    assert_eq!(pointer("/").tokens, [""]);
    assert_eq!(pointer("/Value").to_string(), "/Value");
    for bad in ["", "Value", "Content.Value", "/a~2", "/a~"] {
        let err = JsonPointer::parse(bad).unwrap_err();
        assert!(err.contains("JSON Pointer"), "{bad}: {err}");
    }
}

#[test]
fn a_member_is_the_producers_text_byte_for_byte() {
    let doc = r#"{"Headers": {"cap-msg-id": "1"}, "Value": {"price": 12.50, "qty": 1e3, "name": "caf\u00e9 ünï 😀", "esc": "a\"b\\c\n", "nested": {"deep": [1, {"x": null}]}}}"#;
    assert_eq!(
        resolve("/Value", doc),
        Ok(
            r#"{"price": 12.50, "qty": 1e3, "name": "caf\u00e9 ünï 😀", "esc": "a\"b\\c\n", "nested": {"deep": [1, {"x": null}]}}"#
        )
    );
    assert_eq!(resolve("/Value/price", doc), Ok("12.50"));
    assert_eq!(resolve("/Value/qty", doc), Ok("1e3"));
    assert_eq!(resolve("/Value/name", doc), Ok(r#""caf\u00e9 ünï 😀""#));
    assert_eq!(
        resolve("/Value/nested/deep", doc),
        Ok(r#"[1, {"x": null}]"#)
    );
    assert_eq!(resolve("/Headers", doc), Ok(r#"{"cap-msg-id": "1"}"#));
    // Whitespace around the member is not part of it; a `null` member is its text.
    assert_eq!(resolve("/a", "{ \"a\" :\n  [ 1 ] \n}"), Ok("[ 1 ]"));
    assert_eq!(resolve("/a", r#"{"a": null}"#), Ok("null"));
    // A key written with escapes is the key it spells.
    assert_eq!(resolve("/Value", r#"{"V\u0061lue": 7}"#), Ok("7"));
    assert_eq!(resolve("/a~1b", r#"{"a/b": 1}"#), Ok("1"));
}

#[test]
fn a_large_member_is_sliced_not_copied() {
    let big = "é".repeat(300_000);
    let doc = format!(r#"{{"Headers": {{}}, "Value": "{big}", "After": 1}}"#);
    let member = resolve("/Value", &doc).unwrap();
    assert_eq!(member.len(), big.len() + 2);
    assert!(member.starts_with("\"é") && member.ends_with("é\""));
}

#[test]
fn missing_members_and_non_objects_are_named() {
    let doc = r#"{"Headers": {"a": "1"}, "Value": "text"}"#;
    assert_eq!(
        resolve("/Body", doc),
        Err(MemberError::Missing {
            member: "/Body".into()
        })
    );
    assert_eq!(
        resolve("/Headers/b", doc),
        Err(MemberError::Missing {
            member: "/Headers/b".into()
        })
    );
    let not_object = resolve("/Value/x", doc).unwrap_err();
    assert!(
        matches!(&not_object, MemberError::NotObject { at, .. } if at == "/Value"),
        "{not_object:?}"
    );
    assert!(
        not_object
            .to_string()
            .contains("member `/Value` is not a JSON object")
    );
    let top = resolve("/Value", "[1, 2]").unwrap_err();
    assert!(
        top.to_string()
            .starts_with("the value is not a JSON object"),
        "{top}"
    );
    assert!(matches!(
        resolve("/Value", r#"{"Value": 1"#),
        Err(MemberError::NotJson(_))
    ));
    assert!(matches!(
        resolve("/Value", r#"{"Value": 1} trailing"#),
        Err(MemberError::NotJson(_))
    ));
    assert_eq!(
        resolve("/Value", r#"{"Value": 1, "Value": 2}"#),
        Err(MemberError::Twice {
            member: "/Value".into()
        })
    );
}

/// Both members by [`JsonPointer::resolve_pair`], each checked to be what `resolve` gives
/// alone (value or error) and, when found, a sub-slice of the document.
fn pair<'a>(
    a: &str,
    b: &str,
    document: &'a str,
) -> (Result<&'a str, MemberError>, Result<&'a str, MemberError>) {
    let (first, second) = pointer(a).resolve_pair(&pointer(b), document);
    for (p, got) in [(a, &first), (b, &second)] {
        assert_eq!(got, &pointer(p).resolve(document), "{p} in {document}");
        if let Ok(member) = got {
            let start = member.as_ptr() as usize - document.as_ptr() as usize;
            assert_eq!(
                &document[start..start + member.len()],
                *member,
                "a sub-slice"
            );
        }
    }
    (first, second)
}

#[test]
fn one_pass_finds_both_members_in_either_order() {
    let envelope = r#"{"Headers": {"cap-msg-id": "1", "cap-msg-name": "orders"}, "Value": {"price": 12.50, "note": "caf\u00e9 ünï"}}"#;
    let headers = r#"{"cap-msg-id": "1", "cap-msg-name": "orders"}"#;
    let value = r#"{"price": 12.50, "note": "caf\u00e9 ünï"}"#;
    assert_eq!(
        pair("/Value", "/Headers", envelope),
        (Ok(value), Ok(headers))
    );
    assert_eq!(
        pair("/Headers", "/Value", envelope),
        (Ok(headers), Ok(value))
    );
    // The members' order in the document does not matter either.
    let reversed =
        format!(r#"{{"Value": {value}, "Other": [1, {{"Value": 2}}], "Headers": {headers}}}"#);
    assert_eq!(
        pair("/Value", "/Headers", &reversed),
        (Ok(value), Ok(headers))
    );
    // The same pointer twice, and one pointer the prefix of the other.
    assert_eq!(pair("/Value", "/Value", envelope), (Ok(value), Ok(value)));
    assert_eq!(
        pair("/Headers", "/Headers/cap-msg-name", envelope),
        (Ok(headers), Ok(r#""orders""#))
    );
}

#[test]
fn one_pass_follows_nested_pointers_each_its_own_way() {
    let doc =
        r#"{"Content": {"Headers": {"a": "1"}, "Value": {"deep": {"x": [1, 2]}}}, "Content2": 1}"#;
    // A shared first step, then apart.
    assert_eq!(
        pair("/Content/Value/deep", "/Content/Headers", doc),
        (Ok(r#"{"x": [1, 2]}"#), Ok(r#"{"a": "1"}"#))
    );
    // Apart at once, one of them going deeper.
    assert_eq!(
        pair("/Content/Value/deep/x", "/Content2", doc),
        (Ok("[1, 2]"), Ok("1"))
    );
    // A shared step that is missing or not an object fails both, each naming its own pointer.
    assert_eq!(
        pair("/Body/Value", "/Body/Headers", doc),
        (
            Err(MemberError::Missing {
                member: "/Body".into()
            }),
            Err(MemberError::Missing {
                member: "/Body".into()
            })
        )
    );
    let (value, headers) = pair("/Content2/Value", "/Content2/Headers", doc);
    assert!(matches!(value, Err(MemberError::NotObject { at, .. }) if at == "/Content2"));
    assert!(matches!(headers, Err(MemberError::NotObject { at, .. }) if at == "/Content2"));
    // Past the parting, each fails on its own.
    assert_eq!(
        pair("/Content/Value/nope", "/Content/Headers", doc),
        (
            Err(MemberError::Missing {
                member: "/Content/Value/nope".into()
            }),
            Ok(r#"{"a": "1"}"#)
        )
    );
}

#[test]
fn one_pass_reports_either_member_missing_on_its_own() {
    let no_value = r#"{"Headers": {"a": "1"}}"#;
    assert_eq!(
        pair("/Value", "/Headers", no_value),
        (
            Err(MemberError::Missing {
                member: "/Value".into()
            }),
            Ok(r#"{"a": "1"}"#)
        )
    );
    let no_headers = r#"{"Value": 7}"#;
    assert_eq!(
        pair("/Value", "/Headers", no_headers),
        (
            Ok("7"),
            Err(MemberError::Missing {
                member: "/Headers".into()
            })
        )
    );
    assert_eq!(
        pair(
            "/Value",
            "/Headers",
            r#"{"Headers": {}, "Value": 1, "Value": 2}"#
        ),
        (
            Err(MemberError::Twice {
                member: "/Value".into()
            }),
            Ok("{}")
        )
    );
    // Not JSON, or not an object: both fail as each alone would.
    for bad in [
        r#"{"Headers": {}, "Value": 1"#,
        r#"{"Value": 1} trailing"#,
        "[1]",
        "\"text\"",
    ] {
        let (value, headers) = pair("/Value", "/Headers", bad);
        assert!(value.is_err() && headers.is_err(), "{bad}");
    }
    assert!(matches!(
        pair("/Value", "/Headers", r#"{"Value": 1"#).0,
        Err(MemberError::NotJson(_))
    ));
}

#[test]
fn one_pass_reads_keys_written_with_escapes() {
    let doc = r#"{"H\u0065aders": {"a": "1"}, "V\u0061lue": 7, "a/b": 2, "c~d": 3}"#;
    assert_eq!(
        pair("/Value", "/Headers", doc),
        (Ok("7"), Ok(r#"{"a": "1"}"#))
    );
    assert_eq!(pair("/a~1b", "/c~0d", doc), (Ok("2"), Ok("3")));
    // A key spelled two ways is the same key, twice.
    assert_eq!(
        pair(
            "/Value",
            "/a~1b",
            r#"{"Value": 1, "V\u0061lue": 2, "a/b": 3}"#
        )
        .0,
        Err(MemberError::Twice {
            member: "/Value".into()
        })
    );
}

fn headers(object: &str) -> Result<Vec<(String, String)>, HeaderObjectError> {
    headers_mapped(object, &|_| false)
}

fn headers_mapped(
    object: &str,
    mapped: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, String)>, HeaderObjectError> {
    let mut out = vec![("Outbox-Table".into(), "public.outbox".into())];
    expand_headers(object, &mut out, mapped)?;
    Ok(out
        .into_iter()
        .skip(1)
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect())
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn an_object_becomes_headers_in_order() {
    let got = headers(
        r#"{"MessageType": "urn:message:Acme:OrderPlaced", "Retry": 3, "Price": 12.50, "Big": 1e3, "Ok": true, "No": false, "Gone": null, "Tags": ["a", "b"], "Nested": {"k": "\u00e9"}, "Text": "caf\u00e9 \"q\"", "Unicode": "ünï 😀"}"#,
    )
    .unwrap();
    assert_eq!(
        got,
        pairs(&[
            ("MessageType", "urn:message:Acme:OrderPlaced"),
            ("Retry", "3"),
            ("Price", "12.50"),
            ("Big", "1e3"),
            ("Ok", "true"),
            ("No", "false"),
            ("Tags", r#"["a","b"]"#),
            ("Nested", r#"{"k":"\u00e9"}"#),
            ("Text", "café \"q\""),
            ("Unicode", "ünï 😀"),
        ])
    );
    assert_eq!(headers("{}").unwrap(), []);
}

#[test]
fn nested_values_are_sent_compacted_with_their_strings_untouched() {
    // A pretty-printed `json` column: line breaks and indentation between the tokens.
    let pretty = "{\n  \"Ctx\": {\n    \"user\": \"a b\",\n    \"q\": \"say \\\"hi\\\" \\\\\",\n    \"n\": [1, 2.50, {\"x\": null}]\n  },\n  \"Flat\": [ ]\n}";
    assert_eq!(
        headers(pretty).unwrap(),
        pairs(&[
            (
                "Ctx",
                r#"{"user":"a b","q":"say \"hi\" \\","n":[1,2.50,{"x":null}]}"#
            ),
            ("Flat", "[]"),
        ])
    );
}

#[test]
fn an_object_of_100000_members_is_refused_at_the_header_limit_within_a_second() {
    // About 1 MB: distinct names, then the same names again.
    let members: Vec<String> = (0..100_000).map(|i| format!("\"h{i}\": \"v\"")).collect();
    let object = format!("{{{}}}", members.join(", "));
    let started = std::time::Instant::now();
    let refused = headers(&object).unwrap_err();
    // Refused at the member whose line crosses the limit, thousands of members in.
    let HeaderObjectError::TooLarge(crossing, 65_535) = &refused else {
        panic!("{refused:?}");
    };
    let lines: usize = (0..)
        .map(|i| header_size::line_len(&format!("h{i}"), "v"))
        .scan(0, |sum, len| {
            *sum += len;
            Some(*sum)
        })
        .take_while(|sum| *sum <= 65_535)
        .count();
    assert_eq!(crossing, &format!("h{lines}"));
    // Repeated names past the scan are still found, by the set.
    let repeated = format!("{{{}, \"h3\": \"again\"}}", members[..40].join(", "));
    assert_eq!(
        headers(&repeated),
        Err(HeaderObjectError::Twice("h3".into()))
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn names_and_values_nats_cannot_carry_are_refused() {
    for (object, want) in [
        (r#"{"a:b": "1"}"#, HeaderObjectError::Name("a:b".into())),
        (r#"{"a b": "1"}"#, HeaderObjectError::Name("a b".into())),
        (r#"{"": "1"}"#, HeaderObjectError::Name(String::new())),
        (r#"{"é": "1"}"#, HeaderObjectError::Name("é".into())),
        (
            r#"{"a\r\nNats-Msg-Id": "1"}"#,
            HeaderObjectError::Name("a\\r\\nNats-Msg-Id".into()),
        ),
        (
            r#"{"A": "1\r\nNats-Msg-Id: x"}"#,
            HeaderObjectError::ControlCharacter("A".into()),
        ),
        (
            r#"{"A": "tab\there"}"#,
            HeaderObjectError::ControlCharacter("A".into()),
        ),
        (
            r#"{"A": "1", "A": "2"}"#,
            HeaderObjectError::Twice("A".into()),
        ),
    ] {
        assert_eq!(headers(object), Err(want), "{object}");
    }
    assert!(matches!(
        headers(r#"{"A": "\ud800"}"#),
        Err(HeaderObjectError::BadString(name, _)) if name == "A"
    ));
    assert!(matches!(
        headers(r#"["a"]"#),
        Err(HeaderObjectError::NotObject(_))
    ));
    assert!(matches!(
        headers(r#""text""#),
        Err(HeaderObjectError::NotObject(_))
    ));
    assert!(matches!(
        headers(r#"{"a": "1""#),
        Err(HeaderObjectError::NotJson(_))
    ));
    assert!(matches!(
        headers("not json"),
        Err(HeaderObjectError::NotJson(_))
    ));
}

#[test]
fn headers_the_relay_or_nats_sets_are_never_taken_from_the_object() {
    for name in [
        "Nats-Msg-Id",
        "nats-msg-id",
        "Nats-Expected-Stream",
        "Nats-Batch-Id",
        "Nats-Batch-Commit",
        "Nats-Rollup",
        "Nats-Anything-New",
        "Outbox-Commit-Lsn",
        "outbox-table",
        "Outbox-Tx-Index",
        "Outbox-Xid",
        "Outbox-Commit-Time",
        "Outbox-Backfill",
        "Outbox-Message-Prefix",
        "Outbox-Dlq-Reason",
        "Outbox-Event-Id",
    ] {
        let object = format!(r#"{{"Fine": "1", "{name}": "forged"}}"#);
        assert_eq!(
            headers(&object),
            Err(HeaderObjectError::Owned(name.into())),
            "{name}"
        );
    }
    let mapped = |name: &str| name.eq_ignore_ascii_case("Outbox-Event-Type");
    assert_eq!(
        headers_mapped(r#"{"outbox-event-type": "x"}"#, &mapped),
        Err(HeaderObjectError::Mapped("outbox-event-type".into()))
    );
    // A mapped header of the default mapping is not the relay's own: fine without a mapping.
    assert_eq!(
        headers(r#"{"Outbox-Event-Type": "x"}"#),
        Ok(pairs(&[("Outbox-Event-Type", "x")]))
    );
}
