use relay_testkit::PostgresServer;

use super::*;

#[tokio::test]
async fn the_version_is_read_and_a_slot_is_dropped_only_if_it_exists() {
    let pg = PostgresServer::start().await.unwrap();
    let client = pg.connect("postgres").await.unwrap();
    let version = server_version_num(&client).await.unwrap();
    assert_eq!(u32::try_from(version).unwrap(), pg.version_num());
    assert_eq!(server(&client).await.unwrap().version_num, version);

    client
        .batch_execute("SELECT pg_create_logical_replication_slot('doomed', 'pgoutput')")
        .await
        .unwrap();
    assert!(slot(&client, "doomed").await.unwrap().is_some());
    drop_slot_if_exists(&client, "doomed").await.unwrap();
    assert!(slot(&client, "doomed").await.unwrap().is_none());
    // Not there: nothing happens, no error.
    drop_slot_if_exists(&client, "doomed").await.unwrap();
}
