-- `backfill = "on-create"`: the backfill the relay runs when it creates its slot, from the slot's
-- exported snapshot. Its cursor rows are rows of outbox_relay.backfill (filter '') marked
-- on_create. A row with snapshot NULL is written before the slot is created: if the relay dies
-- before the snapshot is recorded, the next start knows the slot is its own, unused, and
-- creates it again. snapshot is the exported snapshot as pg_snapshot text (xmin:xmax:xip), and
-- consistent_lsn the slot's consistent point: a resumed backfill, whose snapshot died with its
-- connection, tells rows the slot streams from rows it does not by them (docs/replay.md).
ALTER TABLE outbox_relay.backfill
    ADD COLUMN IF NOT EXISTS on_create      boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS snapshot       text,
    ADD COLUMN IF NOT EXISTS consistent_lsn pg_lsn;
