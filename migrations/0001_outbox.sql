-- The default outbox table, in the shape of Debezium's outbox event router, so services that
-- write Debezium-style outbox rows can switch relays without changing their writes.
--   id                  event id, becomes Nats-Msg-Id (stable across re-sends)
--   aggregatetype       first subject token:  outbox.{aggregatetype}.{type}
--   aggregateid         header Outbox-Aggregate-Id
--   type                second subject token, header Outbox-Event-Type
--   payload             message body, forwarded byte-exact
--   tracingspancontext  optional W3C trace context, becomes the traceparent header
CREATE TABLE IF NOT EXISTS public.outbox (
    id                 uuid         PRIMARY KEY,
    aggregatetype      varchar(255) NOT NULL,
    aggregateid        varchar(255) NOT NULL,
    type               varchar(255) NOT NULL,
    payload            jsonb,
    tracingspancontext varchar(512),
    created_at         timestamptz  NOT NULL DEFAULT now()
);
