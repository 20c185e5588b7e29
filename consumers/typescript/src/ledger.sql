-- outbox-consumer ledger: one row per (consumer, event id) that a consumer has applied.
--
-- The row is inserted in the same transaction as the handler's business effect, so it exists
-- if and only if the effect was committed. The primary key makes a redelivered event find the
-- row and skip the handler. Several services may share one database: `consumer` is the service
-- name. Applied idempotently by `outbox_consumer::ensure_ledger`.
CREATE TABLE IF NOT EXISTS outbox_consumer_ledger (
    consumer    text        NOT NULL,
    event_id    text        NOT NULL,
    subject     text        NOT NULL,
    stream_seq  bigint      NOT NULL,
    commit_lsn  text,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Pruning by age (`outbox_consumer::prune_ledger`) scans this index.
CREATE INDEX IF NOT EXISTS outbox_consumer_ledger_applied_at
    ON outbox_consumer_ledger (consumer, applied_at);
