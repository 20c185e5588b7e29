//! A condition given as SQL text and spliced into the relay's queries (a backfill's `--where`
//! or a signal's `"where"`, `[[outbox]] row_filter`): it must be ONE condition, which cannot
//! leave the parentheses it is put in, nor the statement. PostgreSQL cannot tell: `a = '1') OR
//! (true` prepared as `WHERE (a = '1') OR (true)` is valid SQL, and so is the page query
//! `WHERE (key > c) AND (key <= e) AND (a = '1') OR (true)`, whose `OR` leaves the key range
//! (every page reads the same rows again, forever).
//!
//! So the text is read as PostgreSQL's lexer reads it, by the PostgreSQL tokenizer of
//! `sqlparser`: string literals (`'…'`, `E'…'` with its backslash escapes, `U&'…'`, `B'…'`,
//! `X'…'`, `N'…'`), quoted identifiers, dollar quoting, comments (nested). What is left outside
//! them must close every parenthesis it opens and none it did not, and hold no `;` and no
//! comment. Where that tokenizer could read a text otherwise than PostgreSQL, the text is
//! refused rather than judged (each case is below). The literals follow
//! `standard_conforming_strings = on` (a backslash in `'…'` is a character): the backfill's
//! read session sets it.

use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::tokenizer::{Token, Tokenizer, Whitespace};

/// Why a condition's text is not one condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    /// Nothing but spaces.
    #[error("is empty")]
    Empty,
    /// A `)` before its `(`: the rest is outside the parentheses the condition is put in.
    #[error("closes a parenthesis it did not open")]
    ClosesUnopened,
    /// A `(` never closed: it would take in what the query puts after the condition.
    #[error("opens a parenthesis it does not close")]
    LeavesOpen,
    /// A `;`.
    #[error("holds a `;`, which ends the statement")]
    EndsStatement,
    /// A `--` or `/* */` comment.
    #[error("holds a comment (`--` or `/* */`), which would hide what the query puts after it")]
    Comment,
    /// `$1`: a condition has no parameters (and `$1$…$1$` is no dollar quote to PostgreSQL); or
    /// a `$` the tokenizer does not take as a dollar quote where PostgreSQL may (`$€$`).
    #[error(
        "holds `{0}`, a parameter or a dollar quote this check cannot read (a condition has no parameters; a dollar quote's tag is ASCII letters, digits and `_`, not starting with a digit)"
    )]
    Parameter(String),
    /// Text PostgreSQL's lexer reads otherwise than this check's tokenizer could.
    #[error("holds {0}")]
    Unclear(&'static str),
    /// Not readable as SQL at all (an unterminated literal, a bad escape).
    #[error("cannot be read as SQL: {0}")]
    Unreadable(String),
}

/// Checks that `text` is one condition (see the module documentation); says why not.
pub fn check_condition(text: &str) -> Result<(), ConditionError> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, text)
        .with_unescape(false)
        .tokenize()
        .map_err(|e| ConditionError::Unreadable(e.to_string()))?;
    // The text outside literals and quoted identifiers, each of those one space.
    let mut code = String::with_capacity(text.len());
    // The last token other than whitespace was a string literal.
    let mut after_string = false;
    let blank = |t: &Token| {
        matches!(
            t,
            Token::Whitespace(Whitespace::Space | Whitespace::Newline | Whitespace::Tab)
        )
    };
    if tokens.iter().all(blank) {
        return Err(ConditionError::Empty);
    }
    for token in &tokens {
        match literal(token)? {
            Some(Literal::String) if after_string => {
                // `E'a'` then `'\'…'` on the next line: PostgreSQL reads both as ONE literal with
                // E's escapes, the tokenizer the second as a plain one.
                return Err(ConditionError::Unclear(
                    "two string literals in a row (PostgreSQL joins them across a line break): write them as one",
                ));
            }
            Some(kind) => {
                after_string = kind == Literal::String;
                code.push(' ');
            }
            None => {
                if !blank(token) {
                    after_string = false;
                }
                code.push_str(&token.to_string());
            }
        }
    }
    check_code(&code)
}

/// What a literal token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Literal {
    /// A string constant of any kind (dollar-quoted too).
    String,
    /// A quoted identifier.
    Identifier,
}

/// Whether `token` is a literal whose extent PostgreSQL reads as the tokenizer does; an error
/// where it may not.
fn literal(token: &Token) -> Result<Option<Literal>, ConditionError> {
    Ok(match token {
        Token::SingleQuotedString(_)
        | Token::EscapedStringLiteral(_)
        | Token::UnicodeStringLiteral(_)
        | Token::NationalStringLiteral(_)
        | Token::SingleQuotedByteStringLiteral(_)
        | Token::DoubleQuotedByteStringLiteral(_) => Some(Literal::String),
        // The tokenizer lets a backslash escape a quote in `X'…'`, PostgreSQL does not (and
        // takes nothing but hex digits there).
        Token::HexStringLiteral(digits) if digits.chars().all(|c| c.is_ascii_hexdigit()) => {
            Some(Literal::String)
        }
        Token::HexStringLiteral(_) => {
            return Err(ConditionError::Unclear(
                "a hex string `X'…'` with something other than hex digits",
            ));
        }
        // `$1$…$1$` is a parameter and more to PostgreSQL, a dollar quote to the tokenizer.
        Token::DollarQuotedString(quoted)
            if quoted
                .tag
                .as_deref()
                .is_some_and(|tag| tag.starts_with(|c: char| c.is_ascii_digit())) =>
        {
            return Err(ConditionError::Parameter(format!(
                "${}$",
                quoted.tag.as_deref().unwrap_or_default()
            )));
        }
        Token::DollarQuotedString(_) => Some(Literal::String),
        Token::Word(word) if word.quote_style.is_some() => Some(Literal::Identifier),
        // `$1`, or a `$` the tokenizer does not take as a dollar quote where PostgreSQL may
        // (`$€$`: PostgreSQL takes any non-ASCII character into a tag).
        Token::Placeholder(p) => return Err(ConditionError::Parameter(p.clone())),
        // Comments stay in the text (`--…`, `/*…*/`): [`check_code`] refuses them there, in
        // order with what comes before them.
        _ => None,
    })
}

/// Checks the text outside literals: parentheses, `;`, comments. Comments are looked for in the
/// text too, not only as the tokenizer's comment tokens: PostgreSQL ends an operator where `--`
/// or `/*` starts (`@--` is `@` and a comment), the tokenizer may read them as one operator.
fn check_code(code: &str) -> Result<(), ConditionError> {
    let mut depth: usize = 0;
    for (at, c) in code.char_indices() {
        let rest = &code[at..];
        if rest.starts_with("--") || rest.starts_with("/*") {
            return Err(ConditionError::Comment);
        }
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or(ConditionError::ClosesUnopened)?,
            ';' => return Err(ConditionError::EndsStatement),
            // Every literal was replaced: a quote left is one the tokenizer gave a kind of
            // literal this check does not know.
            '\'' | '"' => {
                return Err(ConditionError::Unclear(
                    "a quoted text this check cannot place",
                ));
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(ConditionError::LeavesOpen);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
