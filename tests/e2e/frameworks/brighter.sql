-- Brighter 10.7 PostgreSQL outbox (Paramore.Brighter.Outbox.PostgreSql), text body (the default,
-- not BinaryMessagePayload), configured table name "Outbox", schema public.
--
-- DDL: BrighterCommand/Brighter tag 10.7.0 src/Paramore.Brighter.Outbox.PostgreSql/
--      PostgreSqlOutboxBuilder.cs (TextOutboxDdl); the name comes from PgIdentifier.QuoteQualified
--      (src/Paramore.Brighter.PostgreSql/PgIdentifier.cs): lower-cased, then quoted, so "outbox";
--      the columns are unquoted and fold to lower case.
-- Rows: src/Paramore.Brighter.Outbox.PostgreSql/PostgreSqlQueries.cs (AddCommand; BulkAddCommand for
--      a batch: several VALUES lists in one INSERT) with the parameters of
--      src/Paramore.Brighter/RelationDatabaseOutbox.cs (InitAddDbParameters); dispatched is not
--      inserted (NULL). headerbag is System.Text.Json of the Dictionary<string,object> with
--      JsonSerialisationOptions.Options (src/Paramore.Brighter/JsonConverters/
--      JsonSerialisationOptions.cs: the default encoder, so non-ASCII and " & ' + < > are \uXXXX;
--      values may be strings, numbers or booleans) and may hold the local-only key
--      paramore.brighter.ProducerTopic. body is what the message mapper produced: Brighter's
--      JSON mapper uses the same options (camelCase, escaped); a text/plain body is raw UTF-8.
--
-- What a consumer receives: subject from topic, Nats-Msg-Id = messageid, body = body as stored,
-- headers = the members of headerbag (numbers and booleans as their JSON text) except
-- paramore.brighter.ProducerTopic, which Brighter's transports strip (MessageHeader.IsLocalHeader)
-- and which is therefore not in the expect file. First-class columns (correlationid,
-- contenttype, traceparent, ...) become headers only through the preset's column headers; the
-- expect file lists the headerbag members only.
--
-- tx 1 (DepositPost of two messages: BulkAddCommand)
--   0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a90  orders.created     headerbag x-tenant, retry = "3", flag = "true"
--   0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a91  payments.requested headerbag x-tenant, amount = "12.50" (ProducerTopic dropped)
-- tx 2
--   0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a92  orders.created     headerbag {} , body with \u00C9 \u0141 escapes
--   0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a93  notes.posted       text/plain body, raw UTF-8
-- tx 3
--   0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a94  orders.shipped     MT_COMMAND, headerbag note escaped (\u0026 \u003C)
--   0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a95  orders.created     headerbag x-tenant, negative -1 and 1.5E-05 (.NET double text)

CREATE TABLE IF NOT EXISTS "outbox"
(
    Id bigserial PRIMARY KEY,
    MessageId character varying(255) UNIQUE NOT NULL,
    Topic character varying(255) NULL,
    MessageType character varying(32) NULL,
    Timestamp timestamptz NULL,
    CorrelationId character varying(255) NULL,
    ReplyTo character varying(255) NULL,
    ContentType character varying(128) NULL,
    PartitionKey character varying(128) NULL,
    WorkflowId character varying(255) NULL,
    JobId character varying(255) NULL,
    Dispatched timestamptz NULL,
    HeaderBag text NULL,
    Body text NULL,
    Source character varying (255) NULL,
    Type character varying (255) NULL,
    DataSchema character varying (255) NULL,
    Subject character varying (255) NULL,
    TraceParent character varying (255) NULL,
    TraceState character varying (255) NULL,
    Baggage text NULL,
    DataRef character varying (255) NULL,
    SpecVersion character varying (255) NULL
);

-- @@ rows

BEGIN;
INSERT INTO "outbox" ("messageid","messagetype","topic","timestamp","correlationid","replyto","contenttype","partitionkey","headerbag","body","source","type","dataschema","subject","traceparent","tracestate","baggage","workflowid","jobid") VALUES
('0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a90','MT_EVENT','orders.created','2026-07-01 14:02:20.123+00','7d0e5c2a-1111-4c8b-9d4a-2f8e1c7b5a90',NULL,'application/json; charset=utf-8','42','{"x-tenant":"acme","retry":3,"flag":true,"paramore.brighter.ProducerTopic":"orders.created"}','{"orderId":42,"customer":"Jos\u00E9 \u0022JJ\u0022 M\u00FCller","total":12.50}','http://goparamore.io','',NULL,NULL,'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',NULL,'',NULL,NULL),
('0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a91','MT_EVENT','payments.requested','2026-07-01 14:02:20.124+00','7d0e5c2a-1111-4c8b-9d4a-2f8e1c7b5a90',NULL,'application/json; charset=utf-8','42','{"x-tenant":"acme","amount":12.50,"paramore.brighter.ProducerTopic":"payments.requested"}','{"orderId":42,"amount":12.50,"memo":"R\u00FCckzahlung \u002B Geb\u00FChr \uD83D\uDCB6"}','http://goparamore.io','',NULL,NULL,'00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01',NULL,'',NULL,NULL);
COMMIT;

BEGIN;
INSERT INTO "outbox" ("messageid","messagetype","topic","timestamp","correlationid","replyto","contenttype","partitionkey","headerbag","body","source","type","dataschema","subject","traceparent","tracestate","baggage","workflowid","jobid") VALUES ('0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a92','MT_EVENT','orders.created','2026-07-01 14:02:21.000+00','9a1f3c4d-2222-4c8b-9d4a-2f8e1c7b5a92',NULL,'application/json; charset=utf-8','43','{}','{"orderId":43,"customer":"\u00C9lodie \u0141uczak","total":0.1,"lines":[]}','http://goparamore.io','',NULL,NULL,NULL,NULL,'',NULL,NULL);
INSERT INTO "outbox" ("messageid","messagetype","topic","timestamp","correlationid","replyto","contenttype","partitionkey","headerbag","body","source","type","dataschema","subject","traceparent","tracestate","baggage","workflowid","jobid") VALUES ('0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a93','MT_EVENT','notes.posted','2026-07-01 14:02:21.001+00','9a1f3c4d-2222-4c8b-9d4a-2f8e1c7b5a92',NULL,'text/plain; charset=utf-8','43','{"x-tenant":"acme"}','Grüße aus Köln – "Lieferung" morgen ✓','http://goparamore.io','',NULL,NULL,NULL,NULL,'userId=alice,region=eu',NULL,NULL);
COMMIT;

BEGIN;
INSERT INTO "outbox" ("messageid","messagetype","topic","timestamp","correlationid","replyto","contenttype","partitionkey","headerbag","body","source","type","dataschema","subject","traceparent","tracestate","baggage","workflowid","jobid") VALUES ('0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a94','MT_COMMAND','orders.shipped','2026-07-01 14:02:22.500+00','c0ffee00-3333-4c8b-9d4a-2f8e1c7b5a94','orders.replies','application/json; charset=utf-8','43','{"note":"fragile \u0026 \u003Cheavy\u003E","priority":1}','{"orderId":43,"address":"Hauptstra\u00DFe 1\n50667 K\u00F6ln"}','http://goparamore.io','com.acme.orders.ship',NULL,'order/43','00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01','congo=t61rcWkgMzE','',NULL,NULL);
INSERT INTO "outbox" ("messageid","messagetype","topic","timestamp","correlationid","replyto","contenttype","partitionkey","headerbag","body","source","type","dataschema","subject","traceparent","tracestate","baggage","workflowid","jobid") VALUES ('0b6c5c3e-6a0e-4c8b-9d4a-2f8e1c7b5a95','MT_EVENT','orders.created','2026-07-01 14:02:22.501+00','c0ffee00-3333-4c8b-9d4a-2f8e1c7b5a95',NULL,'application/json; charset=utf-8','44','{"x-tenant":"acme","offset":-1,"ratio":1.5E-05}','{"orderId":44,"customer":"\u0417\u043E\u044F","total":1250.00}','http://goparamore.io','',NULL,NULL,NULL,NULL,'',NULL,NULL);
COMMIT;
