//! Subject templates: `outbox.{aggregatetype}.{type}` filled from row columns.
//!
//! **The token rule.** A column value placed into a subject is percent-encoded so that it can
//! never change the subject's shape: every byte outside printable ASCII, whitespace, and the
//! characters `.` (token separator), `*` and `>` (wildcards), `$` (reserved `$JS`/`$SYS`
//! prefixes) and `%` (the escape itself, so the encoding stays reversible) becomes `%XX`. So
//! `a.b` becomes `a%2Eb` and `$JS.API.STREAM.DELETE.X` stays one harmless token. A NULL or empty
//! value cannot be encoded into a token and is rejected: the row fails closed.
//!
//! **The levels rule.** A `{levels:column}` placeholder keeps the value's dots as subject levels
//! (`orders.created` → two levels): the value is split at `.`, every level is checked and then
//! escaped by the token rule. A level that is empty (`a..b`, a leading or trailing dot) or holds
//! `*`, `>`, whitespace or a control character is refused, as is a value of more than
//! [`MAX_SUBJECT_LEVELS`] levels: such a row is a bad row, never a subject of another shape.

use std::fmt;

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

/// Bytes that are percent-encoded inside a subject token (non-ASCII is always encoded).
const SUBJECT_TOKEN_ESCAPES: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'.')
    .add(b'*')
    .add(b'>')
    .add(b'$')
    .add(b'%');

/// Whether `byte` stays as it is in a subject token: printable ASCII outside
/// [`SUBJECT_TOKEN_ESCAPES`] (a test checks the two agree on every byte).
fn needs_no_escape(byte: u8) -> bool {
    byte.is_ascii_graphic() && !matches!(byte, b'.' | b'*' | b'>' | b'$' | b'%')
}

/// The most subject levels one `{levels:column}` value may make: a bound of the relay's own
/// against a runaway value (a sentence, a list of host names); the whole subject is further
/// bounded by the server's `max_control_line` (see `route::limits`).
pub const MAX_SUBJECT_LEVELS: usize = 32;

/// The placeholder prefix that keeps a value's dots as subject levels: `{levels:column}`.
pub const LEVELS_PREFIX: &str = "levels:";

/// NATS subject matching: `*` matches one token, `>` one or more trailing tokens.
pub fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Appends `value` to `out` as subject text, escaped by the token rule.
pub fn push_escaped_token(out: &mut String, value: &str) {
    // Most values need no escape: one pass over the bytes instead of the encoder's chunks.
    if value.bytes().all(needs_no_escape) {
        out.push_str(value);
        return;
    }
    for part in utf8_percent_encode(value, SUBJECT_TOKEN_ESCAPES) {
        out.push_str(part);
    }
}

/// Why a value cannot be subject levels (see the levels rule in the module docs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LevelsError {
    /// A level is empty: `a..b`, or a leading or trailing dot.
    #[error("level {level} is empty (`..`, or a leading or trailing dot)")]
    EmptyLevel {
        /// 1-based position of the level.
        level: usize,
    },
    /// A level holds `*` or `>`, which NATS reads as wildcards.
    #[error("level {level} `{text}` holds a wildcard (`*` or `>`)")]
    Wildcard {
        /// 1-based position of the level.
        level: usize,
        /// The level, escaped and cut when long.
        text: String,
    },
    /// A level holds whitespace or a control character, which no NATS subject can carry.
    #[error("level {level} `{text}` holds whitespace or a control character")]
    Unprintable {
        /// 1-based position of the level.
        level: usize,
        /// The level, escaped and cut when long.
        text: String,
    },
    /// More levels than [`MAX_SUBJECT_LEVELS`].
    #[error("the value has more than {max} levels")]
    TooMany {
        /// The limit.
        max: usize,
    },
}

/// A level for an error text: control characters escaped, cut when long.
fn level_text(level: &str) -> String {
    let text = level.escape_debug().to_string();
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Appends `value` to `out` as subject levels under the levels rule: split at `.`, each level
/// checked and escaped by the token rule. `value` must be non-empty (an empty value is the
/// caller's NULL-or-empty case). On an error `out` holds part of the value: discard it.
pub fn push_levels(out: &mut String, value: &str) -> Result<(), LevelsError> {
    // The common case: printable ASCII that needs no escape, dots between non-empty levels.
    let plain = !value.is_empty()
        && value.bytes().all(|b| b == b'.' || needs_no_escape(b))
        && !value.starts_with('.')
        && !value.ends_with('.')
        && !value.contains("..");
    if plain && value.bytes().filter(|b| *b == b'.').count() < MAX_SUBJECT_LEVELS {
        out.push_str(value);
        return Ok(());
    }
    for (i, level) in value.split('.').enumerate() {
        let number = i + 1;
        if number > MAX_SUBJECT_LEVELS {
            return Err(LevelsError::TooMany {
                max: MAX_SUBJECT_LEVELS,
            });
        }
        if level.is_empty() {
            return Err(LevelsError::EmptyLevel { level: number });
        }
        if level.contains(['*', '>']) {
            return Err(LevelsError::Wildcard {
                level: number,
                text: level_text(level),
            });
        }
        if level.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(LevelsError::Unprintable {
                level: number,
                text: level_text(level),
            });
        }
        if i > 0 {
            out.push('.');
        }
        push_escaped_token(out, level);
    }
    Ok(())
}

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Fixed subject text, dots included.
    Literal(String),
    /// The value of the named column, escaped by the token rule.
    Column(String),
    /// `{levels:column}`: the value of the named column as subject levels, under the levels
    /// rule. Always whole tokens: a dot or the template's start before it, a dot or its end
    /// after it.
    Levels(String),
}

/// A parsed, validated subject template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    source: String,
    segments: Vec<Segment>,
}

/// Why a template was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template is empty.
    #[error("subject template is empty")]
    Empty,
    /// `{` without a matching `}` or the reverse.
    #[error("subject template `{0}` has an unbalanced `{{` or `}}`")]
    Unbalanced(String),
    /// `{}`.
    #[error("subject template `{0}` has an empty placeholder `{{}}`")]
    EmptyPlaceholder(String),
    /// A token made only of fixed text is empty (`a..b`, leading or trailing dot) or holds a
    /// wildcard or whitespace.
    #[error(
        "subject template `{template}` has an invalid token `{token}`: tokens must be non-empty and hold no `*`, `>` or whitespace"
    )]
    InvalidToken {
        /// The template.
        template: String,
        /// The offending token.
        token: String,
    },
    /// A `{levels:column}` placeholder shares a token with other text or another placeholder.
    #[error(
        "subject template `{template}`: `{{{placeholder}}}` must be whole subject tokens (a `.` or the template's start before it, a `.` or its end after it)"
    )]
    LevelsNotWholeTokens {
        /// The template.
        template: String,
        /// The placeholder, without braces.
        placeholder: String,
    },
    /// Starts with `$`, the prefix NATS reserves for its own APIs.
    #[error("subject template `{0}` starts with `$`, which NATS reserves for system subjects")]
    Reserved(String),
}

impl SubjectTemplate {
    /// Parses `template`; placeholders are `{column}` and `{levels:column}`.
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        if template.is_empty() {
            return Err(TemplateError::Empty);
        }
        if template.starts_with('$') {
            return Err(TemplateError::Reserved(template.to_owned()));
        }
        let mut segments = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    segments.push(Segment::Literal(rest.to_owned()));
                    rest = "";
                }
                Some(i) if rest.as_bytes().get(i) == Some(&b'}') => {
                    return Err(TemplateError::Unbalanced(template.to_owned()));
                }
                Some(i) => {
                    if i > 0 {
                        segments.push(Segment::Literal(rest[..i].to_owned()));
                    }
                    let after = &rest[i + 1..];
                    let close = after
                        .find('}')
                        .ok_or_else(|| TemplateError::Unbalanced(template.to_owned()))?;
                    let name = &after[..close];
                    if name.contains('{') {
                        return Err(TemplateError::Unbalanced(template.to_owned()));
                    }
                    if name.trim().is_empty() {
                        return Err(TemplateError::EmptyPlaceholder(template.to_owned()));
                    }
                    let name = name.trim();
                    let segment = match name.strip_prefix(LEVELS_PREFIX) {
                        Some(column) if column.trim().is_empty() => {
                            return Err(TemplateError::EmptyPlaceholder(template.to_owned()));
                        }
                        Some(column) => Segment::Levels(column.trim().to_owned()),
                        None => Segment::Column(name.to_owned()),
                    };
                    segments.push(segment);
                    rest = &after[close + 1..];
                }
            }
        }
        for (i, segment) in segments.iter().enumerate() {
            let Segment::Levels(column) = segment else {
                continue;
            };
            let before = i.checked_sub(1).map(|b| &segments[b]);
            let after = segments.get(i + 1);
            let starts_token = match before {
                None => true,
                Some(Segment::Literal(l)) => l.ends_with('.'),
                Some(_) => false,
            };
            let ends_token = match after {
                None => true,
                Some(Segment::Literal(l)) => l.starts_with('.'),
                Some(_) => false,
            };
            if !(starts_token && ends_token) {
                return Err(TemplateError::LevelsNotWholeTokens {
                    template: template.to_owned(),
                    placeholder: format!("{LEVELS_PREFIX}{column}"),
                });
            }
        }
        // Validate the fixed text token by token: a placeholder always yields non-empty,
        // checked tokens, so only tokens made purely of literals can be wrong.
        let shape: String = segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.as_str(),
                Segment::Column(_) | Segment::Levels(_) => "x",
            })
            .collect();
        for token in shape.split('.') {
            let bad = token.is_empty()
                || token.contains(['*', '>'])
                || token.chars().any(|c| c.is_whitespace() || c.is_control());
            if bad {
                return Err(TemplateError::InvalidToken {
                    template: template.to_owned(),
                    token: token.to_owned(),
                });
            }
        }
        Ok(Self {
            source: template.to_owned(),
            segments,
        })
    }

    /// The parsed pieces.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Column names the template reads, in order of appearance.
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Column(c) | Segment::Levels(c) => Some(c.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// A subject of this template's shape with every placeholder replaced by `token` (one
    /// level for a `{levels:…}` placeholder).
    pub fn sample(&self, token: &str) -> String {
        self.sample_with_levels(token, 1)
    }

    /// Subjects of every shape this template makes, for checking at start-up that a stream
    /// captures them: [`Self::sample`], and with `{levels:…}` placeholders also the subject
    /// with two levels in their place (a stream that captures one and two levels there, e.g.
    /// `cap.>`, captures any number; one listing `cap.*` and `cap.*.*` only would be caught
    /// at publish time instead, as "no responders").
    pub fn samples(&self, token: &str) -> Vec<String> {
        let mut out = vec![self.sample(token)];
        if self
            .segments
            .iter()
            .any(|s| matches!(s, Segment::Levels(_)))
        {
            out.push(self.sample_with_levels(token, 2));
        }
        out
    }

    fn sample_with_levels(&self, token: &str, levels: usize) -> String {
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Literal(l) => out.push_str(l),
                Segment::Column(_) => push_escaped_token(&mut out, token),
                Segment::Levels(_) => {
                    for level in 0..levels {
                        if level > 0 {
                            out.push('.');
                        }
                        push_escaped_token(&mut out, token);
                    }
                }
            }
        }
        out
    }
}

impl fmt::Display for SubjectTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
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
}
