-- The relay's durable progress: one row per replication slot. confirmed_lsn is the Commit end
-- LSN up to which JetStream acknowledged every outbox event (the ack frontier). The relay stores
-- it here first and only then reports it to the slot, so this value is never behind the slot's
-- confirmed_flush_lsn unless someone moved the slot by hand.
CREATE SCHEMA IF NOT EXISTS outbox_relay;

CREATE TABLE IF NOT EXISTS outbox_relay.checkpoint (
    slot_name     text        PRIMARY KEY,
    confirmed_lsn pg_lsn      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
