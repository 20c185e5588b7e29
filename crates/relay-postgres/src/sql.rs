//! Quoting for the SQL the relay builds from names and values it was given (tables, columns,
//! partition bounds, mark values). One home, so every statement quotes alike.

pub use relay_core::ident::quote_relation;
pub(crate) use relay_core::ident::{display_relation, quote_displayed, quote_ident};

/// A string literal that reads back as `value` whatever `standard_conforming_strings` says.
#[must_use]
pub(crate) fn quote_literal(value: &str) -> String {
    format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(quote_literal("it's a \\ path"), "E'it''s a \\\\ path'");
    }
}
