use super::*;

/// The fast path's byte rule and the encoder's set agree on every byte (and so on every
/// string, which the encoder handles byte by byte; non-ASCII is always encoded).
#[test]
fn the_no_escape_rule_is_the_escape_set() {
    for byte in 0..=u8::MAX {
        let by_encoder = byte.is_ascii()
            && utf8_percent_encode(
                std::str::from_utf8(&[byte]).expect("ASCII"),
                SUBJECT_TOKEN_ESCAPES,
            )
            .to_string()
                == char::from(byte).to_string();
        assert_eq!(needs_no_escape(byte), by_encoder, "byte {byte:#04x}");
    }
}

fn escaped(v: &str) -> String {
    let mut s = String::new();
    push_escaped_token(&mut s, v);
    s
}

#[test]
fn parses_placeholders_and_literals() {
    let t = SubjectTemplate::parse("outbox.{aggregatetype}.{type}").unwrap();
    assert_eq!(
        t.segments(),
        &[
            Segment::Literal("outbox.".into()),
            Segment::Column("aggregatetype".into()),
            Segment::Literal(".".into()),
            Segment::Column("type".into()),
        ]
    );
    assert_eq!(t.columns().collect::<Vec<_>>(), ["aggregatetype", "type"]);
    assert_eq!(t.sample("x"), "outbox.x.x");
    let mixed = SubjectTemplate::parse("t.{tenant_id}-orders.{event_type}").unwrap();
    assert_eq!(mixed.sample("v"), "t.v-orders.v");
}

#[test]
fn refuses_bad_templates() {
    assert_eq!(SubjectTemplate::parse(""), Err(TemplateError::Empty));
    for bad in ["a..b", ".a", "a.", "a.*", "a.>", "a b.{x}", "{x}..y"] {
        assert!(
            matches!(
                SubjectTemplate::parse(bad),
                Err(TemplateError::InvalidToken { .. })
            ),
            "{bad}"
        );
    }
    for bad in ["a.{x", "a.x}", "a.{x{y}}"] {
        assert!(
            matches!(
                SubjectTemplate::parse(bad),
                Err(TemplateError::Unbalanced(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        SubjectTemplate::parse("a.{}"),
        Err(TemplateError::EmptyPlaceholder(_))
    ));
    assert!(matches!(
        SubjectTemplate::parse("$JS.{x}"),
        Err(TemplateError::Reserved(_))
    ));
}

#[test]
fn token_rule_keeps_values_inside_one_token() {
    assert_eq!(escaped("Order"), "Order");
    assert_eq!(escaped("order-item_v2"), "order-item_v2");
    assert_eq!(escaped("a.b"), "a%2Eb");
    assert_eq!(escaped("*"), "%2A");
    assert_eq!(escaped(">"), "%3E");
    assert_eq!(escaped("a b\tc"), "a%20b%09c");
    assert_eq!(
        escaped("$JS.API.STREAM.DELETE.X"),
        "%24JS%2EAPI%2ESTREAM%2EDELETE%2EX"
    );
    assert_eq!(escaped("50%"), "50%25");
    assert_eq!(escaped("é"), "%C3%A9");
    for v in [
        "a.b",
        "*",
        ">",
        "x y",
        "\u{1F600}",
        "\u{5D0}\u{5D1}",
        "$SYS",
    ] {
        let e = escaped(v);
        assert!(!e.contains(['.', '*', '>', ' ', '$']), "{v} -> {e}");
        assert!(e.is_ascii());
    }
}

fn levels(v: &str) -> Result<String, LevelsError> {
    let mut s = String::new();
    push_levels(&mut s, v).map(|()| s)
}

#[test]
fn levels_keep_dots_and_escape_each_level_by_the_token_rule() {
    for kept in [
        "orders.created",
        "com.acme.OrderPlaced",
        "urn:message:Acme:OrderPlaced",
        "single",
        "a-b_c.d~e",
    ] {
        assert_eq!(levels(kept).as_deref(), Ok(kept), "{kept}");
    }
    assert_eq!(levels("$JS.API.X").as_deref(), Ok("%24JS.API.X"));
    assert_eq!(levels("50%.x").as_deref(), Ok("50%25.x"));
    assert_eq!(
        levels("caf\u{e9}.cr\u{e9}\u{e9}").as_deref(),
        Ok("caf%C3%A9.cr%C3%A9%C3%A9")
    );
    assert_eq!(levels("\u{1F600}.x").as_deref(), Ok("%F0%9F%98%80.x"));
    let max = vec!["l"; MAX_SUBJECT_LEVELS].join(".");
    assert_eq!(levels(&max).as_deref(), Ok(max.as_str()));
    let max_escaped = vec!["\u{e9}"; MAX_SUBJECT_LEVELS].join(".");
    assert_eq!(
        levels(&max_escaped).map(|s| s.split('.').count()),
        Ok(MAX_SUBJECT_LEVELS)
    );
}

#[test]
fn levels_refuse_empty_levels_wildcards_whitespace_controls_and_too_many() {
    let empty = |level| Err(LevelsError::EmptyLevel { level });
    assert_eq!(levels(""), empty(1));
    assert_eq!(levels(".a"), empty(1));
    assert_eq!(levels("a."), empty(2));
    assert_eq!(levels("a..b"), empty(2));
    assert_eq!(levels("."), empty(1));
    for (value, level) in [
        ("a.*", 2),
        ("*.a", 1),
        ("a.>", 2),
        ("a.b*c.d", 2),
        ("x>", 1),
    ] {
        assert!(
            matches!(levels(value), Err(LevelsError::Wildcard { level: l, .. }) if l == level),
            "{value}"
        );
    }
    for (value, level) in [
        ("a b.c", 1),
        ("a.\tb", 2),
        ("a.b\r\nNats-Msg-Id: x", 2),
        ("a.b\u{a0}", 2),
        ("a.\u{85}", 2),
        ("a.\u{2028}", 2),
        ("\0", 1),
    ] {
        assert!(
            matches!(levels(value), Err(LevelsError::Unprintable { level: l, .. }) if l == level),
            "{value:?}"
        );
    }
    let over = vec!["l"; MAX_SUBJECT_LEVELS + 1].join(".");
    assert_eq!(
        levels(&over),
        Err(LevelsError::TooMany {
            max: MAX_SUBJECT_LEVELS
        })
    );
    let over_escaped = vec!["%"; MAX_SUBJECT_LEVELS + 1].join(".");
    assert!(matches!(
        levels(&over_escaped),
        Err(LevelsError::TooMany { .. })
    ));
}

/// Whatever the value, a success is printable ASCII levels, none empty, none a wildcard.
#[test]
fn levels_never_make_a_wildcard_or_an_unprintable_subject() {
    let parts = [
        "a", "", ".", "*", ">", " ", "\t", "$", "%", "\u{e9}", "\u{a0}", "\u{7f}", "b",
    ];
    for x in parts {
        for y in parts {
            for z in parts {
                let value = format!("{x}{y}{z}");
                if let Ok(out) = levels(&value) {
                    for level in out.split('.') {
                        assert!(!level.is_empty(), "{value:?} -> {out}");
                        assert!(
                            level
                                .bytes()
                                .all(|b| b.is_ascii_graphic() && b != b'*' && b != b'>'),
                            "{value:?} -> {out}"
                        );
                    }
                    assert_eq!(
                        out.split('.').count(),
                        value.split('.').count(),
                        "{value:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn levels_placeholders_are_whole_tokens() {
    let t = SubjectTemplate::parse("cap.{levels:Name}").unwrap();
    assert_eq!(
        t.segments(),
        &[
            Segment::Literal("cap.".into()),
            Segment::Levels("Name".into())
        ]
    );
    assert_eq!(t.columns().collect::<Vec<_>>(), ["Name"]);
    assert_eq!(t.samples("x"), ["cap.x", "cap.x.x"]);
    let middle = SubjectTemplate::parse("a.{ levels: topic }.v1.{kind}").unwrap();
    assert_eq!(middle.samples("x"), ["a.x.v1.x", "a.x.x.v1.x"]);
    assert_eq!(
        SubjectTemplate::parse("{levels:topic}")
            .unwrap()
            .samples("x"),
        ["x", "x.x"]
    );
    assert_eq!(
        SubjectTemplate::parse("outbox.{a}").unwrap().samples("x"),
        ["outbox.x"]
    );
    for bad in [
        "cap.x{levels:Name}",
        "cap.{levels:Name}x",
        "{a}{levels:b}",
        "{levels:b}{a}",
        "cap.{levels:a}{levels:b}",
    ] {
        assert!(
            matches!(
                SubjectTemplate::parse(bad),
                Err(TemplateError::LevelsNotWholeTokens { .. })
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        SubjectTemplate::parse("cap.{levels: }"),
        Err(TemplateError::EmptyPlaceholder(_))
    ));
    assert!(matches!(
        SubjectTemplate::parse("$JS.{levels:x}"),
        Err(TemplateError::Reserved(_))
    ));
}
