//! Table names as the configuration writes them (`[[outbox]] table`), and the one quoting rule
//! for putting names into SQL.
//!
//! A name is `schema.table`, or `table` for schema `public`. Each part is either
//! - **bare**: taken exactly as written, case kept. Unlike SQL, the relay does not fold a bare
//!   name to lower case: `OutboxEvent` names the table the catalog stores as `OutboxEvent`
//!   (created as `"OutboxEvent"`), which is what the relay has always matched, so configurations
//!   that worked keep working. A bare part holds no `.`, `"`, whitespace or control character;
//! - **double-quoted**, as in SQL: `"watermill_orders.created"`, `"Acme"`, `"my table"`, with `""`
//!   for a `"` inside. Any name the catalog can hold can be written this way.
//!
//! So `"Acme"."OutboxEvent"` and `Acme.OutboxEvent` name the same table, and a table whose name
//! holds a dot needs quotes: `public."watermill_orders.created"`.

use std::borrow::Cow;

/// The schema of a name written without one.
pub const DEFAULT_SCHEMA: &str = "public";

/// PostgreSQL truncates longer identifiers to this many bytes (`NAMEDATALEN - 1`).
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// `"name"`, inner quotes doubled: the SQL form of any identifier.
#[must_use]
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `"schema"."table"`: the SQL form of a table.
#[must_use]
pub fn quote_relation(schema: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(table))
}

/// One part as the configuration writes it: bare when it reads back the same, else quoted.
#[must_use]
pub fn display_part(part: &str) -> Cow<'_, str> {
    if bare_problem(part).is_none() {
        Cow::Borrowed(part)
    } else {
        Cow::Owned(quote_ident(part))
    }
}

/// `schema.table` as the configuration writes it (parts quoted only where needed), e.g.
/// `public.outbox`, `Acme.OutboxEvent`, `public."watermill_orders.created"`. Parses back to the
/// same table, so it serves as the table's name in messages, headers, metrics and records.
#[must_use]
pub fn display_relation(schema: &str, table: &str) -> String {
    format!("{}.{}", display_part(schema), display_part(table))
}

/// The SQL form of a name as [`display_relation`] writes it (`Acme.OutboxEvent` →
/// `"Acme"."OutboxEvent"`), for the statements error messages suggest; text that is no such
/// name is returned as it is.
#[must_use]
pub fn quote_displayed(display: &str) -> String {
    TableName::parse(display).map_or_else(|_| display.to_owned(), |name| name.quoted())
}

/// The configuration line `key = '<value>'` (a TOML literal string where it can be one).
#[must_use]
pub fn toml_line(key: &str, value: &str) -> String {
    if value.contains(['\'', '\n', '\r']) {
        let escaped = value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        format!("{key} = \"{escaped}\"")
    } else {
        format!("{key} = '{value}'")
    }
}

/// A parsed table name: the catalog's `(schema, table)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName<'a> {
    /// The schema, as the catalog stores it.
    pub schema: Cow<'a, str>,
    /// The table, as the catalog stores it.
    pub table: Cow<'a, str>,
    /// Whether the text named the schema (else it is [`DEFAULT_SCHEMA`]).
    pub schema_given: bool,
}

impl<'a> TableName<'a> {
    /// Parses `schema.table` or `table` (see the module documentation).
    pub fn parse(text: &'a str) -> Result<Self, TableNameError> {
        let error = |reason| TableNameError {
            text: text.to_owned(),
            reason,
        };
        let mut parts: Vec<Cow<'a, str>> = Vec::with_capacity(2);
        let mut rest = text;
        loop {
            let (part, after) = match rest.strip_prefix('"') {
                Some(quoted) => split_quoted(quoted).ok_or_else(|| error(Reason::Unclosed))?,
                None => {
                    let end = rest.find('.').unwrap_or(rest.len());
                    let part = &rest[..end];
                    if let Some(reason) = bare_problem(part) {
                        return Err(error(reason));
                    }
                    (Cow::Borrowed(part), &rest[end..])
                }
            };
            if part.is_empty() {
                return Err(error(Reason::EmptyPart));
            }
            if part.contains('\0') {
                return Err(error(Reason::Nul));
            }
            if part.len() > MAX_IDENTIFIER_BYTES {
                return Err(error(Reason::TooLong(truncated(&part).to_owned())));
            }
            parts.push(part);
            match after.chars().next() {
                None => break,
                Some('.') => rest = &after[1..],
                Some(_) => return Err(error(Reason::AfterQuote)),
            }
        }
        let mut parts = parts.into_iter();
        match (parts.next(), parts.next(), parts.len()) {
            (Some(table), None, _) => Ok(Self {
                schema: Cow::Borrowed(DEFAULT_SCHEMA),
                table,
                schema_given: false,
            }),
            (Some(schema), Some(table), 0) => Ok(Self {
                schema,
                table,
                schema_given: true,
            }),
            (Some(schema), Some(table), more) => {
                let rest: Vec<Cow<'_, str>> =
                    std::iter::once(table).chain(parts).collect::<Vec<_>>();
                let joined = rest.join(".");
                Err(error(Reason::TooManyParts {
                    count: more + 2,
                    suggestion: display_relation(&schema, &joined),
                }))
            }
            (None, _, _) => Err(error(Reason::EmptyPart)),
        }
    }

    /// As the configuration writes it ([`display_relation`]).
    #[must_use]
    pub fn display(&self) -> String {
        display_relation(&self.schema, &self.table)
    }

    /// The SQL form ([`quote_relation`]).
    #[must_use]
    pub fn quoted(&self) -> String {
        quote_relation(&self.schema, &self.table)
    }
}

/// The part after an opening quote up to its closing quote (`""` read as `"`), and the rest.
fn split_quoted(quoted: &str) -> Option<(Cow<'_, str>, &str)> {
    let mut value: Option<String> = None;
    let mut start = 0;
    let bytes = quoted.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            if bytes.get(i + 1) == Some(&b'"') {
                value
                    .get_or_insert_with(String::new)
                    .push_str(&quoted[start..=i]);
                i += 2;
                start = i;
                continue;
            }
            let part = match value {
                None => Cow::Borrowed(&quoted[..i]),
                Some(mut v) => {
                    v.push_str(&quoted[start..i]);
                    Cow::Owned(v)
                }
            };
            return Some((part, &quoted[i + 1..]));
        }
        i += 1;
    }
    None
}

/// Why `part` cannot be written bare, if it cannot.
fn bare_problem(part: &str) -> Option<Reason> {
    if part.is_empty() {
        return Some(Reason::EmptyPart);
    }
    part.chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == '"' || *c == '.')
        .map(Reason::BareChar)
}

/// The longest prefix of `part` of at most [`MAX_IDENTIFIER_BYTES`] that ends on a character
/// boundary: what PostgreSQL keeps of a longer identifier.
fn truncated(part: &str) -> &str {
    let mut end = MAX_IDENTIFIER_BYTES.min(part.len());
    while !part.is_char_boundary(end) {
        end -= 1;
    }
    &part[..end]
}

/// A table name that cannot name a table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("outbox table name `{text}` {reason}")]
pub struct TableNameError {
    /// The name as written.
    pub text: String,
    /// Why.
    pub reason: Reason,
}

/// Why a table name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// `a..b`, `.a`, `""`.
    #[error("has an empty part: write `schema.table` or `table`")]
    EmptyPart,
    /// A bare part with a character that needs quotes.
    #[error(
        "has {0:?} in a part without double quotes: double-quote a part that holds a dot, a double quote, whitespace or a control character, e.g. table = 'public.\"my table\"'"
    )]
    BareChar(char),
    /// An opening quote without its closing quote.
    #[error("has a double quote that is not closed (write `\"\"` for a double quote inside one)")]
    Unclosed,
    /// Text right after a closing quote.
    #[error("has text after a closing double quote: a part is all quoted or not at all")]
    AfterQuote,
    /// A NUL character, which no identifier holds.
    #[error("has a NUL character")]
    Nul,
    /// Longer than PostgreSQL keeps.
    #[error(
        "has a part longer than 63 bytes, which PostgreSQL truncated to `{0}` when the table was created: write that"
    )]
    TooLong(String),
    /// More than `schema.table`.
    #[error(
        "has {count} dot-separated parts; a name that holds a dot must be double-quoted, e.g. table = '{suggestion}'"
    )]
    TooManyParts {
        /// How many.
        count: usize,
        /// The first part as the schema, the rest as one quoted table name.
        suggestion: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(text: &str) -> (String, String) {
        let name = TableName::parse(text).unwrap_or_else(|e| panic!("{e}"));
        (name.schema.into_owned(), name.table.into_owned())
    }

    fn pair(schema: &str, table: &str) -> (String, String) {
        (schema.to_owned(), table.to_owned())
    }

    #[test]
    fn bare_parts_are_taken_exactly() {
        assert_eq!(parts("outbox"), pair("public", "outbox"));
        assert_eq!(parts("app.outbox"), pair("app", "outbox"));
        // No case folding: the catalog's spelling.
        assert_eq!(parts("Acme.OutboxEvent"), pair("Acme", "OutboxEvent"));
        assert!(!TableName::parse("outbox").unwrap().schema_given);
        assert!(TableName::parse("public.outbox").unwrap().schema_given);
    }

    #[test]
    fn quoted_parts_hold_dots_quotes_spaces_and_case() {
        assert_eq!(
            parts(r#"public."watermill_orders.created""#),
            pair("public", "watermill_orders.created")
        );
        assert_eq!(
            parts(r#""Acme"."OutboxEvent""#),
            pair("Acme", "OutboxEvent")
        );
        assert_eq!(parts(r#""my schema".t"#), pair("my schema", "t"));
        assert_eq!(parts(r#""we""ird""#), pair("public", "we\"ird"));
        assert_eq!(parts(r#""a.b"."c.d""#), pair("a.b", "c.d"));
    }

    #[test]
    fn bad_names_are_refused_with_the_fix() {
        for (text, expect) in [
            ("", "empty part"),
            ("a..b", "empty part"),
            (".a", "empty part"),
            ("a.", "empty part"),
            (r#""""#, "empty part"),
            ("my table", "double-quote a part"),
            (" outbox", "double-quote a part"),
            (r#""open"#, "not closed"),
            (r#""a"b"#, "after a closing"),
            (r#"a"b""#, "double-quote a part"),
            ("a\0b", "double-quote a part"),
            ("\"a\0b\"", "NUL"),
        ] {
            let error = TableName::parse(text).expect_err(text).to_string();
            assert!(error.contains(expect), "{text:?}: {error}");
        }
        let error = TableName::parse("public.watermill_orders.created").unwrap_err();
        assert_eq!(
            error.reason,
            Reason::TooManyParts {
                count: 3,
                suggestion: r#"public."watermill_orders.created""#.into()
            }
        );
        let long = "é".repeat(40); // 80 bytes
        let error = TableName::parse(&long).unwrap_err();
        assert_eq!(error.reason, Reason::TooLong("é".repeat(31)));
        assert!(TableName::parse(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn display_round_trips_and_quotes_only_where_needed() {
        for (schema, table, shown) in [
            ("public", "outbox", "public.outbox"),
            ("Acme", "OutboxEvent", "Acme.OutboxEvent"),
            (
                "public",
                "watermill_orders.created",
                r#"public."watermill_orders.created""#,
            ),
            ("my schema", "we\"ird", r#""my schema"."we""ird""#),
        ] {
            assert_eq!(display_relation(schema, table), shown);
            assert_eq!(parts(shown), pair(schema, table));
        }
        assert_eq!(quote_displayed(r#"public."a.b""#), r#""public"."a.b""#);
        assert_eq!(quote_relation("public", "a.\"b"), r#""public"."a.""b""#);
    }

    #[test]
    fn toml_lines_read_back() {
        assert_eq!(
            toml_line("table", r#"public."a.b""#),
            r#"table = 'public."a.b"'"#
        );
        assert_eq!(toml_line("table", r#""it's""#), r#"table = "\"it's\"""#);
    }
}
