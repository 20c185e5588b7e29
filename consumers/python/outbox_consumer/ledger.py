"""The ledger table: which events each consumer has applied. The same table as the Rust
``outbox-consumer`` (``ledger.sql`` is a copy of its migration), so services in either language
can share a database."""

from __future__ import annotations

import datetime as dt
from importlib import resources

import psycopg

LEDGER_MIGRATION: str = resources.files(__package__).joinpath("ledger.sql").read_text("utf-8")

# The Rust crate's key ("outboxlg"): a Rust and a Python service migrating at once serialise.
_MIGRATION_LOCK_KEY = 0x6F757462_6F786C67

INSERT_SQL = (
    "INSERT INTO outbox_consumer_ledger (consumer, event_id, subject, stream_seq, commit_lsn) "
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (consumer, event_id) DO NOTHING"
)

# Inserts, or replaces a row written before the last parameter; a row comes back (replaced:
# the ledger had one) when the handler is to run, none for an event applied since (a duplicate).
REAPPLY_SQL = (
    "INSERT INTO outbox_consumer_ledger (consumer, event_id, subject, stream_seq, commit_lsn) "
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (consumer, event_id) DO UPDATE "
    "SET subject = EXCLUDED.subject, stream_seq = EXCLUDED.stream_seq, "
    "commit_lsn = EXCLUDED.commit_lsn, applied_at = now() "
    "WHERE outbox_consumer_ledger.applied_at < %s "
    "RETURNING (xmax <> 0) AS replaced"
)


async def ensure_ledger(conn: psycopg.AsyncConnection) -> None:
    """Creates the ledger table and its index if missing; safe concurrently."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
        await conn.execute(LEDGER_MIGRATION)


async def prune_ledger(conn: psycopg.AsyncConnection, consumer: str, older_than: dt.timedelta) -> int:
    """Deletes ``consumer``'s rows applied more than ``older_than`` ago, 10 000 per statement.

    A pruned event id is forgotten: keep ``older_than`` above the stream's ``max_age`` (see
    docs/consumers.md, Pruning)."""
    total = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                "DELETE FROM outbox_consumer_ledger WHERE ctid IN ("
                " SELECT ctid FROM outbox_consumer_ledger"
                " WHERE consumer = %s AND applied_at < now() - %s LIMIT 10000)",
                (consumer, older_than),
            )
        total += cur.rowcount
        if cur.rowcount < 10000:
            return total
