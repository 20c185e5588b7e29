//! A relay killed in the middle of an atomic batch (part of the batch on the wire, no commit)
//! and restarted within nats-server's batch timeout (10 s, while the server still holds the
//! dead relay's batch open): the transaction is stored once, as one batch under a new id, and
//! never in part.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::StreamExt as _;

use crate::batches::batches_supported;
use crate::support::*;

const ROWS: usize = 300;

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_batch_commits_the_transaction_once_as_one_new_batch() -> Result<()> {
    let env = Env::start().await?;
    kill_mid_batch_then_restart(&env, false).await
}

/// The same with a server that holds one open batch per stream: while the dead relay's batch is
/// open the restarted relay's is refused (its first message as one too many, 10210; its commit
/// as incomplete, 10176), and it is published again whole, under new ids, until the server
/// abandons the dead one (10 s).
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_refused_as_one_too_many_is_published_again_whole() -> Result<()> {
    // A server before 2.12 takes neither atomic batches nor this configuration block.
    let probe = relay_testkit::NatsServer::start().await?;
    if !probe.version_at_least((2, 12, 1)) {
        println!(
            "nats-server {}: no atomic batches; nothing to test",
            probe.version()
        );
        return Ok(());
    }
    drop(probe);
    let nats = relay_testkit::NatsOptions {
        config: Some("jetstream { limits { batch { max_inflight_per_stream: 1 } } }".into()),
        ..Default::default()
    };
    let env = Env::start_with(relay_testkit::PgOptions::default(), nats).await?;
    kill_mid_batch_then_restart(&env, true).await
}

/// Kills the relay between a 300-row batch's messages and its commit, restarts it at once and
/// checks that the transaction is stored once, as one batch under a new id, never in part.
/// `one_open_batch`: the server takes one open batch per stream, so the restart meets 10210.
async fn kill_mid_batch_then_restart(env: &Env, one_open_batch: bool) -> Result<()> {
    if !batches_supported(env) {
        println!(
            "nats-server {}: no atomic batches; nothing to test",
            env.nats.version()
        );
        return Ok(());
    }
    let config = env.config_full("publish_mode = \"atomic-batch\"\ncreate_stream = true", "");
    let js = env.jetstream().await?;
    // What reaches the server, read beside the stream: a core subscriber gets every message
    // published to the subjects, committed or not.
    let watcher = async_nats::connect(env.nats.url()).await?;
    let mut wire = watcher.subscribe("outbox.>").await?;
    watcher.flush().await?;

    let mut relay = Relay::start_with_env(
        &config,
        &["run"],
        &[("RELAY_FAILPOINT", "atomic_batch_before_commit")],
    )?;
    relay
        .wait_log("publishing each transaction as one atomic batch", WAIT)
        .await?;
    relay.wait_log("replication started", WAIT).await?;
    let db = env.db().await?;
    db.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
         SELECT gen_random_uuid(), 'Order', g::text, 'Placed', jsonb_build_object('g', g) \
         FROM generate_series(1, $1::int) g",
        &[&(ROWS as i32)],
    )
    .await?;
    relay.wait_exit(WAIT).await?;
    let killed = Instant::now();
    ensure!(
        relay
            .log()
            .contains("failpoint atomic_batch_before_commit reached"),
        "the relay did not stop at the failpoint:\n{}",
        relay.log()
    );

    // The precondition: the batch's other messages reached the server, its commit did not,
    // and the stream holds nothing of the transaction.
    let mut on_wire = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), wire.next()).await {
        on_wire.push(m);
    }
    let header = |m: &async_nats::Message, name: &str| {
        m.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(on_wire.len(), ROWS - 1, "all but the commit on the wire");
    let dead_id = header(&on_wire[0], "Nats-Batch-Id");
    assert!(
        !dead_id.is_empty(),
        "the dead relay's messages were a batch"
    );
    assert!(
        on_wire
            .iter()
            .all(|m| header(m, "Nats-Batch-Id") == dead_id
                && header(m, "Nats-Batch-Commit").is_empty()),
        "one batch, no commit"
    );
    assert_eq!(
        stream_count(&js).await?,
        0,
        "nothing stored before the commit"
    );
    let commit_lsn = parse_lsn(&header(&on_wire[0], "Outbox-Commit-Lsn")).expect("commit lsn");
    let checkpoint_at_kill = env.checkpoint().await?.unwrap_or(0);
    assert!(
        checkpoint_at_kill <= commit_lsn,
        "checkpoint {checkpoint_at_kill:X} past the unacknowledged transaction at {commit_lsn:X}"
    );

    // Restart at once: well within the server's 10 s batch timeout.
    let relay = Relay::start(&config)?;
    let restarted_after = killed.elapsed();
    assert!(
        restarted_after < Duration::from_secs(5),
        "restarted {restarted_after:?} after the kill: the server's batch timeout is 10 s"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let stream = js.get_stream(STREAM).await?;
    loop {
        // Read with a message get, which the server isolates from a batch being applied; the
        // stream's info is not isolated and can count a batch half applied. The newest message
        // is none of the transaction's, or its commit: anything else is part of it stored.
        if let Ok(last) = stream.get_last_raw_message_by_subject("outbox.>").await {
            let commit = last
                .headers
                .get("Nats-Batch-Commit")
                .map(|v| v.as_str().to_owned());
            assert!(
                commit.as_deref() == Some("1") && last.sequence == ROWS as u64,
                "the stream's newest message is not the transaction's commit (sequence {}, Nats-Batch-Commit {commit:?}): part of it is stored; log:\n{}",
                last.sequence,
                relay.log()
            );
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the transaction never arrived; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_stored_after = killed.elapsed();
    let got = read_stream(&js).await?;
    assert_eq!(got.len(), ROWS, "each message once");
    let mut ids: Vec<&str> = got.iter().map(Received::id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ROWS, "no duplicate event id");
    let new_id = got[0].header("Nats-Batch-Id");
    assert!(!new_id.is_empty(), "stored as a batch: {:?}", got[0]);
    assert_ne!(
        new_id, dead_id,
        "the restarted relay reused the dead relay's batch id"
    );
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.header("Nats-Batch-Id"), new_id, "message {i}: one batch");
        assert_eq!(m.header("Nats-Batch-Sequence"), (i + 1).to_string());
        assert_eq!(m.header("Nats-Batch-Commit") == "1", i == ROWS - 1);
    }
    // Positions: the checkpoint and the slot move past the transaction's commit.
    let checkpoint = env.wait_checkpoint(commit_lsn + 1, WAIT).await?;
    let deadline = Instant::now() + WAIT;
    while env.slot_confirmed().await?.unwrap_or(0) <= commit_lsn {
        ensure!(
            Instant::now() < deadline,
            "the slot stayed before {commit_lsn:X}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // With one open batch per stream, the batch's first message is refused as one too many
    // (10210, unanswered: only a commit is) while the dead relay's is open, and its commit is
    // answered "incomplete" (10176); otherwise a new id is taken at once.
    let republished = relay
        .log()
        .contains("publishing the whole transaction again as a new batch");
    assert_eq!(
        republished,
        one_open_batch,
        "published again: {republished}; log:\n{}",
        relay.log()
    );
    println!(
        "one open batch per stream: {one_open_batch}; killed mid-batch with {} of {ROWS} messages on the wire; restarted at once; stored as one batch {new_id} (dead relay's {dead_id}) {first_stored_after:?} after the kill; checkpoint {checkpoint:X} past commit {commit_lsn:X}",
        on_wire.len()
    );
    Ok(())
}

const WAIT: Duration = Duration::from_secs(30);
