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

/// SIGTERM with every transaction read and 200 publishes outstanding (NATS paused): exit 0
/// after draining. The drain itself must store and confirm the position: the stored checkpoint
/// and the slot's `confirmed_flush_lsn` are past the last commit, and the restart re-reads
/// nothing (no event skipped by the start-up stream scan, which would otherwise hide a
/// checkpoint that was never stored) and re-sends nothing (the stream's duplicate window is only
/// 100 ms, so a re-send would be stored as a second copy).
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_mid_stream_then_restart_delivers_all_and_resends_nothing() -> Result<()> {
    let env = Env::start().await?;
    let (http, addr) = http_listen();
    let config = env.config_full("create_stream = true\nduplicate_window = \"100ms\"", &http);
    // NATS is paused for a few seconds below: longer than the usual 3 s ack timeout, whose
    // re-publishes would be stored twice with a 100 ms window once NATS answers again.
    let text = std::fs::read_to_string(&config)?;
    assert!(text.contains("ack_timeout = \"3s\""));
    std::fs::write(
        &config,
        text.replace("ack_timeout = \"3s\"", "ack_timeout = \"60s\""),
    )?;
    let mut relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;
    let db = env.db().await?;
    let mut ids = vec![insert_event(&db, "Warm", "Up", "{}").await?];
    wait_for_messages(&js, 1, Duration::from_secs(30), Some(&relay)).await?;

    env.nats.pause()?;
    let (mut client, connection) =
        tokio_postgres::connect(&env.pg.url(DB), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let mut last_commit = (0, 0);
    for t in 0..20 {
        let tx = client.transaction().await?;
        for r in 0..10 {
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
        let before: i64 = tx
            .query_one("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint", &[])
            .await?
            .get(0);
        tx.commit().await?;
        let after: i64 = client
            .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
            .await?
            .get(0);
        last_commit = (before as u64, after as u64);
    }
    // Every event read and published, none acknowledged.
    let received = wait_metric(
        &addr,
        "outbox_relay_events_received_total",
        Duration::from_secs(20),
        |v| v >= 201.0,
    )
    .await;
    assert_eq!(
        received,
        Some(201.0),
        "the relay read every event; log:\n{}",
        relay.log()
    );
    // The last Commit follows its last row on the same replication stream.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let outstanding = metric(&addr, "outbox_relay_outstanding_acks").await?;
    assert_eq!(outstanding, 200.0, "publishes outstanding at the SIGTERM");
    relay.signal(Signal::SIGTERM);
    relay
        .wait_log("shutdown requested", Duration::from_secs(10))
        .await?;
    env.nats.resume()?;
    let status = relay.wait_exit(Duration::from_secs(30)).await?;
    assert!(
        status.success(),
        "clean exit, got {status:?}; log:\n{}",
        relay.log()
    );
    assert!(relay.log().contains("drained"), "{}", relay.log());

    // The last transaction's commit record, as PostgreSQL streamed it: the header of its events,
    // which lies between the WAL positions seen just before and just after its COMMIT.
    let got = read_stream(&js).await?;
    assert_eq!(got.len(), ids.len(), "everything published before the stop");
    let last = got
        .iter()
        .find(|m| m.id() == ids[ids.len() - 1])
        .expect("last event");
    let commit_lsn = parse_lsn(last.header("Outbox-Commit-Lsn")).expect("commit LSN header");
    assert!(
        last_commit.0 <= commit_lsn && commit_lsn < last_commit.1,
        "commit LSN {commit_lsn} of the last transaction within {last_commit:?}"
    );
    // Checkpoints are Commit end LSNs (or keepalive positions), never inside a record: past the
    // commit record's start means at or past its end.
    let checkpoint = env.checkpoint().await?.expect("checkpoint");
    assert!(
        checkpoint > commit_lsn,
        "stored checkpoint {checkpoint} is past the last commit ({commit_lsn}); log:\n{}",
        relay.log()
    );
    let slot = env.slot_confirmed().await?.expect("slot");
    assert!(
        slot > commit_lsn && slot <= checkpoint,
        "slot confirmed {slot}: past the last commit ({commit_lsn}), not past the checkpoint {checkpoint}"
    );

    // Written while the relay is down; then a restart that reads only these.
    let mut more = write_events(env.pg.url(DB), 10, 10).await?;
    let relay = Relay::start(&config)?;
    wait_for_messages(
        &js,
        ids.len() + more.len(),
        Duration::from_secs(60),
        Some(&relay),
    )
    .await?;
    // Give a late re-send the chance to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let m = scrape(&addr).await?;
    assert_eq!(
        (
            m.get("outbox_relay_events_already_published_total"),
            m.get("outbox_relay_events_received_total")
        ),
        (Some(&0.0), Some(&(more.len() as f64))),
        "the restart skipped nothing and read only the new events; log:\n{}",
        relay.log()
    );
    assert!(
        !relay.log().contains("already in the stream"),
        "{}",
        relay.log()
    );
    let got_after = read_stream(&js).await?;
    ids.append(&mut more);
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
    // The checkpoint catches up to the end and the slot follows it, never ahead of it. The
    // relay keeps storing idle checkpoints (its own writes are WAL), so the two are read
    // around the slot: the slot read between two checkpoint reads is at most the later one
    // (never confirmed past the stored checkpoint) and, once caught up, at least the earlier.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let before = env.checkpoint().await?;
        let slot = env.slot_confirmed().await?;
        let after = env.checkpoint().await?;
        assert!(
            slot <= after,
            "slot {slot:?} confirmed past the stored checkpoint {after:?}"
        );
        if before.is_some() && slot >= before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "slot {slot:?} never reached checkpoint {before:?}"
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
