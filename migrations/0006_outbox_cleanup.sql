-- `[outbox.cleanup]` (docs/operations.md, "Cleanup").
CREATE SCHEMA IF NOT EXISTS outbox_relay;

-- From when on cleanup may touch a table's rows: `fence` is a snapshot (pg_snapshot text) taken
-- after the slot existed and the table was in the publication, so a row whose transaction that
-- snapshot does not see was decoded by the slot. Rows it sees (committed before: never published
-- by the relay, e.g. a polling publisher's backlog or rows for `outbox-relay backfill`) are never
-- cleaned. One row per slot and table, made by the first cleanup round; deleting the slot's
-- checkpoint row (a fresh start after a lost slot) deletes it too, so the next slot gets its own.
CREATE TABLE IF NOT EXISTS outbox_relay.cleanup_fence (
    slot_name      text        NOT NULL REFERENCES outbox_relay.checkpoint (slot_name) ON DELETE CASCADE,
    table_name     text        NOT NULL,
    fence          text        NOT NULL,
    established_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot_name, table_name)
);

-- `mode = "drop-partitions"`: partitions the relay detached from a partitioned outbox table and
-- will drop once the stored checkpoint is past `horizon`, the WAL insert position read after the
-- detach returned (every transaction that wrote into the partition had ended by then, so all its
-- rows committed before it). A row with no horizon is a detach under way, or interrupted: the
-- next round finishes it (DETACH … FINALIZE) or forgets it (still attached). Delete a row to keep
-- a detached table.
CREATE TABLE IF NOT EXISTS outbox_relay.cleanup_detached (
    partition_oid oid         PRIMARY KEY,
    table_name    text        NOT NULL,
    partition     text        NOT NULL,
    horizon       pg_lsn,
    detached_at   timestamptz NOT NULL DEFAULT now()
);
