//! The standby helper: a streaming standby by base backup or file copy, cut off its primary,
//! slot synchronization (PostgreSQL 17+) and promotion.

use std::time::Duration;

use relay_testkit::{PostgresServer, StandbyOptions};

async fn count(server: &PostgresServer) -> anyhow::Result<i64> {
    Ok(server
        .connect("postgres")
        .await?
        .query_one("SELECT count(*) FROM t", &[])
        .await?
        .get(0))
}

#[tokio::test]
async fn standby_streams_is_cut_off_syncs_slots_and_is_promoted() -> anyhow::Result<()> {
    let primary = PostgresServer::start().await?;
    let db = primary.connect("postgres").await?;
    db.batch_execute("CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
        .await?;
    let failover_slots = primary.version_num() >= 170_000;
    if failover_slots {
        db.execute(
            "SELECT pg_create_logical_replication_slot('logical1', 'pgoutput', false, false, true)",
            &[],
        )
        .await?;
    }
    let standby = primary.start_standby(StandbyOptions::default()).await?;
    assert!(standby.is_in_recovery().await?);
    assert_eq!(count(&standby).await?, 1);

    // A second standby by file copy (pg_backup_start / pg_backup_stop).
    let copied = primary
        .start_standby(StandbyOptions {
            slot: "standby2".into(),
            force_file_copy: true,
            ..StandbyOptions::default()
        })
        .await?;
    assert_eq!(count(&copied).await?, 1);

    standby.disconnect_from_primary().await?;
    db.execute("INSERT INTO t VALUES (2)", &[]).await?;
    primary
        .wait_replayed(&copied, Duration::from_secs(10))
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&standby).await?, 1, "cut off: nothing received");
    standby.reconnect_to_primary().await?;
    primary
        .wait_replayed(&standby, Duration::from_secs(20))
        .await?;
    assert_eq!(count(&standby).await?, 2);

    if failover_slots {
        // A synchronized slot becomes persistent once the primary's slot moves on, and its
        // restart_lsn moves only past a running-transactions record: log one and advance the
        // slot over it, again, until the standby has the slot (the standby's WAL starts after
        // the slot's first restart_lsn, which the sync worker refuses until then).
        let mut synced = Err(anyhow::anyhow!("not tried"));
        for _ in 0..6 {
            db.batch_execute("SELECT pg_log_standby_snapshot()").await?;
            let lsn: String = db
                .query_one("SELECT pg_current_wal_lsn()::text", &[])
                .await?
                .get(0);
            db.execute(
                "SELECT pg_replication_slot_advance('logical1', pg_current_wal_lsn())",
                &[],
            )
            .await?;
            synced = standby
                .wait_slot_synced("logical1", &lsn, Duration::from_secs(5))
                .await;
            if synced.is_ok() {
                break;
            }
        }
        synced?;
    } else {
        eprintln!(
            "relay-testkit: PostgreSQL {} has no failover slots; slot synchronization not tested",
            primary.version_num()
        );
    }

    standby.promote().await?;
    assert!(!standby.is_in_recovery().await?);
    standby
        .connect("postgres")
        .await?
        .execute("INSERT INTO t VALUES (3)", &[])
        .await?;
    assert_eq!(count(&standby).await?, 3);
    if failover_slots {
        let synced: bool = standby
            .connect("postgres")
            .await?
            .query_one(
                "SELECT synced FROM pg_replication_slots WHERE slot_name = 'logical1'",
                &[],
            )
            .await?
            .get(0);
        assert!(synced, "the synchronized slot came over");
    }
    Ok(())
}
