-- Spring Modulith 2.1 event publication registry (spring-modulith-events-jdbc, schema v2, the default
-- since 2.0), table event_publication in the search_path schema (public).
--
-- DDL: spring-projects/spring-modulith spring-modulith-events/spring-modulith-events-jdbc/src/main/
--      resources/org/springframework/modulith/events/jdbc/schemas/v2/schema-postgresql.sql
--      (event_publication_archive, from schema-postgresql-archive.sql, exists only in ARCHIVE
--      completion mode and is not created here).
-- Rows: JdbcEventPublicationRepositoryV2.create, one INSERT per publication, i.e. one row per
--      transactional listener of the event, all in the publishing transaction
--      (PersistentApplicationEventMulticaster.storePublications):
--      INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
--      VALUES (?, ?, ?, ?, ?, 'PUBLISHED', 1, ?)
--      ID is a random UUID per row (no event-level id); SERIALIZED_EVENT is Jackson (non-ASCII raw,
--      BigDecimal scale kept, Instant as ISO text); LISTENER_ID is Spring's default
--      <class>.<method>(<parameter types>) or an @ApplicationModuleListener(id = ...).
--
-- What a consumer receives: the recipe keeps one no-op listener with id "outbox-relay" on the
-- events to relay and sets the row filter listener_id = 'outbox-relay', so each event is relayed
-- once: subject from event_type, Nats-Msg-Id = id (of that listener's row), body =
-- serialized_event as stored, no framework headers. Rows of other listeners are NOT relayed.
--
-- tx 1  OrderCompleted #42: 5b8e0f0e-...-9a01 (InventoryManagement, not relayed),
--                           5b8e0f0e-...-9a02 (outbox-relay)
-- tx 2  OrderCompleted #43: 5b8e0f0e-...-9a03 (outbox-relay), 5b8e0f0e-...-9a04 (InventoryManagement, not relayed)
--       OrderShipped #43:   5b8e0f0e-...-9a05 (Notifications, not relayed), 5b8e0f0e-...-9a06 (outbox-relay)
-- tx 3  AuditRecorded:      5b8e0f0e-...-9a07 (AuditLog only, not relayed)
--       CustomerRenamed:    5b8e0f0e-...-9a08 (outbox-relay), 5b8e0f0e-...-9a09 (externalizer, not relayed)

CREATE TABLE IF NOT EXISTS event_publication
(
  id                     UUID NOT NULL,
  listener_id            TEXT NOT NULL,
  event_type             TEXT NOT NULL,
  serialized_event       TEXT NOT NULL,
  publication_date       TIMESTAMP WITH TIME ZONE NOT NULL,
  completion_date        TIMESTAMP WITH TIME ZONE,
  status                 TEXT,
  completion_attempts    INT,
  last_resubmission_date TIMESTAMP WITH TIME ZONE,
  PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS event_publication_serialized_event_hash_idx ON event_publication USING hash(serialized_event);
CREATE INDEX IF NOT EXISTS event_publication_by_completion_date_idx ON event_publication (completion_date);

-- @@ rows

BEGIN;
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a01', 'com.acme.order.OrderCompleted', 'com.acme.inventory.InventoryManagement.on(com.acme.order.OrderCompleted)', '2026-07-01 14:02:20.123456+00', '{"orderId":"42","customer":"José \"JJ\" Müller","total":12.50,"completedAt":"2026-07-01T14:02:20.123456Z"}', 'PUBLISHED', 1, '2026-07-01 14:02:20.123456+00');
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a02', 'com.acme.order.OrderCompleted', 'outbox-relay', '2026-07-01 14:02:20.123456+00', '{"orderId":"42","customer":"José \"JJ\" Müller","total":12.50,"completedAt":"2026-07-01T14:02:20.123456Z"}', 'PUBLISHED', 1, '2026-07-01 14:02:20.123456+00');
COMMIT;

BEGIN;
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a03', 'com.acme.order.OrderCompleted', 'outbox-relay', '2026-07-01 14:02:21.000001+00', '{"orderId":"43","customer":"Élodie Łuczak","total":0.10,"completedAt":"2026-07-01T14:02:21.000001Z"}', 'PUBLISHED', 1, '2026-07-01 14:02:21.000001+00');
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a04', 'com.acme.order.OrderCompleted', 'com.acme.inventory.InventoryManagement.on(com.acme.order.OrderCompleted)', '2026-07-01 14:02:21.000001+00', '{"orderId":"43","customer":"Élodie Łuczak","total":0.10,"completedAt":"2026-07-01T14:02:21.000001Z"}', 'PUBLISHED', 1, '2026-07-01 14:02:21.000001+00');
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a05', 'com.acme.order.OrderShipped', 'com.acme.notification.Notifications.on(com.acme.order.OrderShipped)', '2026-07-01 14:02:21.000002+00', '{"orderId":"43","carrier":"DHL","trackingUrl":"https://example.com/t?id=43&lang=de","address":"Hauptstraße 1\n50667 Köln"}', 'PUBLISHED', 1, '2026-07-01 14:02:21.000002+00');
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a06', 'com.acme.order.OrderShipped', 'outbox-relay', '2026-07-01 14:02:21.000002+00', '{"orderId":"43","carrier":"DHL","trackingUrl":"https://example.com/t?id=43&lang=de","address":"Hauptstraße 1\n50667 Köln"}', 'PUBLISHED', 1, '2026-07-01 14:02:21.000002+00');
COMMIT;

BEGIN;
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a07', 'com.acme.audit.AuditRecorded', 'com.acme.audit.AuditLog.on(com.acme.audit.AuditRecorded)', '2026-07-01 14:02:22.5+00', '{"actor":"system","action":"ship"}', 'PUBLISHED', 1, '2026-07-01 14:02:22.5+00');
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a08', 'com.acme.customer.CustomerRenamed', 'outbox-relay', '2026-07-01 14:02:22.5+00', '{"customerId":7,"oldName":"Zoë","newName":"Зоя Łuczak 😀","creditLimit":1250.00}', 'PUBLISHED', 1, '2026-07-01 14:02:22.5+00');
INSERT INTO EVENT_PUBLICATION (ID, EVENT_TYPE, LISTENER_ID, PUBLICATION_DATE, SERIALIZED_EVENT, STATUS, COMPLETION_ATTEMPTS, LAST_RESUBMISSION_DATE)
VALUES ('5b8e0f0e-6f1e-4f6b-9c55-0d1f3f6a9a09', 'com.acme.customer.CustomerRenamed', 'org.springframework.modulith.events.support.EventExternalizerModuleListener.externalize(java.lang.Object)', '2026-07-01 14:02:22.5+00', '{"customerId":7,"oldName":"Zoë","newName":"Зоя Łuczak 😀","creditLimit":1250.00}', 'PUBLISHED', 1, '2026-07-01 14:02:22.5+00');
COMMIT;
