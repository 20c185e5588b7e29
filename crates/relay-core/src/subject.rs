//! Subject templates: `outbox.{aggregatetype}.{type}` filled from row columns.
//!
//! **The token rule.** A column value placed into a subject is percent-encoded so that it can
//! never change the subject's shape: every byte outside printable ASCII, whitespace, and the
//! characters `.` (token separator), `*` and `>` (wildcards), `$` (reserved `$JS`/`$SYS`
//! prefixes) and `%` (the escape itself, so the encoding stays reversible) becomes `%XX`. So
//! `a.b` becomes `a%2Eb` and `$JS.API.STREAM.DELETE.X` stays one harmless token. A NULL or empty
//! value cannot be encoded into a token and is rejected: the row fails closed.

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

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Fixed subject text, dots included.
    Literal(String),
    /// The value of the named column, escaped by the token rule.
    Column(String),
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
    /// Starts with `$`, the prefix NATS reserves for its own APIs.
    #[error("subject template `{0}` starts with `$`, which NATS reserves for system subjects")]
    Reserved(String),
}

impl SubjectTemplate {
    /// Parses `template`; placeholders are `{column}`.
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
                    segments.push(Segment::Column(name.trim().to_owned()));
                    rest = &after[close + 1..];
                }
            }
        }
        // Validate the fixed text token by token: a placeholder always yields a non-empty,
        // separator-free token, so only tokens made purely of literals can be wrong.
        let shape: String = segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => l.as_str(),
                Segment::Column(_) => "x",
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
            Segment::Column(c) => Some(c.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// A subject of this template's shape with every placeholder replaced by `token`, for
    /// checking at start-up that a stream captures the template's subjects.
    pub fn sample(&self, token: &str) -> String {
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Literal(l) => out.push_str(l),
                Segment::Column(_) => push_escaped_token(&mut out, token),
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
}
