-- CAP (DotNetCore.CAP + DotNetCore.CAP.PostgreSql), release 10.0.x, default schema "cap".
--
-- DDL: dotnetcore/CAP src/DotNetCore.CAP.PostgreSql/IStorageInitializer.PostgreSql.cs,
--      CreateDbTablesScript (UseStorageLock off, so no "cap"."lock"); schema default "cap" from
--      src/DotNetCore.CAP.PostgreSql/CAP.EFOptions.cs (DefaultSchema). "cap"."received" is CAP's
--      inbox: it is created by the same script and must NOT be relayed.
-- Rows: src/DotNetCore.CAP.PostgreSql/IDataStorage.PostgreSql.cs, StoreMessageAsync:
--      INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
--      VALUES(@Id,'v1',@Name,@Content,0,@Added,NULL,'Scheduled'), one statement per message, in the
--      caller's ICapTransaction. "Content" is System.Text.Json with the default encoder (every
--      non-ASCII character and " & ' + < > ` escaped as upper-case \uXXXX, no whitespace, decimal
--      scale kept), members "Headers" (insertion order: callback name, cap-msg-id, cap-corr-id,
--      cap-corr-seq, cap-msg-name, cap-msg-type, cap-senttime; caller headers first) then "Value".
--      "Added" is the app server's local time (timestamp without time zone).
--
-- What a consumer receives (DotNetCore.CAP.NATS src/DotNetCore.CAP.NATS/ITransport.NATS.cs):
-- subject = "Name" as is (dots are levels), Nats-Msg-Id = cap-msg-id = "Id", body = the bytes of
-- Content.Value as stored (a slice; JSON null gives an empty body), headers = every member of
-- Content.Headers (a JSON null member is not sent).
--
-- tx 1 (two publishes in one ICapTransaction)
--   1884513265453617152  orders.created            Value {"OrderId":42,...,"Total":12.50,...}
--                        headers cap-msg-id, cap-corr-id, cap-corr-seq, cap-msg-name, cap-msg-type,
--                        cap-senttime (cap-callback-name is null: not sent)
--   1884513265453617153  orders.payment.requested  caller headers x-tenant, traceparent first;
--                        Value has \u00FC, \u002B and a surrogate pair \uD83D\uDCB6
-- tx 2
--   1884513265453617154  inventory.reserved        cap-callback-name = inventory.reserve-result
--   1884513265453617155  audit.ping                Value null: empty body
--   1884513265453617156  orders.created            Value with nested arrays, 12.50 and 0.1
-- tx 3
--   1884513265453617157  orders.shipped            Value is a JSON string: "Versand an M\u00FCller"
--   1884513265453617158  orders.created            Value {"OrderId":44,...} (a second order)

CREATE SCHEMA IF NOT EXISTS "cap";

CREATE TABLE IF NOT EXISTS "cap"."received"(
	"Id" BIGINT PRIMARY KEY NOT NULL,
    "Version" VARCHAR(20) NOT NULL,
	"Name" VARCHAR(200) NOT NULL,
	"Group" VARCHAR(200) NULL,
	"Content" TEXT NULL,
	"Retries" INT NOT NULL,
	"Added" TIMESTAMP NOT NULL,
    "ExpiresAt" TIMESTAMP NULL,
	"StatusName" VARCHAR(50) NOT NULL
);

CREATE INDEX IF NOT EXISTS "idx_received_ExpiresAt_StatusName" ON "cap"."received" ("ExpiresAt","StatusName");
CREATE INDEX IF NOT EXISTS "idx_received_Version_ExpiresAt_StatusName" ON "cap"."received" ("Version","ExpiresAt","StatusName");

CREATE TABLE IF NOT EXISTS "cap"."published"(
	"Id" BIGINT PRIMARY KEY NOT NULL,
    "Version" VARCHAR(20) NOT NULL,
	"Name" VARCHAR(200) NOT NULL,
	"Content" TEXT NULL,
	"Retries" INT NOT NULL,
	"Added" TIMESTAMP NOT NULL,
    "ExpiresAt" TIMESTAMP NULL,
	"StatusName" VARCHAR(50) NOT NULL
);

CREATE INDEX IF NOT EXISTS "idx_published_ExpiresAt_StatusName" ON "cap"."published"("ExpiresAt","StatusName");
CREATE INDEX IF NOT EXISTS "idx_published_Version_ExpiresAt_StatusName" ON "cap"."published" ("Version","ExpiresAt","StatusName");

-- @@ rows

BEGIN;
INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
VALUES(1884513265453617152,'v1','orders.created','{"Headers":{"cap-callback-name":null,"cap-msg-id":"1884513265453617152","cap-corr-id":"1884513265453617152","cap-corr-seq":"0","cap-msg-name":"orders.created","cap-msg-type":"OrderCreated","cap-senttime":"07/01/2026 16:02:20"},"Value":{"OrderId":42,"Customer":"Jos\u00E9 \u0022JJ\u0022 \u003Cj@x.io\u003E","Total":12.50,"Lines":[{"Sku":"K\u00D6LN-1","Qty":2,"Price":6.25}],"Note":"caf\u00E9 \u0026 cr\u00E8me, it\u0027s \u0060fine\u0060"}}',0,'2026-07-01 16:02:20.123456',NULL,'Scheduled');
INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
VALUES(1884513265453617153,'v1','orders.payment.requested','{"Headers":{"x-tenant":"acme","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","cap-msg-id":"1884513265453617153","cap-corr-id":"1884513265453617153","cap-corr-seq":"0","cap-msg-name":"orders.payment.requested","cap-msg-type":"PaymentRequested","cap-senttime":"07/01/2026 16:02:20"},"Value":{"OrderId":42,"Amount":12.50,"Currency":"EUR","Memo":"R\u00FCckzahlung \u002B Geb\u00FChr \uD83D\uDCB6","Path":"a\\b/c\n"}}',0,'2026-07-01 16:02:20.131072',NULL,'Scheduled');
COMMIT;

BEGIN;
INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
VALUES(1884513265453617154,'v1','inventory.reserved','{"Headers":{"cap-callback-name":"inventory.reserve-result","cap-msg-id":"1884513265453617154","cap-corr-id":"1884513265453617154","cap-corr-seq":"0","cap-msg-name":"inventory.reserved","cap-msg-type":"StockReserved","cap-senttime":"07/01/2026 16:02:21"},"Value":{"Sku":"K\u00D6LN-1","Reserved":true,"Qty":2,"Warehouse":null}}',0,'2026-07-01 16:02:21.000001',NULL,'Scheduled');
INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
VALUES(1884513265453617155,'v1','audit.ping','{"Headers":{"cap-callback-name":null,"cap-msg-id":"1884513265453617155","cap-corr-id":"1884513265453617155","cap-corr-seq":"0","cap-msg-name":"audit.ping","cap-msg-type":"Object","cap-senttime":"07/01/2026 16:02:21"},"Value":null}',0,'2026-07-01 16:02:21.250000',NULL,'Scheduled');
INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
VALUES(1884513265453617156,'v1','orders.created','{"Headers":{"cap-callback-name":null,"cap-msg-id":"1884513265453617156","cap-corr-id":"1884513265453617156","cap-corr-seq":"0","cap-msg-name":"orders.created","cap-msg-type":"OrderCreated","cap-senttime":"07/01/2026 16:02:21"},"Value":{"OrderId":43,"Customer":"\u00C9lodie \u0141uczak","Total":0.1,"Lines":[{"Sku":"A-1","Qty":1,"Price":0.1},{"Sku":"B-2","Qty":0,"Price":12.50}],"Tags":["neu","gr\u00FC\u00DF"]}}',0,'2026-07-01 16:02:21.500000',NULL,'Scheduled');
COMMIT;

BEGIN;
INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
VALUES(1884513265453617157,'v1','orders.shipped','{"Headers":{"cap-callback-name":null,"cap-msg-id":"1884513265453617157","cap-corr-id":"1884513265453617157","cap-corr-seq":"0","cap-msg-name":"orders.shipped","cap-msg-type":"String","cap-senttime":"07/01/2026 16:02:22"},"Value":"Versand an M\u00FCller"}',0,'2026-07-01 16:02:22.000000',NULL,'Scheduled');
INSERT INTO "cap"."published" ("Id","Version","Name","Content","Retries","Added","ExpiresAt","StatusName")
VALUES(1884513265453617158,'v1','orders.created','{"Headers":{"cap-callback-name":null,"cap-msg-id":"1884513265453617158","cap-corr-id":"1884513265453617158","cap-corr-seq":"0","cap-msg-name":"orders.created","cap-msg-type":"OrderCreated","cap-senttime":"07/01/2026 16:02:22"},"Value":{"OrderId":44,"Customer":"\u0417\u043E\u044F","Total":1250.00,"Lines":[]}}',0,'2026-07-01 16:02:22.750000',NULL,'Scheduled');
COMMIT;
