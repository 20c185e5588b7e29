// The ledger table, shared with the Rust and Python consumers (ledger.sql is a copy of
// crates/outbox-consumer/migrations/0001_consumer_ledger.sql).
import { readFileSync } from "node:fs";
import type pg from "pg";

export const LEDGER_MIGRATION = readFileSync(new URL("./ledger.sql", import.meta.url), "utf8");

// The Rust crate's key ("outboxlg"): services in any of the languages migrating at once serialise.
const MIGRATION_LOCK_KEY = "8031453476610927719";

export const INSERT_SQL =
  "INSERT INTO outbox_consumer_ledger (consumer, event_id, subject, stream_seq, commit_lsn) " +
  "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer, event_id) DO NOTHING";

// Inserts, or replaces a row written before $6; a row comes back (replaced: the ledger had one)
// when the handler is to run, none for an event applied since (a duplicate).
export const REAPPLY_SQL =
  "INSERT INTO outbox_consumer_ledger (consumer, event_id, subject, stream_seq, commit_lsn) " +
  "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer, event_id) DO UPDATE " +
  "SET subject = EXCLUDED.subject, stream_seq = EXCLUDED.stream_seq, " +
  "commit_lsn = EXCLUDED.commit_lsn, applied_at = now() " +
  "WHERE outbox_consumer_ledger.applied_at < $6 RETURNING (xmax <> 0) AS replaced";

/** Creates the ledger table and its index if missing; safe concurrently. */
export async function ensureLedger(client: pg.Client): Promise<void> {
  try {
    await client.query(`BEGIN; SELECT pg_advisory_xact_lock(${MIGRATION_LOCK_KEY}); ${LEDGER_MIGRATION}\nCOMMIT;`);
  } catch (e) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw e;
  }
}

/** Deletes `consumer`'s rows applied more than `olderThanSeconds` ago, 10 000 per statement.
 * A pruned event id is forgotten: keep it above the stream's max_age (docs/consumers.md). */
export async function pruneLedger(client: pg.Client, consumer: string, olderThanSeconds: number): Promise<number> {
  let total = 0;
  for (;;) {
    const r = await client.query(
      "DELETE FROM outbox_consumer_ledger WHERE ctid IN (SELECT ctid FROM outbox_consumer_ledger " +
        "WHERE consumer = $1 AND applied_at < now() - $2 * interval '1 second' LIMIT 10000)",
      [consumer, olderThanSeconds],
    );
    total += r.rowCount ?? 0;
    if ((r.rowCount ?? 0) < 10000) return total;
  }
}
