//! The ledger table: which events each consumer has applied.

use std::time::Duration;

use tokio_postgres::Client;

/// The ledger table's name (in the first schema of the connection's `search_path`).
pub const LEDGER_TABLE: &str = "outbox_consumer_ledger";

/// The ledger migration, `migrations/0001_consumer_ledger.sql`. Idempotent
/// (`CREATE ... IF NOT EXISTS`); apply it with [`ensure_ledger`] or with your own migration tool.
pub const LEDGER_MIGRATION: &str = include_str!("../migrations/0001_consumer_ledger.sql");

/// Advisory lock key serialising concurrent [`ensure_ledger`] calls (`CREATE TABLE IF NOT
/// EXISTS` alone can fail with a unique violation when two sessions race).
const MIGRATION_LOCK_KEY: i64 = 0x6f75_7462_6f78_6c67; // "outboxlg"

pub(crate) const INSERT_SQL: &str = "INSERT INTO outbox_consumer_ledger \
     (consumer, event_id, subject, stream_seq, commit_lsn) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (consumer, event_id) DO NOTHING";

/// The ledger write of a re-applied event ([`crate::Reapply`]): inserts, or replaces a row
/// written before `$6`; returns a row (`replaced`: the ledger had one) when the handler is to
/// run, none when the event was applied at or after `$6` (a duplicate).
pub(crate) const REAPPLY_SQL: &str = "INSERT INTO outbox_consumer_ledger \
     (consumer, event_id, subject, stream_seq, commit_lsn) VALUES ($1, $2, $3, $4, $5) \
     ON CONFLICT (consumer, event_id) DO UPDATE \
     SET subject = EXCLUDED.subject, stream_seq = EXCLUDED.stream_seq, \
         commit_lsn = EXCLUDED.commit_lsn, applied_at = now() \
     WHERE outbox_consumer_ledger.applied_at < $6 \
     RETURNING (xmax <> 0) AS replaced";

/// Creates the ledger table and its index if they do not exist. Safe to call from every
/// worker at every start, concurrently.
pub async fn ensure_ledger(client: &Client) -> Result<(), tokio_postgres::Error> {
    let sql = format!(
        "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY}); {LEDGER_MIGRATION}\nCOMMIT;"
    );
    let result = client.batch_execute(&sql).await;
    if result.is_err() {
        // Leave the session usable if the error hit inside the explicit transaction.
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}

/// Deletes ledger rows of `consumer` applied more than `older_than` ago, in batches of
/// 10 000 rows (short transactions); returns how many rows were deleted.
///
/// A pruned event id is forgotten: if the event arrives again, it is applied again. Keep
/// `older_than` above the longest time a duplicate can still arrive, at least:
///
/// * the stream's `max_age` (any message still in the stream can be redelivered, for
///   example when it was committed but the ack was lost and the consumer stayed down), and
/// * the relay's re-send horizon (after a relay crash it re-publishes events since its last
///   confirmed LSN, past the stream's duplicate window).
///
/// With a stream without `max_age`, pick a horizon longer than any consumer outage you
/// would recover from (see `docs/consumers.md`).
pub async fn prune_ledger(
    client: &Client,
    consumer: &str,
    older_than: Duration,
) -> Result<u64, tokio_postgres::Error> {
    // Clamped to ~100 years so the interval arithmetic cannot overflow.
    let micros = i64::try_from(older_than.as_micros())
        .unwrap_or(i64::MAX)
        .min(100 * 366 * 86_400 * 1_000_000);
    let stmt = client
        .prepare(
            "DELETE FROM outbox_consumer_ledger WHERE ctid IN ( \
               SELECT ctid FROM outbox_consumer_ledger \
               WHERE consumer = $1 \
                 AND applied_at < now() - $2::bigint * interval '1 microsecond' \
               LIMIT 10000)",
        )
        .await?;
    let mut total = 0;
    loop {
        let n = client.execute(&stmt, &[&consumer, &micros]).await?;
        total += n;
        if n < 10_000 {
            return Ok(total);
        }
    }
}
