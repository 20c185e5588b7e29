-- Where the relay's events are in its JetStream stream, so a commit LSN or a commit time can be
-- mapped to a stream sequence (`outbox-relay position`, `outbox-relay replay`, docs/replay.md).
-- One row per stored checkpoint that moved past acknowledged events, written in the same
-- transaction as the checkpoint row:
--   commit_lsn, commit_time  the earliest commit with an acknowledged event behind that checkpoint
--   stream_seq               every event committed after the previous checkpoint, up to this one,
--                            and every later event already sent then, has a copy in the stream at
--                            or after this sequence
-- Rows recorded more than [relay] position_retention ago (default 7 days) are pruned, the newest
-- row of each slot and stream excepted; a lookup older than the oldest row falls back to a search
-- of the stream itself.
CREATE SCHEMA IF NOT EXISTS outbox_relay;

CREATE TABLE IF NOT EXISTS outbox_relay.position_map (
    slot_name   text        NOT NULL,
    stream      text        NOT NULL,
    commit_lsn  pg_lsn      NOT NULL,
    commit_time timestamptz NOT NULL,
    stream_seq  bigint      NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot_name, stream, commit_lsn)
);

CREATE INDEX IF NOT EXISTS position_map_by_time
    ON outbox_relay.position_map (slot_name, stream, commit_time);
CREATE INDEX IF NOT EXISTS position_map_by_age
    ON outbox_relay.position_map (slot_name, stream, recorded_at);
