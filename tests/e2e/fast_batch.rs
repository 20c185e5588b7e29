//! `[nats] publish_mode = "fast-batch"`: JetStream fast batches (flow acks for
//! many messages) on nats-server 2.14+ with a stream the relay creates with `allow_batched`;
//! every event exactly once in commit order, the checkpoint and the slot past the last commit;
//! a kill -9 mid-transaction loses nothing and the re-sent copies are deduplicated; older
//! servers fall back to per-message with one warning.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use relay_testkit::{NatsOptions, NatsServer, PgOptions, PostgresServer};

use crate::support::*;

const FAST_MODE: &str = "publish_mode = \"fast-batch\"\ncreate_stream = true";
const FAST_LOG: &str = "publishing in fast batches";
const FALLBACK_LOG: &str = "publishing each message on its own";
const WAIT: Duration = Duration::from_secs(120);
/// nats-server 2.9 as Debian ships it: no fast batches.
const OLD_SERVER: &str = "/usr/sbin/nats-server";

/// Whether the test's nats-server has fast batches (2.14.0+).
fn fast_batches_supported(env: &Env) -> bool {
    env.nats.version_at_least((2, 14, 0))
}

/// Inserts `rows` outbox rows in one transaction.
async fn insert_rows(db: &tokio_postgres::Client, tag: &str, rows: i64) -> Result<()> {
    db.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         SELECT gen_random_uuid(), $1, g::text, 'Written', jsonb_build_object('g', g) \
         FROM generate_series(1, $2::bigint) g",
        &[&tag, &rows],
    )
    .await?;
    Ok(())
}

/// Every message once, in commit order: `(commit LSN, index in the transaction)` rises strictly
/// through the stream. Returns the last commit LSN.
fn assert_once_in_commit_order(got: &[Received]) -> u64 {
    let mut seen = HashMap::new();
    let mut previous = (0, -1i64);
    for (i, m) in got.iter().enumerate() {
        assert!(
            seen.insert(m.id().to_owned(), i).is_none(),
            "{} stored twice",
            m.id()
        );
        let position = (
            parse_lsn(m.header("Outbox-Commit-Lsn")).expect("commit LSN"),
            m.header("Outbox-Tx-Index").parse::<i64>().expect("index"),
        );
        assert!(
            position > previous,
            "message {i} at {position:?} after {previous:?}"
        );
        previous = position;
    }
    previous.0
}

/// Waits until the stored checkpoint and the slot are past `commit_lsn`, the slot not past the
/// checkpoint.
async fn assert_positions_past(env: &Env, commit_lsn: u64, relay: &Relay) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let checkpoint = env.checkpoint().await?.unwrap_or(0);
        let slot = env.slot_confirmed().await?.unwrap_or(0);
        if checkpoint > commit_lsn && slot > commit_lsn {
            let checkpoint = env.checkpoint().await?.unwrap_or(0);
            ensure!(
                slot <= checkpoint,
                "slot {slot} confirmed past the checkpoint {checkpoint}"
            );
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "checkpoint {checkpoint} / slot {slot} not past the last commit {commit_lsn}; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A 1-row, a 100-row and a 10,000-row transaction: 10,101 events, each once, in commit order,
/// the checkpoint and the slot past the last commit; the stream the relay created has
/// `allow_batched`. On a server before 2.14 the relay says so once and publishes per message.
#[tokio::test(flavor = "multi_thread")]
async fn fast_batches_deliver_1_100_and_10000_row_transactions_once_in_order() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config_full(FAST_MODE, "");
    let relay = Relay::start_streaming(&config).await?;
    let supported = fast_batches_supported(&env);
    relay
        .wait_log(
            if supported { FAST_LOG } else { FALLBACK_LOG },
            Duration::from_secs(10),
        )
        .await?;
    let db = env.db().await?;
    insert_event(&db, "Order", "Single", "{}").await?;
    insert_rows(&db, "Hundred", 100).await?;
    insert_rows(&db, "TenThousand", 10_000).await?;

    let js = env.jetstream().await?;
    let got = wait_for_messages(&js, 10_101, WAIT, Some(&relay)).await?;
    assert_eq!(got.len(), 10_101, "one copy each");
    let last_commit = assert_once_in_commit_order(&got);
    assert_positions_past(&env, last_commit, &relay).await?;
    let info = js.get_stream(STREAM).await?.info().await?.clone();
    assert_eq!(
        info.config.allow_batch_publish,
        supported,
        "allow_batched on the stream the relay created (nats-server {})",
        env.nats.version()
    );
    let log = relay.log();
    assert!(
        log.matches(FALLBACK_LOG).count() == usize::from(!supported),
        "{log}"
    );
    println!(
        "nats-server {}: {} (10,101 events in order, checkpoint past {last_commit:X})",
        env.nats.version(),
        if supported {
            "fast batches"
        } else {
            "per-message fallback"
        }
    );
    Ok(())
}

/// A kill -9 while a 20,000-row transaction is being published, then a restart: every event
/// once (the re-sent part deduplicated by `Nats-Msg-Id`), the checkpoint not past the
/// transaction at the kill and past it at the end.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_mid_fast_batch_then_restart_loses_nothing_and_stores_nothing_twice() -> Result<()> {
    const ROWS: usize = 20_000;
    let env = Env::start().await?;
    let config = env.config_full(FAST_MODE, "");
    // The slot must exist before the write.
    Relay::start_streaming(&config).await?.kill9();
    let db = env.db().await?;
    insert_rows(&db, "Bulk", ROWS as i64).await?;
    let commit_lsn = env.current_wal().await?;

    let js = env.jetstream().await?;
    let mut relay = Relay::start(&config)?;
    let deadline = Instant::now() + WAIT;
    while stream_count(&js).await? < 2_000 {
        ensure!(
            Instant::now() < deadline,
            "no progress; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.kill9();
    let at_kill = stream_count(&js).await?;
    ensure!(
        at_kill < ROWS,
        "the kill landed after the transaction ({at_kill} stored); log:\n{}",
        relay.log()
    );
    let checkpoint = env.checkpoint().await?.unwrap_or(0);
    ensure!(
        checkpoint < commit_lsn,
        "checkpoint {checkpoint} past an unfinished transaction"
    );

    let relay = Relay::start_streaming(&config).await?;
    let got = wait_for_messages(&js, ROWS, WAIT, Some(&relay)).await?;
    assert_eq!(
        got.len(),
        ROWS,
        "one copy each, {at_kill} stored at the kill"
    );
    let last_commit = assert_once_in_commit_order(&got);
    assert_positions_past(&env, last_commit, &relay).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(stream_count(&js).await?, ROWS, "nothing stored twice later");
    println!(
        "nats-server {}: kill -9 at {at_kill}/{ROWS} stored, after the restart {ROWS} once each",
        env.nats.version()
    );
    Ok(())
}

/// The kill -9 loop of `messages` (M1) with `publish_mode = "fast-batch"`.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_loop_in_fast_batch_mode_delivers_every_committed_event_once() -> Result<()> {
    let env = Env::start().await?;
    let scenario = if fast_batches_supported(&env) {
        "M3 kill -9 loop, fast batches (10 kills)"
    } else {
        "M3 kill -9 loop, fast-batch mode falling back to per-message (10 kills)"
    };
    crate::messages::kill9_loop(&env, FAST_MODE, scenario).await
}

/// nats-server 2.9: the relay creates the stream without `allow_batched`, says once that fast
/// batches need 2.14, and publishes a 100-row transaction per message, once each.
#[tokio::test(flavor = "multi_thread")]
async fn fast_batch_falls_back_to_per_message_on_nats_server_2_9_with_one_warning() -> Result<()> {
    if !std::path::Path::new(OLD_SERVER).exists() {
        println!("{OLD_SERVER} missing: skipped");
        return Ok(());
    }
    let (pg, nats) = tokio::try_join!(
        PostgresServer::start_with(PgOptions::default()),
        NatsServer::start_with(NatsOptions {
            binary: Some(PathBuf::from(OLD_SERVER)),
            ..Default::default()
        })
    )?;
    pg.create_database(DB).await?;
    let client = pg.connect(DB).await?;
    for sql in migrations() {
        client.batch_execute(&sql).await?;
    }
    let env = Env {
        pg,
        nats,
        dir: tempfile::tempdir()?,
    };
    ensure!(!fast_batches_supported(&env), "{OLD_SERVER} is 2.14+");
    let config = env.config_full(FAST_MODE, "");
    let relay = Relay::start_streaming(&config).await?;
    relay
        .wait_log("needs nats-server 2.14.0", Duration::from_secs(10))
        .await?;
    insert_rows(&env.db().await?, "Hundred", 100).await?;
    let js = env.jetstream().await?;
    let got = wait_for_messages(&js, 100, WAIT, Some(&relay)).await?;
    assert_eq!(got.len(), 100);
    let last_commit = assert_once_in_commit_order(&got);
    assert_positions_past(&env, last_commit, &relay).await?;
    let log = relay.log();
    assert_eq!(log.matches(FALLBACK_LOG).count(), 1, "one warning:\n{log}");
    assert!(!log.contains(FAST_LOG), "{log}");
    println!(
        "nats-server {}: fell back with one warning",
        env.nats.version()
    );
    Ok(())
}
