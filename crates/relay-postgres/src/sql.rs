//! Quoting for the SQL the relay builds from names and values it was given (tables, columns,
//! partition bounds, mark values). One home, so every statement quotes alike; public for the
//! crates that read and trim outbox tables (relay-backfill, relay-cleanup).

pub use relay_core::ident::{display_relation, quote_displayed, quote_ident, quote_relation};

/// A string literal that reads back as `value` whatever `standard_conforming_strings` says.
#[must_use]
pub fn quote_literal(value: &str) -> String {
    format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// `NOT pg_visible_in_snapshot(xmin, fence)`: the row's transaction is one the fence snapshot
/// (parameter `fence_param`) does not see, i.e. it committed after the fence was taken. `xmin`
/// (32 bits) is widened against the current snapshot's `xmax`: a committed row's `xmin` is
/// below it and, short of 2^32 transactions ago, that many transactions back at most; a value
/// that cannot be widened (a special xid) counts as before the fence. Cleanup's fence, and the
/// backfill at slot creation's snapshot (the rows the slot decodes), use it alike.
#[must_use]
pub fn after_fence(fence_param: &str) -> String {
    let next = "pg_snapshot_xmax(pg_current_snapshot())::text::bigint";
    format!(
        "NOT pg_visible_in_snapshot(GREATEST({next} - (({next} % 4294967296) - xmin::text::bigint + 4294967296) % 4294967296, 3)::text::xid8, {fence_param}::text::pg_snapshot)"
    )
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
