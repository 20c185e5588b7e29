-- Watermill SQL Pub/Sub (watermill-sql v4.1.x, DefaultPostgreSQLSchema), one table per topic, in the
-- search_path schema (public). Topics: orders.created (payload JSON, the default) and
-- billing.InvoiceIssued (payload BYTEA, GeneratePayloadType returning "BYTEA" for it).
--
-- DDL: ThreeDotsLabs/watermill-sql pkg/sql/schema_adapter_postgresql.go (SchemaInitializingQueries,
--      MessagesTable = "watermill_<topic>" quoted, dots and case kept; DefaultSchemaInitializationLock:
--      fnv32a("schema_init:watermill") & 0x7fffffff = 1321092130, taken in the schema transaction);
--      pkg/sql/offsets_adapter_postgresql.go (the subscriber's "watermill_offsets_<topic>", created
--      here for orders.created as a consumer group would: it must NOT be relayed).
-- Rows: InsertQuery, INSERT INTO "watermill_<topic>" (uuid, payload, metadata, transaction_id)
--      VALUES ($1,$2,$3,pg_current_xact_id()),... one statement per Publish call, several messages
--      per statement; defaultInsertArgs (pkg/sql/schema_adapter.go): payload = the message bytes
--      unchanged, metadata = Go json.Marshal of map[string]string (keys sorted, < > & escaped as
--      lower-case \u003c \u003e \u0026, non-ASCII raw).
--
-- What a consumer receives (watermill-nats v2 pkg/nats/marshaler.go NATSMarshaler, pkg/nats/subject.go):
-- subject = the topic, i.e. the table name without "watermill_" (no column: subject_source null),
-- body = payload as stored (BYTEA decoded), headers = every metadata member plus
-- _watermill_message_uuid = uuid (that header is not in the expect file's "headers", which lists
-- only the metadata members), Nats-Msg-Id = uuid.
--
-- tx 1  orders.created         4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b01  metadata correlation_id, name
--       orders.created         4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b02  metadata correlation_id, name, note (escaped <>&)
-- tx 2  billing.InvoiceIssued  01J1Z8Q4X8K5W6V7T8R9S0A1B2            BYTEA body with NUL and 0xff
--       orders.created         4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b03  payload with 1e+21 (Go float64)
-- tx 3  billing.InvoiceIssued  01J1Z8Q4X8K5W6V7T8R9S0A1B3            BYTEA body, invalid UTF-8 (c3 28)
--       billing.InvoiceIssued  01J1Z8Q4X8K5W6V7T8R9S0A1B4            BYTEA body, empty metadata {}
--       orders.created         4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b04  metadata {}

BEGIN;
SELECT pg_advisory_xact_lock(1321092130);
CREATE TABLE IF NOT EXISTS "watermill_orders.created" (
			"offset" BIGSERIAL,
			"uuid" VARCHAR(36) NOT NULL,
			"created_at" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
			"payload" JSON DEFAULT NULL,
			"metadata" JSON DEFAULT NULL,
			"transaction_id" xid8 NOT NULL,
			PRIMARY KEY ("transaction_id", "offset")
		);
COMMIT;

BEGIN;
SELECT pg_advisory_xact_lock(1321092130);
CREATE TABLE IF NOT EXISTS "watermill_billing.InvoiceIssued" (
			"offset" BIGSERIAL,
			"uuid" VARCHAR(36) NOT NULL,
			"created_at" TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
			"payload" BYTEA DEFAULT NULL,
			"metadata" JSON DEFAULT NULL,
			"transaction_id" xid8 NOT NULL,
			PRIMARY KEY ("transaction_id", "offset")
		);
COMMIT;

CREATE TABLE IF NOT EXISTS "watermill_offsets_orders.created" (
				consumer_group VARCHAR(255) NOT NULL,
				offset_acked BIGINT,
				last_processed_transaction_id xid8 NOT NULL,
				PRIMARY KEY(consumer_group)
			);

-- @@ rows

BEGIN;
INSERT INTO "watermill_orders.created" (uuid, payload, metadata, transaction_id) VALUES ('4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b01','{"order_id":42,"customer":"José \"JJ\" Müller","total":12.50,"lines":[{"sku":"KÖLN-1","qty":2}]}','{"correlation_id":"c-8f2b","name":"OrderCreated"}',pg_current_xact_id()),('4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b02','{"order_id":43,"customer":"Élodie Łuczak","total":0.1,"memo":"a \u003cb\u003e \u0026 c"}','{"correlation_id":"c-8f2b","name":"OrderCreated","note":"\u003cvip\u003e \u0026 rush"}',pg_current_xact_id());
COMMIT;

BEGIN;
INSERT INTO "watermill_billing.InvoiceIssued" (uuid, payload, metadata, transaction_id) VALUES ('01J1Z8Q4X8K5W6V7T8R9S0A1B2','\x0a0b494e562d323032362d3432120300ff4118e209','{"content_type":"application/x-protobuf","correlation_id":"c-8f2b"}',pg_current_xact_id());
INSERT INTO "watermill_orders.created" (uuid, payload, metadata, transaction_id) VALUES ('4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b03','{"order_id":44,"customer":"Зоя","total":1250,"weight_g":1e+21,"tags":["neu","grüß"]}','{"correlation_id":"c-9a01","name":"OrderCreated"}',pg_current_xact_id());
COMMIT;

BEGIN;
INSERT INTO "watermill_billing.InvoiceIssued" (uuid, payload, metadata, transaction_id) VALUES ('01J1Z8Q4X8K5W6V7T8R9S0A1B3','\x0a0b494e562d323032362d3433c328fe00','{"content_type":"application/x-protobuf","correlation_id":"c-9a01"}',pg_current_xact_id()),('01J1Z8Q4X8K5W6V7T8R9S0A1B4','\x00','{}',pg_current_xact_id());
INSERT INTO "watermill_orders.created" (uuid, payload, metadata, transaction_id) VALUES ('4f1e6a8e-6f43-4b7e-9d6b-2c1f8a9e0b04','{"order_id":45,"customer":"O''Brien","total":7.00}','{}',pg_current_xact_id());
COMMIT;
