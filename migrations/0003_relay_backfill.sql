-- `outbox-relay backfill` progress: one row per (slot, outbox table, --where filter). last_key is
-- the page key up to which JetStream acknowledged every row the backfill read (stored only then,
-- the relay's delivery rule), so a backfill that was killed resumes after it instead of starting
-- over. end_key is the last key when the backfill started: rows committed later are the live
-- relay's (its slot existed before the backfill started). Keys are in their type's text form.
CREATE SCHEMA IF NOT EXISTS outbox_relay;

CREATE TABLE IF NOT EXISTS outbox_relay.backfill (
    slot_name     text        NOT NULL,
    table_name    text        NOT NULL,
    filter_hash   text        NOT NULL,
    filter        text        NOT NULL DEFAULT '',
    key_column    text        NOT NULL,
    end_key       text,
    last_key      text,
    rows_done     bigint      NOT NULL DEFAULT 0,
    rows_estimate bigint,
    started_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    PRIMARY KEY (slot_name, table_name, filter_hash)
);
