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

/// What a standby relay polls: the backend streaming the slot, and only a slot of this
/// database; a second reader is refused as "in use", which the relay waits out as a standby.
#[tokio::test]
async fn the_slot_holder_is_the_walsender_streaming_it_and_a_second_reader_is_refused() {
    use std::time::Duration;

    use relay_core::Lsn;
    use relay_core::stage::ErrorClass;

    let pg = PostgresServer::start().await.unwrap();
    pg.create_database("app").await.unwrap();
    let client = pg.connect("app").await.unwrap();
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('held', 'pgoutput')")
        .await
        .unwrap();
    assert_eq!(slot_holder(&client, "held").await.unwrap(), None, "free");
    assert_eq!(slot_holder(&client, "missing").await.unwrap(), None);

    let settings = crate::PostgresSettings {
        url: pg.url("app"),
        slot: "held".into(),
        publication: "held_pub".into(),
        connect_timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let source = crate::PgSource::start(&settings, Lsn(0), Lsn(0))
        .await
        .unwrap();
    let walsender: i32 = client
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(slot_holder(&client, "held").await.unwrap(), Some(walsender));
    // Another database's session cannot stream this slot: nothing to wait for there.
    let other = pg.connect("postgres").await.unwrap();
    assert_eq!(slot_holder(&other, "held").await.unwrap(), None);

    let refused = crate::PgSource::start(&settings, Lsn(0), Lsn(0))
        .await
        .unwrap_err();
    assert_eq!(refused.class, ErrorClass::SlotInUse, "{refused}");
    assert!(
        refused.message.contains("SQLSTATE 55006"),
        "{}",
        refused.message
    );

    source.stop(Duration::from_secs(5)).await;
    let mut holder = slot_holder(&client, "held").await.unwrap();
    for _ in 0..100 {
        if holder.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        holder = slot_holder(&client, "held").await.unwrap();
    }
    assert_eq!(holder, None, "free again once its reader stopped");
}
