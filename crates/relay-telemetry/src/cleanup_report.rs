//! What a cleanup task reports, kept per table for `/metrics` and `/status`.

use relay_cleanup::CleanupReport;

use crate::Telemetry;

impl CleanupReport for Telemetry {
    fn cleaned(&self, table: &str, rows: u64, batch: u64) {
        self.update_table(table, |t| {
            t.cleaned_rows += rows;
            t.waiting = t.waiting.saturating_sub(batch);
        });
    }

    fn partitions_dropped(&self, table: &str, dropped: u64, waiting: u64) {
        self.update_table(table, |t| {
            t.dropped_partitions += dropped;
            t.waiting = waiting;
        });
    }

    fn waiting(&self, table: &str, rows: u64) {
        self.update_table(table, |t| t.waiting = rows);
    }

    fn failed(&self, table: &str, problem: String) {
        self.update_table(table, |t| {
            t.cleanup_errors += 1;
            t.last_cleanup_error = Some(problem);
        });
    }
}
