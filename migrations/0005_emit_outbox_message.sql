-- The table-free outbox: an application emits its event into the WAL with
-- pg_logical_emit_message in its own transaction, and the relay publishes it once the transaction
-- commits (docs/message-format.md, "Logical decoding messages"). Nothing is written to a table, so
-- there is nothing to clean up. The relay publishes the messages of a prefix configured in
-- [[messages]] (docs/configuration.md). PostgreSQL 14 or later, wal_level = logical.
--
--   SELECT outbox_relay.emit_event('outbox', '9f0c…', 'outbox.order.created',
--                                  '{"order": 7}', '{"Outbox-Event-Type": "created"}');
--
-- Both functions emit a *transactional* message: it is decoded only if the calling transaction
-- commits, at the transaction's place in commit order, after the rows it wrote before the call.
-- They return the message's LSN. Any role may call them (EXECUTE is granted to PUBLIC, as for
-- pg_logical_emit_message itself); restrict it with REVOKE/GRANT if only some roles may publish.
CREATE SCHEMA IF NOT EXISTS outbox_relay;

-- Emits `envelope` (a JSON object with at least a non-empty "id") under `prefix`, as is:
-- "subject", "headers", "payload" and any template fields are the caller's.
CREATE OR REPLACE FUNCTION outbox_relay.emit_envelope(prefix text, envelope jsonb)
RETURNS pg_lsn
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF prefix IS NULL OR prefix = '' THEN
        RAISE EXCEPTION 'outbox_relay.emit_envelope: prefix must not be NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF envelope IS NULL OR jsonb_typeof(envelope) <> 'object' THEN
        RAISE EXCEPTION 'outbox_relay.emit_envelope: the envelope must be a JSON object, not %',
            coalesce(jsonb_typeof(envelope), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(envelope -> 'id') IS DISTINCT FROM 'string' AND
       jsonb_typeof(envelope -> 'id') IS DISTINCT FROM 'number' OR envelope ->> 'id' = '' THEN
        RAISE EXCEPTION 'outbox_relay.emit_envelope: the envelope needs a non-empty "id" (string or integer)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF envelope ? 'headers' AND jsonb_typeof(envelope -> 'headers') NOT IN ('object', 'null') THEN
        RAISE EXCEPTION 'outbox_relay.emit_envelope: "headers" must be a JSON object'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN pg_logical_emit_message(true, prefix, envelope::text);
END
$$;

-- Builds the envelope {"id", "subject", "headers", "payload"} and emits it under `prefix`.
-- A NULL subject is left out (for a [[messages]] entry with a subject template), a NULL payload
-- too (an empty body), and empty headers.
CREATE OR REPLACE FUNCTION outbox_relay.emit_event(
    prefix  text,
    id      text,
    subject text,
    payload jsonb,
    headers jsonb DEFAULT '{}'::jsonb
)
RETURNS pg_lsn
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    envelope jsonb := jsonb_build_object('id', id);
BEGIN
    IF id IS NULL OR id = '' THEN
        RAISE EXCEPTION 'outbox_relay.emit_event: id must not be NULL or empty'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF subject IS NOT NULL THEN
        envelope := envelope || jsonb_build_object('subject', subject);
    END IF;
    IF headers IS NOT NULL AND headers <> '{}'::jsonb THEN
        envelope := envelope || jsonb_build_object('headers', headers);
    END IF;
    IF payload IS NOT NULL THEN
        envelope := envelope || jsonb_build_object('payload', payload);
    END IF;
    RETURN outbox_relay.emit_envelope(prefix, envelope);
END
$$;
