//! Restarts: a clean stop re-sends nothing; a kill -9 re-sends only what JetStream drops.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;
use nix::sys::signal::Signal;

use crate::support::*;

/// Writes `txs` transactions of `rows` events each, with a short pause between transactions.
async fn write_events(env_url: String, txs: usize, rows: usize) -> Result<Vec<String>> {
    let (mut client, connection) = tokio_postgres::connect(&env_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let mut ids = Vec::new();
    for t in 0..txs {
        let tx = client.transaction().await?;
        for r in 0..rows {
            ids.push(
                insert_event(
                    &tx,
                    "Load",
                    "Written",
                    &format!(r#"{{"t": {t}, "r": {r}}}"#),
                )
                .await?,
            );
        }
        tx.commit().await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(ids)
}

fn counts(got: &[Received]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for m in got {
        *counts.entry(m.id().to_owned()).or_default() += 1;
    }
    counts
}

/// SIGTERM mid-stream: exit 0 after draining; after a restart every event is there, and
/// nothing was published twice (the stream's duplicate window is only 100 ms, so a re-send
/// after the restart would be stored as a second copy).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_stream_then_restart_delivers_all_and_resends_nothing() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config_full("create_stream = true\nduplicate_window = \"100ms\"", "");
    let mut relay = Relay::start_streaming(&config).await?;

    let writer = tokio::spawn(write_events(env.pg.url(DB), 60, 10));
    let js = env.jetstream().await?;
    wait_for_messages(&js, 100, Duration::from_secs(30), Some(&relay)).await?;
    relay.signal(Signal::SIGTERM);
    let status = relay.wait_exit(Duration::from_secs(30)).await?;
    assert!(
        status.success(),
        "clean exit, got {status:?}; log:\n{}",
        relay.log()
    );
    assert!(relay.log().contains("drained"), "{}", relay.log());
    let ids = writer.await??;

    let relay = Relay::start(&config)?;
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(&relay)).await?;
    // Give a late re-send the chance to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let got_after = read_stream(&js).await?;
    assert_eq!(got_after.len(), got.len(), "no further messages");
    let counts = counts(&got_after);
    for id in &ids {
        assert_eq!(counts.get(id), Some(&1), "event {id} exactly once");
    }
    assert_eq!(got_after.len(), ids.len(), "no unexpected messages");
    Ok(())
}

/// kill -9 mid-stream: after a restart every event is in the stream exactly once (re-sends are
/// dropped by Nats-Msg-Id inside the duplicate window).
#[tokio::test(flavor = "multi_thread")]
async fn kill9_mid_stream_then_restart_has_every_event_exactly_once() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config("");
    let mut relay = Relay::start_streaming(&config).await?;

    let writer = tokio::spawn(write_events(env.pg.url(DB), 60, 10));
    let js = env.jetstream().await?;
    wait_for_messages(&js, 150, Duration::from_secs(30), Some(&relay)).await?;
    relay.kill9();
    let ids = writer.await??;

    let relay = Relay::start(&config)?;
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(&relay)).await?;
    let counts = counts(&got);
    for id in &ids {
        assert_eq!(counts.get(id), Some(&1), "event {id} exactly once");
    }
    assert_eq!(got.len(), ids.len());
    // The checkpoint catches up to the end and the slot follows it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (checkpoint, slot) = (env.checkpoint().await?, env.slot_confirmed().await?);
        if checkpoint.is_some() && slot == checkpoint {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "slot {slot:?} never reached checkpoint {checkpoint:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// An operator (or a failover tool) terminates the relay's sessions with
/// `pg_terminate_backend` (SQLSTATE 57P01) while events flow, once in the middle of a checkpoint
/// write (held on a table lock so the server's reply is that error) and then the walsender too:
/// the relay reconnects and delivers every event instead of stopping as if the error were a
/// configuration problem.
#[tokio::test(flavor = "multi_thread")]
async fn terminated_sessions_are_reconnected_not_fatal() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config_full("create_stream = true", "");
    let mut relay = Relay::start_streaming(&config).await?;
    let mut db = env.db().await?;
    let js = env.jetstream().await?;

    // 1. A checkpoint write that the server answers with "terminating connection".
    let lock = db.transaction().await?;
    lock.batch_execute("LOCK TABLE outbox_relay.checkpoint IN EXCLUSIVE MODE")
        .await?;
    let mut ids = write_events(env.pg.url(DB), 3, 5).await?;
    let blocked = wait_for_pid(
        &env,
        "application_name = 'outbox-relay' AND wait_event_type = 'Lock'",
        &relay,
    )
    .await?;
    lock.execute("SELECT pg_terminate_backend($1)", &[&blocked])
        .await?;
    lock.commit().await?;
    relay
        .wait_log("cannot store checkpoint", Duration::from_secs(30))
        .await?;

    // 2. Every session of the relay, three times, while events flow.
    let writer = tokio::spawn(write_events(env.pg.url(DB), 100, 5));
    for _ in 0..3 {
        wait_for_pid(
            &env,
            "application_name = 'outbox-relay' AND backend_type = 'walsender'",
            &relay,
        )
        .await?;
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'outbox-relay'",
            &[],
        )
        .await?;
    }
    ids.extend(writer.await??);
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(&relay)).await?;
    let counts = counts(&got);
    for id in &ids {
        assert!(counts.contains_key(id), "event {id} delivered");
    }
    assert!(
        relay.try_status()?.is_none(),
        "the relay is still running; log:\n{}",
        relay.log()
    );
    Ok(())
}

/// Waits up to 30 s for a backend matching `filter` (SQL over pg_stat_activity); its pid.
async fn wait_for_pid(env: &Env, filter: &str, relay: &Relay) -> Result<i32> {
    let db = env.db().await?;
    let sql = format!("SELECT pid FROM pg_stat_activity WHERE {filter} LIMIT 1");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(row) = db.query_opt(&sql, &[]).await? {
            return Ok(row.get(0));
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no session with {filter}; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
