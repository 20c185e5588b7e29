//! Restore from WAL: with `[relay] replay_retention` the slot's confirmed
//! position trails the stored checkpoint, restarts still resume at the checkpoint (nothing of the
//! window is sent again), and `outbox-relay restore --from-lsn X` publishes the window's events
//! the stream lost (purged; deleted and re-created) once each, from a copy of the slot, never
//! moving the main slot or the checkpoint, also after a kill -9 of a restore.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};

use crate::support::*;

pub(crate) fn relay_cmd(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .expect("run outbox-relay")
}

pub(crate) fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One event as stored: commit LSN and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ev {
    pub(crate) lsn: u64,
    pub(crate) lsn_text: String,
    pub(crate) id: String,
}

pub(crate) fn events(stored: &[Received]) -> Vec<Ev> {
    stored
        .iter()
        .map(|m| Ev {
            lsn: parse_lsn(m.header("Outbox-Commit-Lsn")).unwrap_or_default(),
            lsn_text: m.header("Outbox-Commit-Lsn").to_owned(),
            id: m.id().to_owned(),
        })
        .collect()
}

/// Inserts `n` events in transactions of `per_tx`; returns their ids in commit order.
pub(crate) async fn insert(
    db: &mut tokio_postgres::Client,
    n: usize,
    per_tx: usize,
    tag: &str,
) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    while ids.len() < n {
        let tx = db.transaction().await?;
        for _ in 0..per_tx.min(n - ids.len()) {
            let i = ids.len();
            ids.push(insert_event(&tx, "Order", "Created", &format!(r#"{{"{tag}": {i}}}"#)).await?);
        }
        tx.commit().await?;
    }
    Ok(ids)
}

/// A relay config that keeps 1 GB of WAL behind the checkpoint for restores, with a 1 s duplicate
/// window (after a purge, a restored id is not refused as a duplicate for long).
pub(crate) fn retention_config(env: &Env) -> std::path::PathBuf {
    env.config_full(
        "create_stream = true\nduplicate_window = \"1s\"",
        "replay_retention = \"1GB\"",
    )
}

/// Waits until the stored checkpoint is past `lsn`.
pub(crate) async fn checkpoint_past(env: &Env, lsn: u64) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = env.checkpoint().await?.unwrap_or_default();
        if c > lsn {
            return Ok(c);
        }
        ensure!(Instant::now() < deadline, "checkpoint never passed {lsn}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `(confirmed_flush_lsn, restart_lsn)` of `slot`, `None` when it does not exist.
async fn slot_positions(env: &Env, slot: &str) -> Result<Option<(u64, u64)>> {
    let row = env
        .db()
        .await?
        .query_opt(
            "SELECT (confirmed_flush_lsn - '0/0')::bigint, (restart_lsn - '0/0')::bigint \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64)))
}

/// How many copies of each id the stream holds.
fn copies(stored: &[Received]) -> HashMap<String, usize> {
    let mut n = HashMap::new();
    for m in stored {
        *n.entry(m.id().to_owned()).or_default() += 1;
    }
    n
}

/// Asserts that `ids` are in the stream exactly once each, in this order relative to each other.
pub(crate) fn exactly_once_in_order(stored: &[Received], ids: &[String]) {
    let count = copies(stored);
    for id in ids {
        assert_eq!(
            count.get(id),
            Some(&1),
            "event {id} should be in the stream once"
        );
    }
    let order: Vec<&str> = stored
        .iter()
        .map(Received::id)
        .filter(|id| ids.iter().any(|w| w == id))
        .collect();
    let want: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(order, want, "the window's events in commit order");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_slot_trails_the_checkpoint_and_a_restart_sends_nothing_of_the_window() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let mut db = env.db().await?;
    // A 1 s duplicate window: a re-sent event would be stored a second time.
    let (listen, addr) = http_listen();
    let config = env.config_full(
        "create_stream = true\nduplicate_window = \"1s\"",
        &format!("replay_retention = \"5s\"\n{listen}"),
    );
    let mut relay = Relay::start_streaming(&config).await?;
    let (created, _) = slot_positions(&env, "relay_slot").await?.expect("slot");
    let ids = insert(&mut db, 20, 4, "w").await?;
    let stored = wait_for_messages(&js, 20, Duration::from_secs(30), Some(&relay)).await?;
    let last = events(&stored)
        .iter()
        .map(|e| e.lsn)
        .max()
        .unwrap_or_default();
    let checkpoint = checkpoint_past(&env, last).await?;
    // Within the window: the slot stays behind every event of it.
    let (confirmed, restart) = slot_positions(&env, "relay_slot").await?.expect("slot");
    let first = events(&stored)
        .iter()
        .map(|e| e.lsn)
        .min()
        .unwrap_or_default();
    assert!(
        confirmed <= first,
        "slot confirmed {confirmed:X} should trail the first event {first:X} (checkpoint {checkpoint:X})"
    );
    assert!(restart <= confirmed);
    assert!(confirmed >= created);
    // /metrics: the window is the checkpoint minus what was confirmed to the slot.
    let window = metric(&addr, "outbox_relay_replay_window_bytes").await?;
    assert!(
        window >= (checkpoint - first) as f64,
        "replay window gauge {window}"
    );

    // A restart inside the window: resumes at the checkpoint, sends nothing again.
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(20)).await?;
    let (confirmed_stopped, _) = slot_positions(&env, "relay_slot").await?.expect("slot");
    let stored_checkpoint = env.checkpoint().await?.unwrap_or_default();
    assert!(
        confirmed_stopped < stored_checkpoint && confirmed_stopped <= first,
        "after the stop the slot ({confirmed_stopped:X}) still trails the checkpoint ({stored_checkpoint:X})"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await; // past the duplicate window
    let relay = Relay::start_streaming(&config).await?;
    let more = insert(&mut db, 1, 1, "after").await?;
    let stored = wait_for_id(&js, &more[0], &relay).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stored = if stored.len() > 21 {
        stored
    } else {
        read_stream(&js).await?
    };
    assert_eq!(
        stored.len(),
        21,
        "nothing of the window re-sent; log:\n{}",
        relay.log()
    );
    exactly_once_in_order(&stored, &ids);

    // Idle: the trail catches up with what was stored a window ago, never past the checkpoint.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (c, _) = slot_positions(&env, "relay_slot").await?.expect("slot");
        let checkpoint = env.checkpoint().await?.unwrap_or_default();
        assert!(
            c <= checkpoint,
            "slot {c:X} past the checkpoint {checkpoint:X}"
        );
        if c > last {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the slot never advanced past {last:X} (at {c:X}); log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_brings_back_a_purged_and_a_recreated_stream_while_the_relay_runs() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let mut db = env.db().await?;
    let config = retention_config(&env);
    let relay = Relay::start_streaming(&config).await?;
    let window = insert(&mut db, 30, 3, "w").await?;
    let stored = wait_for_messages(&js, 30, Duration::from_secs(30), Some(&relay)).await?;
    let evs = events(&stored);
    checkpoint_past(&env, evs.iter().map(|e| e.lsn).max().unwrap_or_default()).await?;
    let ordered: Vec<String> = evs.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ordered, window);

    // Live inserts all along.
    let live_db = env.db().await?;
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let live = tokio::spawn(async move {
        let mut ids = Vec::new();
        loop {
            if stop_rx.try_recv().is_ok() {
                return ids;
            }
            if let Ok(id) = insert_event(&live_db, "Order", "Live", "{}").await {
                ids.push(id);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    // Purge, past the duplicate window, then restore from the middle: the server starts the
    // copy at X and skips every commit before it.
    js.get_stream(STREAM).await?.purge().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let middle = &evs[15];
    let out = relay_cmd(&config, &["restore", "--from-lsn", &middle.lsn_text]);
    assert!(out.status.success(), "{}", describe(&out));
    let stored = read_stream(&js).await?;
    let restored: Vec<String> = evs
        .iter()
        .filter(|e| e.lsn >= middle.lsn)
        .map(|e| e.id.clone())
        .collect();
    exactly_once_in_order(&stored, &restored);
    for e in evs.iter().filter(|e| e.lsn < middle.lsn) {
        assert!(
            !copies(&stored).contains_key(&e.id),
            "event {} committed before --from-lsn came back",
            e.id
        );
    }
    // The whole window: the second half is in the stream and left alone.
    let out = relay_cmd(&config, &["restore", "--from-lsn", &evs[0].lsn_text]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains(&format!("published {} (", evs.len() - restored.len())),
        "{text}"
    );
    // The first half came back after the second: once each, each half in commit order.
    let stored = read_stream(&js).await?;
    exactly_once_in_order(&stored, &window[..15]);
    exactly_once_in_order(&stored, &window[15..]);

    // Deleted and re-created (same configuration) while the relay runs.
    let stream_config = js.get_stream(STREAM).await?.info().await?.config.clone();
    js.delete_stream(STREAM).await?;
    js.create_stream(stream_config).await?;
    let out = relay_cmd(&config, &["restore", "--from-lsn", &evs[0].lsn_text]);
    assert!(out.status.success(), "{}", describe(&out));
    exactly_once_in_order(&read_stream(&js).await?, &window);

    // The live events went on: each in the stream once (those stored before the delete are gone).
    stop_tx.send(()).ok();
    let live_ids = live.await?;
    ensure!(live_ids.len() > 5, "live inserts ran");
    let last_live = live_ids.last().expect("live").clone();
    let stored = wait_for_id(&js, &last_live, &relay).await?;
    for (id, n) in copies(&stored) {
        assert_eq!(n, 1, "event {id} twice");
    }
    assert!(!relay.log().contains("panicked"));
    // No restore copy left behind.
    assert_eq!(slot_positions(&env, "relay_slot_restore").await?, None);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_restore_completes_when_run_again_and_never_moves_the_slot() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let mut db = env.db().await?;
    let config = retention_config(&env);
    let mut relay = Relay::start_streaming(&config).await?;
    let window = insert(&mut db, 2000, 50, "w").await?;
    let stored = wait_for_messages(&js, 2000, Duration::from_secs(60), Some(&relay)).await?;
    let evs = events(&stored);
    checkpoint_past(&env, evs.iter().map(|e| e.lsn).max().unwrap_or_default()).await?;
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(20)).await?;
    let slot_before = slot_positions(&env, "relay_slot").await?.expect("slot");
    let checkpoint_before = env.checkpoint().await?.expect("checkpoint");
    assert!(
        slot_before.0 < checkpoint_before,
        "the slot trails the checkpoint"
    );

    // Older than the slot keeps: refused, saying how far back restore can go.
    let out = relay_cmd(&config, &["restore", "--from-lsn", "0/10"]);
    assert_eq!(out.status.code(), Some(65), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("Restore can go back to --from-lsn") && text.contains("replay_retention"),
        "{text}"
    );

    // status and validate --connect show how far back restore can go, and warn when the
    // window is over max_slot_wal_keep_size.
    let out = relay_cmd(&config, &["status", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let w = &doc["replay_window"];
    assert_eq!(
        w["restore_from_lsn"].as_str().and_then(parse_lsn),
        Some(slot_before.0),
        "{w}"
    );
    assert_eq!(
        w["window_bytes"].as_u64(),
        Some(checkpoint_before - slot_before.0),
        "{w}"
    );
    assert!(w["warning"].is_null(), "{w}");
    let admin = env.db().await?;
    admin
        .batch_execute("ALTER SYSTEM SET max_slot_wal_keep_size = '64MB'")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = relay_cmd(&config, &["validate", "--connect"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains("replay window")
            && l.contains("WARN")
            && l.contains("over max_slot_wal_keep_size")),
        "{}",
        describe(&out)
    );
    admin
        .batch_execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;

    js.get_stream(STREAM).await?.purge().await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A dry run decodes and routes the window, publishes nothing.
    let out = relay_cmd(
        &config,
        &["restore", "--from-lsn", &evs[0].lsn_text, "--dry-run"],
    );
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("would publish 2000 "),
        "{}",
        describe(&out)
    );
    assert_eq!(stream_count(&js).await?, 0, "a dry run publishes nothing");
    assert_eq!(slot_positions(&env, "relay_slot_restore").await?, None);
    // One message in flight at a time: slow enough to be killed in the middle.
    let log = env.dir.path().join("restore-killed.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&config)
        .args([
            "restore",
            "--from-lsn",
            &evs[0].lsn_text,
            "--max-in-flight",
            "1",
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while stream_count(&js).await? < 100 {
        ensure!(
            Instant::now() < deadline,
            "restore never published; log:\n{}",
            std::fs::read_to_string(&log)?
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill()?;
    child.wait()?;
    let partial = stream_count(&js).await?;
    assert!(
        partial < 2000,
        "the kill landed in the middle ({partial} of 2000 restored)"
    );
    assert!(
        slot_positions(&env, "relay_slot_restore").await?.is_some(),
        "the killed restore left its copy"
    );

    let out = relay_cmd(&config, &["restore", "--from-lsn", &evs[0].lsn_text]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("left its copy"),
        "{}",
        describe(&out)
    );
    let stored = read_stream(&js).await?;
    assert_eq!(stored.len(), 2000, "nothing doubled");
    exactly_once_in_order(&stored, &window);

    assert_eq!(
        slot_positions(&env, "relay_slot").await?,
        Some(slot_before),
        "main slot moved"
    );
    assert_eq!(
        env.checkpoint().await?,
        Some(checkpoint_before),
        "checkpoint moved"
    );
    assert_eq!(
        slot_positions(&env, "relay_slot_restore").await?,
        None,
        "copy dropped"
    );
    Ok(())
}

/// A purge inside the duplicate window: JetStream (2.9 and 2.15 alike) still remembers the
/// purged ids and answers a republish with "duplicate" without storing it. Restore must not
/// count those as restored: it exits 65 saying so, and run again after the window it restores
/// them.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_right_after_a_purge_never_counts_a_dropped_duplicate_as_restored() -> Result<()>
{
    purge_then_restore("").await.map(drop)
}

/// The same with `publish_mode = "atomic-batch"` and `"fast-batch"`: a batch holding a
/// remembered id is refused whole and re-sent message by message, and fast batches (whose acks
/// do not tell duplicates) are not used by restore, so no mode counts a dropped duplicate as
/// restored.
#[tokio::test(flavor = "multi_thread")]
async fn no_publish_mode_counts_a_dropped_duplicate_as_restored() -> Result<()> {
    for mode in ["atomic-batch", "fast-batch"] {
        let log = purge_then_restore(&format!("publish_mode = \"{mode}\"\n"))
            .await
            .with_context(|| format!("publish_mode = {mode}"))?;
        if mode == "fast-batch" {
            assert!(log.contains("not in fast batches"), "{log}");
        }
    }
    Ok(())
}

/// Returns the first restore's output.
async fn purge_then_restore(nats_extra: &str) -> Result<String> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let mut db = env.db().await?;
    let config = env.config_full(
        &format!("{nats_extra}create_stream = true\nduplicate_window = \"3s\""),
        "replay_retention = \"1GB\"",
    );
    let mut relay = Relay::start_streaming(&config).await?;
    let window = insert(&mut db, 10, 2, "w").await?;
    let stored = wait_for_messages(&js, 10, Duration::from_secs(30), Some(&relay)).await?;
    let evs = events(&stored);
    checkpoint_past(&env, evs.iter().map(|e| e.lsn).max().unwrap_or_default()).await?;
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(20)).await?;
    js.get_stream(STREAM).await?.purge().await?;
    let out = relay_cmd(&config, &["restore", "--from-lsn", &evs[0].lsn_text]);
    assert_eq!(out.status.code(), Some(65), "{}", describe(&out));
    let first = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no longer holds"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        stream_count(&js).await?,
        0,
        "JetStream stored nothing: the ids were remembered"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    // --to-lsn: only the events committed before it.
    let out = relay_cmd(
        &config,
        &[
            "restore",
            "--from-lsn",
            &evs[0].lsn_text,
            "--to-lsn",
            &evs[4].lsn_text,
        ],
    );
    assert!(out.status.success(), "{}", describe(&out));
    let stored = read_stream(&js).await?;
    let before: Vec<String> = evs
        .iter()
        .filter(|e| e.lsn < evs[4].lsn)
        .map(|e| e.id.clone())
        .collect();
    assert_eq!(stored.len(), before.len(), "{}", describe(&out));
    exactly_once_in_order(&stored, &before);
    let out = relay_cmd(&config, &["restore", "--from-lsn", &evs[0].lsn_text]);
    assert!(out.status.success(), "{}", describe(&out));
    let stored = read_stream(&js).await?;
    assert_eq!(stored.len(), window.len());
    exactly_once_in_order(&stored, &window);
    Ok(first)
}
