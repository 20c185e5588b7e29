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
