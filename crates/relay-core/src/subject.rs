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
    // Long: one pass over the template's grammar (literals, `{column}`, `{levels:column}`) with its
    // errors in place
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

    /// Whether the template starts with a placeholder (`{levels:Name}`, a framework's topic as
    /// the whole subject): no sample of it says which subjects a stream must capture.
    pub fn starts_with_placeholder(&self) -> bool {
        !matches!(self.segments.first(), Some(Segment::Literal(_)) | None)
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
mod tests;
