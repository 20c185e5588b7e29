//! A `duplicate` answer is proof only when the stream still holds the copy it names: inside the
//! duplicate window JetStream answers `duplicate` for the id of a message deleted from the
//! stream, and stores nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::support::*;

/// 100 events stored, the relay killed before it stored a checkpoint, the 51st message deleted
/// from the stream, the relay restarted at once: it finds the event missing and publishes it
/// again, JetStream answers `duplicate` (the deleted message's id is still in its window), and
/// the relay reads the named sequence back, finds nothing there, and does not confirm past the
/// event until the stream stores it (after the window); then every event is there once.
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_answer_for_a_deleted_copy_is_not_taken_as_stored() -> Result<()> {
    let env = Env::start().await?;
    deleted_copies_are_published_again(env, "", &[51]).await
}

/// The same in fast-batch mode, whose flow acknowledgements do not say which messages JetStream
/// dropped as duplicates, with two neighbours deleted (so that a restart has more than one event
/// to publish again, which would go out as one fast batch): the events a restart publishes
/// again that the stream should hold but does not go out on their own, so each answer says
/// `duplicate` and is read back.
#[tokio::test(flavor = "multi_thread")]
async fn in_fast_batch_mode_deleted_copies_are_published_again_not_taken_as_stored() -> Result<()> {
    let env = Env::start().await?;
    if !env.nats.version_at_least((2, 14, 0)) {
        eprintln!(
            "nats-server before 2.14 has no fast batches: the first server pair runs the per-message case"
        );
        return Ok(());
    }
    deleted_copies_are_published_again(env, "publish_mode = \"fast-batch\"\n", &[51, 52]).await
}

/// 100 events (one per transaction) stored, the relay killed before it stored a checkpoint, the
/// messages at `deleted` removed from the stream, the relay restarted at once: until the stream
/// holds every one of them again, neither checkpoint nor slot moves past the first one's commit;
/// then every event is there once.
async fn deleted_copies_are_published_again(env: Env, mode: &str, deleted: &[u64]) -> Result<()> {
    let nats = format!("{mode}create_stream = true\nduplicate_window = \"10s\"");
    // No checkpoint while the 100 events go out: the restart reads all of them again.
    let fast = env.config_full(&nats, "");
    let slow = env.dir.path().join("slow.toml");
    std::fs::write(
        &slow,
        std::fs::read_to_string(&fast)?
            .replace(
                "checkpoint_interval = \"100ms\"",
                "checkpoint_interval = \"60s\"",
            )
            .replace(
                "idle_checkpoint_interval = \"1s\"",
                "idle_checkpoint_interval = \"60s\"",
            ),
    )?;
    let mut relay = Relay::start_streaming(&slow).await?;
    let db = env.db().await?;
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.push(insert_event(&db, "Order", "Placed", &format!(r#"{{"n":{i}}}"#)).await?);
    }
    let js = env.jetstream().await?;
    wait_for_messages(&js, 100, Duration::from_secs(30), Some(&relay)).await?;
    relay.kill9();
    let stored = read_stream(&js).await?;
    let mut victims = Vec::new();
    for seq in deleted {
        let victim = stored
            .iter()
            .find(|m| m.seq == *seq)
            .context("deleted sequence")?;
        let commit = parse_lsn(victim.header("Outbox-Commit-Lsn")).context("commit LSN")?;
        victims.push((victim.id().to_owned(), commit));
    }
    let first_commit = victims.iter().map(|(_, c)| *c).min().context("a victim")?;
    // The precondition: the relay must read the events again after the restart.
    let checkpoint = env.checkpoint().await?.unwrap_or(0);
    ensure!(
        checkpoint < first_commit,
        "the checkpoint {checkpoint:X} is already past the events ({first_commit:X}): nothing to re-read"
    );
    let stream = js.get_stream(STREAM).await?;
    for seq in deleted {
        ensure!(stream.delete_message(*seq).await?, "sequence {seq} deleted");
    }

    let relay = Relay::start(&fast)?;
    // While the stream does not hold every one of them, nothing past the first is confirmed.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (checkpoint, slot) = (env.checkpoint().await?, env.slot_confirmed().await?);
        let got = read_stream(&js).await?;
        let missing: Vec<&str> = victims
            .iter()
            .filter(|(id, _)| !got.iter().any(|m| m.id() == id))
            .map(|(id, _)| id.as_str())
            .collect();
        if !missing.is_empty() {
            assert!(
                checkpoint.unwrap_or(0) <= first_commit && slot.unwrap_or(0) <= first_commit,
                "confirmed past events {missing:?} the stream does not hold: checkpoint {checkpoint:X?}, slot {slot:X?}, the first one's commit {first_commit:X}"
            );
        } else if checkpoint.unwrap_or(0) > first_commit {
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for m in &got {
                *counts.entry(m.id()).or_default() += 1;
            }
            for id in &ids {
                assert_eq!(counts.get(id.as_str()), Some(&1), "event {id} once");
            }
            assert_eq!(got.len(), ids.len());
            // How: each went out again, was answered `duplicate`, and read back.
            ensure!(
                relay.log().contains("answered `duplicate`"),
                "no duplicate answer was read back; log:\n{}",
                relay.log()
            );
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "events {missing:?} never stored again; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
