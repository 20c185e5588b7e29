-- Signals from SQL (docs/operations.md, "Signals from SQL"): an INSERT asks the running relay to
-- do something (a backfill); the relay writes its progress, outcome and error back into the row.
-- The row is the signal's durable state: a relay that was down when it was inserted, or stopped
-- while it ran, finds it here on its next start. The trigger wakes a listening relay at commit
-- (NOTIFY is delivered in commit order), so nothing polls the table.
--
-- Who may signal: roles with INSERT on this table and USAGE on its sequence (docs/security.md).
-- kind and args are checked by the relay, not by constraints: a bad signal is a row marked
-- failed with the reason, never a refused INSERT in a migration and never a stopped relay.
CREATE SCHEMA IF NOT EXISTS outbox_relay;

CREATE TABLE IF NOT EXISTS outbox_relay.signal (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL,
    args         jsonb       NOT NULL DEFAULT '{}',
    -- The relay (slot) to carry it out; NULL: the first relay on this database that sees it.
    slot_name    text,
    requested_by text        NOT NULL DEFAULT current_user,
    requested_at timestamptz NOT NULL DEFAULT now(),
    -- requested -> running -> done | failed; written by the relay.
    state        text        NOT NULL DEFAULT 'requested',
    claimed_by   text,
    started_at   timestamptz,
    updated_at   timestamptz,
    finished_at  timestamptz,
    progress     jsonb,
    outcome      text,
    error        text
);

CREATE INDEX IF NOT EXISTS signal_open ON outbox_relay.signal (id)
    WHERE state IN ('requested', 'running');

CREATE OR REPLACE FUNCTION outbox_relay.signal_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_relay_signal', NEW.id::text);
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS signal_notify ON outbox_relay.signal;
CREATE TRIGGER signal_notify AFTER INSERT ON outbox_relay.signal
    FOR EACH ROW EXECUTE FUNCTION outbox_relay.signal_notify();
