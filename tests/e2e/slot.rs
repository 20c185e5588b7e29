//! The slot keeps moving when only other tables write WAL.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn idle_outbox_with_busy_other_table_keeps_the_slot_advancing() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute("CREATE TABLE busy (id bigserial PRIMARY KEY, pad text)")
        .await?;
    let relay = Relay::start_streaming(&env.config("")).await?;
    let before = env.slot_confirmed().await?.expect("slot exists");

    for _ in 0..20 {
        db.execute(
            "INSERT INTO busy (pad) SELECT repeat('x', 500) FROM generate_series(1, 500)",
            &[],
        )
        .await?;
    }
    let target: i64 = db
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await?
        .get(0);
    assert!(
        target as u64 > before + 1_000_000,
        "the busy table wrote WAL"
    );

    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let slot = env.slot_confirmed().await?.unwrap_or(0);
        let checkpoint = env.checkpoint().await?.unwrap_or(0);
        if slot >= target as u64 {
            assert!(
                checkpoint >= slot,
                "stored before confirmed: {checkpoint} < {slot}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot stuck at {slot} (checkpoint {checkpoint}), WAL at {target}; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
