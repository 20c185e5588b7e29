use relay_testkit::PostgresServer;

use super::*;
use crate::checkpoint::{CHECKPOINT_MIGRATION, POSITION_MAP_MIGRATION};

// The backfill's cursor table, whose migrations are relay-backfill's (which depends on this crate).
const BACKFILL_MIGRATION: &str = include_str!("../../../../../migrations/0003_relay_backfill.sql");
const BACKFILL_ON_CREATE_MIGRATION: &str =
    include_str!("../../../../../migrations/0007_backfill_on_create.sql");

#[tokio::test]
async fn the_relay_tables_presence_and_access_are_read() {
    let pg = PostgresServer::start().await.unwrap();
    let client = pg.connect("postgres").await.unwrap();
    let checkpoint = || relay_table_access(&client, "checkpoint", "SELECT, INSERT, UPDATE");
    assert_eq!(checkpoint().await.unwrap(), TableAccess::Missing);
    assert!(!backfill_table_exists(&client).await.unwrap());
    assert!(!backfill_table_named(&client).await.unwrap());

    client.batch_execute(CHECKPOINT_MIGRATION).await.unwrap();
    client.batch_execute(BACKFILL_MIGRATION).await.unwrap();
    assert_eq!(checkpoint().await.unwrap(), TableAccess::Usable);
    assert!(backfill_table_exists(&client).await.unwrap());
    assert!(backfill_table_named(&client).await.unwrap());
    assert!(!backfill_has_on_create_columns(&client).await.unwrap());
    client
        .batch_execute(BACKFILL_ON_CREATE_MIGRATION)
        .await
        .unwrap();
    assert!(backfill_has_on_create_columns(&client).await.unwrap());

    // Every privilege of the list is needed, and USAGE on the schema.
    client
        .batch_execute(
            "CREATE ROLE reader LOGIN; GRANT USAGE ON SCHEMA outbox_relay TO reader; \
             GRANT SELECT, INSERT ON outbox_relay.checkpoint TO reader; SET ROLE reader",
        )
        .await
        .unwrap();
    let not_granted = TableAccess::NotGranted {
        role: "reader".into(),
    };
    assert_eq!(checkpoint().await.unwrap(), not_granted);
    client
        .batch_execute(
            "RESET ROLE; GRANT UPDATE ON outbox_relay.checkpoint TO reader; SET ROLE reader",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint().await.unwrap(), TableAccess::Usable);
    client
        .batch_execute(
            "RESET ROLE; REVOKE USAGE ON SCHEMA outbox_relay FROM reader; SET ROLE reader",
        )
        .await
        .unwrap();
    assert_eq!(checkpoint().await.unwrap(), not_granted);
    // In the catalog, but not by name: to_regclass needs USAGE on the schema.
    assert!(backfill_table_exists(&client).await.unwrap());
    assert!(backfill_table_named(&client).await.is_err());
}

#[tokio::test]
async fn only_existing_slots_of_this_database_map_a_stream() {
    let pg = PostgresServer::start().await.unwrap();
    let client = pg.connect("postgres").await.unwrap();
    client.batch_execute(POSITION_MAP_MIGRATION).await.unwrap();
    client
        .batch_execute(
            "SELECT pg_create_logical_replication_slot('mapped_b', 'pgoutput'); \
             SELECT pg_create_logical_replication_slot('mapped_a', 'pgoutput'); \
             INSERT INTO outbox_relay.position_map (slot_name, stream, commit_lsn, commit_time, stream_seq) \
             VALUES ('mapped_b', 'EVENTS', '0/10', now(), 1), ('mapped_b', 'EVENTS', '0/20', now(), 2), \
                    ('mapped_a', 'EVENTS', '0/30', now(), 3), ('mapped_a', 'OTHER', '0/30', now(), 1), \
                    ('dropped', 'EVENTS', '0/5', now(), 1)",
        )
        .await
        .unwrap();
    assert_eq!(
        slots_mapping_stream(&client, "EVENTS").await.unwrap(),
        ["mapped_a", "mapped_b"]
    );
    assert_eq!(
        slots_mapping_stream(&client, "OTHER").await.unwrap(),
        ["mapped_a"]
    );
    assert!(
        slots_mapping_stream(&client, "NONE")
            .await
            .unwrap()
            .is_empty()
    );
}
