//! Fault scenarios 8-13: slot lag and loss, standby takeover, re-sends, transaction shapes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use nix::sys::signal::Signal;

use super::{config_in_mode, fault_config, settle, started};
use crate::cost::{cpu_time, warnings};
use crate::faults::oracle::*;
use crate::support::*;

/// 8. An idle outbox while another table writes a lot of WAL: the slot's lag stays bounded.
/// Then, with an event outstanding behind a stalled NATS, no keepalive position is confirmed
/// past it; kill the relay then: lost 0.
#[tokio::test(flavor = "multi_thread")]
async fn s08_idle_outbox_lag_bounded_and_no_keepalive_past_an_unacked_event() -> Result<()> {
    let env = Env::start().await?;
    let (http, addr) = http_listen();
    let config = fault_config(&env, &http);
    let mut relay = started(&config, &[]).await?;
    let db = env.db().await?;
    db.batch_execute("CREATE TABLE filler (pad text)").await?;
    insert_event(&db, "Warm", "Up", "{}").await?;
    wait_stream_count(&env, 1, Duration::from_secs(20)).await?;

    // Part 1: WAL from another table in batches of ~12 MB, at least 16 batches and on until the
    // slot has been seen to move (at most 48); sample the slot's lag. Bounded means: the slot
    // moves while the writes go on, and catches up with the end of WAL soon after they stop.
    // The slot can only move as far as the walsender has decoded and reported, so a short
    // pause between batches lets a busy machine's walsender keep pace, as a busy table's
    // writer would; how far it trails meanwhile is reported, not asserted.
    let slot_before = env.slot_confirmed().await?.unwrap_or(0);
    let mut max_lag = 0u64;
    // The highest the slot got while the other table was still writing (before the last batch).
    let mut slot_mid = 0u64;
    let mut batches = 0;
    while batches < 16 || (slot_mid <= slot_before && batches < 48) {
        db.batch_execute(
            "INSERT INTO filler SELECT repeat(md5(random()::text), 32) FROM generate_series(1, 12000)",
        )
        .await?;
        batches += 1;
        let slot = env.slot_confirmed().await?.unwrap_or(0);
        max_lag = max_lag.max(env.current_wal().await? - slot);
        slot_mid = slot_mid.max(slot);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One more batch, so every position counted above was seen while the writes went on.
    db.batch_execute(
        "INSERT INTO filler SELECT repeat(md5(random()::text), 32) FROM generate_series(1, 12000)",
    )
    .await?;
    let written_to = env.current_wal().await?;
    let written = written_to - slot_before;
    let caught_up = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.slot_confirmed().await?.unwrap_or(0) < written_to {
        assert!(
            Instant::now() < deadline,
            "slot did not catch up with the idle outbox"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let catch_up = caught_up.elapsed();
    assert!(
        slot_mid > slot_before,
        "the slot moved while the other table wrote"
    );

    // Part 2: stall NATS, commit one event, keep other tables writing.
    env.nats.pause()?;
    insert_event(&db, "Held", "Back", "{}").await?;
    let after_event = env.current_wal().await?;
    // The event was read and published, and waits for its ack.
    let held = wait_metric(
        &addr,
        "outbox_relay_outstanding_acks",
        Duration::from_secs(10),
        |n| n >= 1.0,
    )
    .await
    .unwrap_or(0.0);
    for _ in 0..6 {
        db.batch_execute(
            "INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 5000)",
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let slot = env.slot_confirmed().await?.unwrap_or(0);
        let checkpoint = env.checkpoint().await?.unwrap_or(0);
        assert!(
            slot < after_event && checkpoint < after_event,
            "confirmed past an unacked event"
        );
    }
    relay.kill9();
    env.nats.resume()?;
    let _relay = started(&config, &[]).await?;
    let mut v = classify(&env, "8 idle outbox / keepalive", false, settle(), "").await?;
    v.note = format!(
        "slot moved during {} MB of other-table WAL in {batches} batches (max lag {} MB), caught up {:.1} s after; nothing confirmed past the stalled event ({held} outstanding)",
        written >> 20,
        max_lag >> 20,
        catch_up.as_secs_f64()
    );
    v.require(
        held == 1.0,
        "the held event published and outstanding behind the stalled NATS",
    );
    v.assert();
    Ok(())
}

/// 9. Two relays with the same config, `[relay] reconnect_max` at its default (10 s): one
/// streams, the other waits as its standby at next to no cost (no warning, no session start,
/// little CPU over 5 s of waiting) and, after the first is killed under load, streams within
/// 10 s. Nothing lost.
#[tokio::test(flavor = "multi_thread")]
async fn s09_standby_takes_over_after_the_active_relay_dies() -> Result<()> {
    let env = Env::start().await?;
    let config = default_reconnect_max(fault_config(&env, ""))?;
    let mut active = started(&config, &[]).await?;
    let standby = Relay::start(&config)?;
    standby
        .wait_log("waiting as a standby", Duration::from_secs(20))
        .await?;

    // What waiting costs: log lines at WARN or ERROR, session starts (each logs where it
    // resumes, before it reads the stream's tail), CPU of the standby and of nats-server.
    const SESSION_START: &str = "resuming from the stored checkpoint";
    let nats_pid = env.nats.pid().context("nats-server runs")?;
    let before = (
        warnings(&standby.log()),
        standby.log().matches(SESSION_START).count(),
        cpu_time(standby.pid())?,
        cpu_time(nats_pid)?,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let warned = warnings(&standby.log()) - before.0;
    let session_starts = standby.log().matches(SESSION_START).count() - before.1;
    let standby_cpu = cpu_time(standby.pid())? - before.2;
    let nats_cpu = cpu_time(nats_pid)? - before.3;

    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    active.kill9();
    let killed = Instant::now();
    standby
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    let takeover = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    load.stop().await;
    let mut v = classify(&env, "9 standby takeover", false, settle(), "").await?;
    v.note = format!(
        "took over {:.1} s after kill -9 (reconnect_max at its default); 5 s of waiting: standby CPU {} ms, nats-server CPU {} ms (beside an idle active relay), {warned} warnings, {session_starts} session starts",
        takeover.as_secs_f64(),
        standby_cpu.as_millis(),
        nats_cpu.as_millis()
    );
    v.require(
        takeover < Duration::from_secs(10),
        "the standby streams within 10 s",
    );
    v.require(warned == 0, "no WARN or ERROR line while waiting");
    v.require(session_starts == 0, "no session start while waiting");
    v.require(
        standby_cpu < Duration::from_millis(500),
        "under 0.5 s of CPU in 5 s of waiting",
    );
    v.assert_with_log(&standby.log());
    Ok(())
}

/// `config` with `[relay] reconnect_max` left out: at its default, as a deployment has it.
fn default_reconnect_max(config: PathBuf) -> Result<PathBuf> {
    let text = std::fs::read_to_string(&config)?;
    let without = text.replace("reconnect_max = \"1s\"\n", "");
    ensure!(without != text, "no reconnect_max in {}", config.display());
    std::fs::write(&config, without)?;
    Ok(config)
}

/// 10. A dropped slot, and a slot invalidated by max_slot_wal_keep_size: a clear error and exit
/// 65, never a silent new slot.
#[tokio::test(flavor = "multi_thread")]
async fn s10_lost_slot_is_refused() -> Result<()> {
    let env = Env::start_with_pg(relay_testkit::PgOptions {
        settings: vec![("max_slot_wal_keep_size".into(), "32MB".into())],
        ..Default::default()
    })
    .await?;
    let config = fault_config(&env, "");
    let db = env.db().await?;

    // Dropped while the relay was stopped.
    let mut relay = started(&config, &[]).await?;
    insert_event(&db, "Before", "Drop", "{}").await?;
    wait_stream_count(&env, 1, Duration::from_secs(20)).await?;
    relay.signal(Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(30)).await?;
    db.execute("SELECT pg_drop_replication_slot('relay_slot')", &[])
        .await?;
    let mut relay = Relay::start(&config)?;
    let dropped = relay.wait_exit(Duration::from_secs(30)).await?;
    let dropped_log = relay.log();
    let slots: i64 = db
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await?
        .get(0);

    // Invalidated: recreate cleanly (operator reset), stop, outgrow max_slot_wal_keep_size.
    db.execute("DELETE FROM outbox_relay.checkpoint", &[])
        .await?;
    let mut relay = started(&config, &[]).await?;
    insert_event(&db, "Before", "Invalidation", "{}").await?;
    wait_stream_count(&env, 2, Duration::from_secs(20)).await?;
    relay.signal(Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(30)).await?;
    db.batch_execute("CREATE TABLE filler (pad text)").await?;
    for _ in 0..6 {
        db.batch_execute(
            "INSERT INTO filler SELECT repeat(md5(random()::text), 64) FROM generate_series(1, 5000); \
             SELECT pg_switch_wal(); CHECKPOINT;",
        )
        .await?;
    }
    let wal_status: Option<String> = db
        .query_one(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'relay_slot'",
            &[],
        )
        .await?
        .get(0);
    let mut relay = Relay::start(&config)?;
    let invalidated = relay.wait_exit(Duration::from_secs(30)).await?;
    let invalidated_log = relay.log();
    // The events published before each loss, each once; nothing since.
    let mut v = classify(
        &env,
        "10 slot dropped / invalidated",
        false,
        settle(),
        &format!(
            "exit {} after the drop ({slots} slots left), exit {} with wal_status={}",
            dropped.code().unwrap_or(-1),
            invalidated.code().unwrap_or(-1),
            wal_status.as_deref().unwrap_or_default()
        ),
    )
    .await?;
    v.require(
        dropped.code() == Some(65) && dropped_log.contains("is gone"),
        "a dropped slot: exit 65 naming it gone",
    );
    v.require(slots == 0, "no new slot created for a dropped one");
    v.require(
        wal_status.as_deref() == Some("lost"),
        "the slot invalidated (wal_status lost) before the restart",
    );
    v.require(
        invalidated.code() == Some(65) && invalidated_log.contains("invalidated"),
        "an invalidated slot: exit 65 naming it invalidated",
    );
    if !v.pass {
        eprintln!(
            "--- after the drop ---\n{dropped_log}\n--- after the invalidation ---\n{invalidated_log}"
        );
    }
    v.assert();
    Ok(())
}

/// 11. The slot's confirmed position is ahead of the stored checkpoint: refused with the gap
/// named, unless told to accept it.
#[tokio::test(flavor = "multi_thread")]
async fn s11_slot_ahead_of_checkpoint_is_refused() -> Result<()> {
    let env = Env::start().await?;
    let config = fault_config(&env, "");
    let db = env.db().await?;
    let mut relay = started(&config, &[]).await?;
    insert_event(&db, "Before", "Gap", "{}").await?;
    wait_stream_count(&env, 1, Duration::from_secs(20)).await?;
    relay.signal(Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(30)).await?;

    let mut gap = Vec::new();
    for _ in 0..5 {
        gap.push(insert_event(&db, "In", "Gap", "{}").await?);
    }
    db.execute(
        "SELECT pg_replication_slot_advance('relay_slot', pg_current_wal_lsn())",
        &[],
    )
    .await?;
    let mut relay = Relay::start(&config)?;
    let status = relay.wait_exit(Duration::from_secs(30)).await?;
    assert_eq!(status.code(), Some(65), "{}", relay.log());
    assert!(
        relay.log().contains("but the relay's checkpoint is"),
        "{}",
        relay.log()
    );
    assert!(
        relay.log().contains("--accept-slot-position"),
        "{}",
        relay.log()
    );

    let relay = Relay::start_with_args(&config, &["run", "--accept-slot-position"])?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    insert_event(&db, "After", "Gap", "{}").await?;
    // The gap was accepted by the operator: take those rows out of the oracle's truth.
    for id in &gap {
        db.execute("DELETE FROM outbox WHERE id = $1::text::uuid", &[id])
            .await?;
    }
    classify(
        &env,
        "11 slot ahead of checkpoint",
        false,
        settle(),
        "exit 65 naming the gap; runs after --accept-slot-position",
    )
    .await?
    .assert();
    Ok(())
}

/// 12. A re-send after the relay was down longer than the stream's duplicate window: the relay
/// reads what the stream already holds past its checkpoint and skips those events, so no second
/// copy lands (the relay is the only writer of these event ids).
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread")]
async fn s12_resend_after_the_duplicate_window_is_skipped() -> Result<()> {
    let env = Env::start().await?;
    let config = config_in_mode(&env, "duplicate_window = \"500ms\"", "");
    let mut relay = started(&config, &[("RELAY_FAILPOINT", "after_ack_before_store:3")]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    let status = relay.wait_exit(Duration::from_secs(60)).await?;
    assert!(!status.success());
    load.stop().await;
    // Down for longer than the duplicate window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let relay = started(&config, &[]).await?;
    let mut v = classify(
        &env,
        "12 re-send past the duplicate window",
        false,
        settle(),
        "",
    )
    .await?;
    let skipped = relay
        .log()
        .lines()
        .find(|l| l.contains("already in the stream"))
        .map(str::to_owned)
        .unwrap_or_default();
    v.note =
        "crash after acks, down 2 s > 500 ms window; stream scanned past the checkpoint".into();
    v.pass &= !skipped.is_empty();
    v.assert();
    Ok(())
}

/// 13. Aborted transactions, rolled-back savepoints, prepared transactions committed or rolled
/// back later, a long-open transaction while others flow.
#[tokio::test(flavor = "multi_thread")]
async fn s13_aborts_savepoints_prepared_and_long_open_transactions() -> Result<()> {
    let env = Env::start_with_pg(relay_testkit::PgOptions {
        settings: vec![("max_prepared_transactions".into(), "10".into())],
        ..Default::default()
    })
    .await?;
    let config = fault_config(&env, "");
    let _relay = started(&config, &[]).await?;
    let js = env.jetstream().await?;

    let mut long = env.db().await?;
    let long_tx = long.transaction().await?;
    let long_id = insert_event(&long_tx, "Long", "Open", "{}").await?;

    let db = env.db().await?;
    // Others keep flowing while the long transaction is open.
    let flowing = insert_event(&db, "Flow", "Meanwhile", "{}").await?;
    let got = wait_for_messages(&js, 1, Duration::from_secs(20), None).await?;
    assert_eq!(got[0].id(), flowing);

    db.batch_execute(
        "BEGIN;
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Sp', '1', 'Kept', '{}');
         SAVEPOINT s;
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Sp', '2', 'RolledBack', '{}');
         ROLLBACK TO SAVEPOINT s;
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Sp', '3', 'Kept', '{}');
         COMMIT;
         BEGIN;
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Abort', '1', 'Never', '{}');
         ROLLBACK;
         BEGIN;
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Prep', '1', 'Committed', '{}');
         PREPARE TRANSACTION 'p_commit';
         BEGIN;
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Prep', '2', 'RolledBack', '{}');
         PREPARE TRANSACTION 'p_rollback';",
    )
    .await?;
    let middle = insert_event(&db, "Flow", "BetweenPrepareAndCommit", "{}").await?;
    wait_for_messages(&js, 4, Duration::from_secs(20), None).await?;
    db.batch_execute("COMMIT PREPARED 'p_commit'").await?;
    db.batch_execute("ROLLBACK PREPARED 'p_rollback'").await?;
    long_tx.commit().await?;
    let v = classify(
        &env,
        "13 aborts, savepoints, 2PC, long tx",
        false,
        settle(),
        "phantom 0; others flowed while a tx was open",
    )
    .await?;
    let subjects: Vec<String> = read_stream(&js)
        .await?
        .iter()
        .map(|m| m.subject.clone())
        .collect();
    assert!(
        !subjects
            .iter()
            .any(|s| s.contains("RolledBack") || s.contains("Never")),
        "{subjects:?}"
    );
    let order: Vec<String> = read_stream(&js)
        .await?
        .iter()
        .map(|m| m.id().to_owned())
        .collect();
    let pos = |id: &str| order.iter().position(|x| x == id);
    assert!(
        pos(&middle) < pos(&long_id),
        "commit order: the long tx committed last"
    );
    v.assert();
    Ok(())
}
