use super::*;

#[test]
fn literals_and_identifiers_cannot_escape() {
    assert_eq!(quote_literal("a'b\\c"), "E'a''b\\\\c'");
    assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
}

#[test]
fn explain_rows() {
    assert_eq!(
        plan_rows("Seq Scan on outbox  (cost=0.00..412.00 rows=20000 width=4)"),
        Some(20_000)
    );
    assert_eq!(plan_rows("Result"), None);
}

#[test]
fn an_event_id_filter_quotes_the_column_and_every_id_whatever_the_string_setting() {
    assert_eq!(
        super::event_id_filter("id", &["a".into(), "b'c".into()]),
        r#""id" IN (E'a', E'b''c')"#
    );
    // A backslash cannot end the literal early, even with standard_conforming_strings = off.
    assert_eq!(
        super::event_id_filter("Id\"x", &[r"x\') OR (true".into()]),
        r#""Id""x" IN (E'x\\'') OR (true')"#
    );
}
