-- Eventuate Tram (eventuate-tram-core 0.38 / eventuate-common 0.22), schema eventuate, text columns.
--
-- DDL: eventuate-foundation/eventuate-common postgres/1.initialize-database.sql (CREATE SCHEMA
--      eventuate) and postgres/2.initialize-database.sql (message, received_messages, offset_store;
--      the script's DROP TABLE IF EXISTS lines are left out, the database is fresh). The Flyway
--      template eventuate-common-flyway/.../flyway-templates/postgresql/3.create-message-table.sql
--      has the same columns with id VARCHAR(255) in Flyway's default schema.
-- Rows: eventuate-common-jdbc/src/main/java/io/eventuate/common/jdbc/EventuateJdbcOperationsUtils.java
--      (insertIntoMessageTableApplicationIdSql) with PostgresDialect.castToJson ("?::text" for text
--      columns) and getCurrentTimeInMillisecondsExpression:
--      insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition)
--      values(?, ?, ?::text, ?::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), ?, ?)
--      id: application-id mode, Int128 as %016x-%016x, also in header ID. headers: Jackson of a
--      HashMap<String,String> (no stable order); payload: Jackson (non-ASCII raw UTF-8, BigDecimal
--      scale kept). Domain events go to destination = aggregate type (a Java class name).
--
-- What a consumer receives: subject from destination, Nats-Msg-Id = id, body = payload as stored,
-- headers = the members of headers. Rows inserted with published = 1 are skipped by Eventuate's
-- own CDC and are not relayed either: the preset's row filter published = 0.
--
-- tx 1 (two domain events of one Order aggregate)
--   0000019a1b2c3d4e-0242ac1200030000  com.acme.order.Order  event-type com.acme.order.OrderCreated
--   0000019a1b2c3d4e-0242ac1200030001  com.acme.order.Order  event-type com.acme.order.OrderLineAdded
-- tx 2 (a saga command, and a message inserted as already published)
--   0000019a1b2c3d4f-0242ac1200030002  customerService       command_type ...ReserveCreditCommand
--   0000019a1b2c3d4f-0242ac1200030003  NOT relayed (published = 1)
--   0000019a1b2c3d4f-0242ac1200030004  com.acme.order.Order  event-type com.acme.order.OrderApproved
-- tx 3 (partitioned outbox row, message_partition = 3)
--   0000019a1b2c3d50-0242ac1200030005  com.acme.customer.Customer  event-type ...CreditReserved
--   0000019a1b2c3d50-0242ac1200030006  com.acme.customer.Customer  event-type ...CustomerRenamed

CREATE SCHEMA eventuate;

CREATE TABLE eventuate.message (
  id VARCHAR(1000) PRIMARY KEY,
  destination TEXT NOT NULL,
  headers TEXT NOT NULL,
  payload TEXT NOT NULL,
  published SMALLINT DEFAULT 0,
  message_partition SMALLINT,
  creation_time BIGINT
);

CREATE INDEX message_published_idx ON eventuate.message(published, id);

CREATE TABLE eventuate.received_messages (
  consumer_id VARCHAR(1000),
  message_id VARCHAR(1000),
  creation_time BIGINT,
  published SMALLINT DEFAULT 0,
  PRIMARY KEY(consumer_id, message_id)
);

CREATE TABLE eventuate.offset_store(
  client_name VARCHAR(255) NOT NULL PRIMARY KEY,
  serialized_offset VARCHAR(255)
);

-- @@ rows

BEGIN;
insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition) values('0000019a1b2c3d4e-0242ac1200030000', 'com.acme.order.Order', '{"PARTITION_ID":"42","event-aggregate-type":"com.acme.order.Order","DESTINATION":"com.acme.order.Order","event-type":"com.acme.order.OrderCreated","DATE":"Wed, 1 Jul 2026 14:02:20 GMT","ID":"0000019a1b2c3d4e-0242ac1200030000","event-aggregate-id":"42"}'::text, '{"orderDetails":{"customerId":7,"customerName":"José \"JJ\" Müller","orderTotal":{"amount":12.50},"note":"Lieferung: Hintertür\n2. OG"}}'::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), 0, NULL);
insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition) values('0000019a1b2c3d4e-0242ac1200030001', 'com.acme.order.Order', '{"PARTITION_ID":"42","event-aggregate-type":"com.acme.order.Order","DESTINATION":"com.acme.order.Order","event-type":"com.acme.order.OrderLineAdded","DATE":"Wed, 1 Jul 2026 14:02:20 GMT","ID":"0000019a1b2c3d4e-0242ac1200030001","event-aggregate-id":"42"}'::text, '{"sku":"KÖLN-1","quantity":2,"unitPrice":{"amount":6.25},"description":"Kölsch-Glas 0,2 l ☕"}'::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), 0, NULL);
COMMIT;

BEGIN;
insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition) values('0000019a1b2c3d4f-0242ac1200030002', 'customerService', '{"command_saga_type":"com.acme.order.sagas.CreateOrderSaga","command_reply_to":"com.acme.order.sagas.CreateOrderSaga-reply","DESTINATION":"customerService","command_type":"com.acme.customer.api.ReserveCreditCommand","command_saga_id":"0000019a1b2c3d4f-0242ac12000300ff","DATE":"Wed, 1 Jul 2026 14:02:21 GMT","ID":"0000019a1b2c3d4f-0242ac1200030002","command__destination":"customerService"}'::text, '{"orderId":42,"orderTotal":{"amount":12.50},"customerId":7}'::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), 0, NULL);
insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition) values('0000019a1b2c3d4f-0242ac1200030003', 'com.acme.order.Order', '{"PARTITION_ID":"42","event-aggregate-type":"com.acme.order.Order","DESTINATION":"com.acme.order.Order","event-type":"com.acme.order.OrderAuditRecorded","DATE":"Wed, 1 Jul 2026 14:02:21 GMT","ID":"0000019a1b2c3d4f-0242ac1200030003","event-aggregate-id":"42"}'::text, '{"by":"system"}'::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), 1, NULL);
insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition) values('0000019a1b2c3d4f-0242ac1200030004', 'com.acme.order.Order', '{"PARTITION_ID":"42","event-aggregate-type":"com.acme.order.Order","DESTINATION":"com.acme.order.Order","event-type":"com.acme.order.OrderApproved","DATE":"Wed, 1 Jul 2026 14:02:21 GMT","ID":"0000019a1b2c3d4f-0242ac1200030004","event-aggregate-id":"42"}'::text, '{}'::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), 0, NULL);
COMMIT;

BEGIN;
insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition) values('0000019a1b2c3d50-0242ac1200030005', 'com.acme.customer.Customer', '{"event-aggregate-id":"7","PARTITION_ID":"7","DATE":"Wed, 1 Jul 2026 14:02:22 GMT","event-type":"com.acme.customer.CustomerCreditReserved","ID":"0000019a1b2c3d50-0242ac1200030005","event-aggregate-type":"com.acme.customer.Customer","DESTINATION":"com.acme.customer.Customer"}'::text, '{"orderId":42,"creditLimit":{"amount":1250.00},"remaining":{"amount":1237.50}}'::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), 0, 3);
insert into eventuate.message(id, destination, headers, payload, creation_time, published, message_partition) values('0000019a1b2c3d50-0242ac1200030006', 'com.acme.customer.Customer', '{"event-aggregate-id":"7","PARTITION_ID":"7","DATE":"Wed, 1 Jul 2026 14:02:22 GMT","event-type":"com.acme.customer.CustomerRenamed","ID":"0000019a1b2c3d50-0242ac1200030006","event-aggregate-type":"com.acme.customer.Customer","DESTINATION":"com.acme.customer.Customer"}'::text, '{"oldName":"Zoë","newName":"Зоя Łuczak","reason":"tab\there, backslash \\ and \u0001"}'::text, (ROUND(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) * 1000)), 0, 3);
COMMIT;
