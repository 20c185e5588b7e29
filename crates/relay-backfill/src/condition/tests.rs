use super::*;

fn refused(text: &str) -> ConditionError {
    match check_condition(text) {
        Ok(()) => panic!("accepted {text:?}"),
        Err(e) => e,
    }
}

#[test]
fn one_condition_passes_whatever_its_literals_hold() {
    for text in [
        "aggregateid = '1'",
        "aggregateid = '1' OR aggregateid = '2'",
        "(aggregateid = '1') OR (aggregateid = '2')",
        "aggregateid::int % 10 = 0",
        "created_at > now() - interval '7 days'",
        "coalesce(a, b) IN (1, (2), 3)",
        // Parentheses, quotes, `;` and comment marks inside literals are characters.
        "aggregateid = ')'",
        "aggregateid = '(' OR aggregateid = ') OR (true'",
        "aggregateid = 'it''s ) ; -- /*'",
        "aggregateid = E'\\') OR (true'",
        "aggregateid = e'a\\\\' AND b = ')'",
        "aggregateid = U&'d\\0061t)'",
        "aggregateid = N'))'",
        "\"we)ird\"\"col\" = 1",
        "\"a;b--c/*\" IS NOT NULL",
        "payload = $$) OR (true$$",
        "payload = $x$ ) ; -- $y$ ( $x$",
        "payload::text LIKE $q$%'%$q$",
        "bits = B'1010'",
        "raw = X'DEADbeef'",
        // PostgreSQL's operators and identifiers.
        "payload->>'kind' = 'a' AND tags @> '{x}' AND j ? 'k' AND j #>> '{a,b}' = 'c'",
        "a$b = 1",
        "größe > 1",
        "type = any (array['a', 'b'])",
        "x[1:2] = '{1,2}'",
        "'t'",
    ] {
        assert_eq!(check_condition(text), Ok(()), "{text}");
    }
}

#[test]
fn the_relays_own_event_id_filter_passes() {
    let filter = crate::event_id_filter("Id\"x", &[r"x\') OR (true".into(), "'".into()]);
    assert_eq!(check_condition(&filter), Ok(()), "{filter}");
}

#[test]
fn a_condition_that_leaves_its_parentheses_is_refused() {
    assert_eq!(
        refused("aggregateid = '1') OR (true"),
        ConditionError::ClosesUnopened
    );
    assert_eq!(refused("true) OR (true"), ConditionError::ClosesUnopened);
    assert_eq!(refused(")("), ConditionError::ClosesUnopened);
    assert_eq!(refused("(true"), ConditionError::LeavesOpen);
    assert_eq!(refused("a IN (1, 2"), ConditionError::LeavesOpen);
    // The quote hides nothing: `\` is a character in a plain string (the session's
    // standard_conforming_strings = on).
    assert_eq!(
        refused("a = '\\') OR (true --'"),
        ConditionError::ClosesUnopened
    );
}

#[test]
fn a_second_statement_or_a_comment_is_refused() {
    assert_eq!(
        refused("true; DELETE FROM outbox"),
        ConditionError::EndsStatement
    );
    assert_eq!(refused("true;"), ConditionError::EndsStatement);
    assert_eq!(refused("true -- and the rest"), ConditionError::Comment);
    assert_eq!(refused("true --"), ConditionError::Comment);
    assert_eq!(refused("true /* x */"), ConditionError::Comment);
    assert_eq!(refused("a = 1 /* ) */"), ConditionError::Comment);
    assert_eq!(
        refused("a /* /* nested */ ) */ = 1"),
        ConditionError::Comment
    );
    assert_eq!(refused("-- only a comment"), ConditionError::Comment);
    // PostgreSQL ends an operator where a comment starts.
    assert_eq!(refused("a @-- (\n) OR (true)"), ConditionError::Comment);
    assert_eq!(refused("a=--1\n"), ConditionError::Comment);
}

#[test]
fn text_the_tokenizer_could_read_otherwise_is_refused() {
    // PostgreSQL: the parameter `$1`, then `$ ) $`; the tokenizer: a dollar quote.
    assert!(matches!(
        refused("a = $1$ ) OR ( $1$"),
        ConditionError::Parameter(_)
    ));
    assert!(matches!(refused("a = $1"), ConditionError::Parameter(_)));
    // PostgreSQL: a dollar quote tagged `€`; the tokenizer: `$`, then words.
    assert!(matches!(
        refused("a = $€$ ( $€$ ) OR (true)"),
        ConditionError::Parameter(_)
    ));
    // PostgreSQL ends `X'\'` at its second quote; the tokenizer reads `\'` as an escape.
    assert!(matches!(
        refused("a = X'\\' ) OR (true --'"),
        ConditionError::Unclear(_)
    ));
    // PostgreSQL reads the second literal with E's escapes, as part of the first.
    assert!(matches!(
        refused("a = E'x'\n'\\'' ) OR (true '"),
        ConditionError::Unclear(_)
    ));
}

#[test]
fn empty_or_unreadable_text_is_refused() {
    assert_eq!(refused(""), ConditionError::Empty);
    assert_eq!(refused(" \n\t"), ConditionError::Empty);
    for text in [
        "a = 'open",
        "\"open = 1",
        "a = $$open",
        "a = $x$ open $y$",
        "a = E'open\\'",
        "a /* open",
    ] {
        assert!(
            matches!(
                refused(text),
                ConditionError::Unreadable(_) | ConditionError::Comment
            ),
            "{text}"
        );
    }
}

#[test]
fn the_reasons_read_as_a_sentence_after_the_filter() {
    assert_eq!(
        ConditionError::ClosesUnopened.to_string(),
        "closes a parenthesis it did not open"
    );
    assert_eq!(
        ConditionError::EndsStatement.to_string(),
        "holds a `;`, which ends the statement"
    );
}
