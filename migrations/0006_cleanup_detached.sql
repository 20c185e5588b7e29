-- `[outbox.cleanup] mode = "drop-partitions"`: partitions the relay detached from a partitioned
-- outbox table and will drop once the stored checkpoint is past `horizon`, the WAL insert position
-- read after the detach returned (every transaction that wrote into the partition had ended by
-- then, so all its rows committed before it). A row with no horizon is a detach under way, or
-- interrupted: the next round finishes it (DETACH … FINALIZE) or forgets it (still attached).
-- Only the relay's cleanup task writes here; delete a row to keep a detached table.
CREATE SCHEMA IF NOT EXISTS outbox_relay;

CREATE TABLE IF NOT EXISTS outbox_relay.cleanup_detached (
    partition_oid oid         PRIMARY KEY,
    table_name    text        NOT NULL,
    partition     text        NOT NULL,
    horizon       pg_lsn,
    detached_at   timestamptz NOT NULL DEFAULT now()
);
