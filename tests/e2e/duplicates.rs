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
    let nats = "create_stream = true\nduplicate_window = \"10s\"";
    // No checkpoint while the 100 events go out: the restart reads all of them again.
    let fast = env.config_full(nats, "");
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
    let victim = stored.iter().find(|m| m.seq == 51).context("sequence 51")?;
    let victim_id = victim.id().to_owned();
    let victim_commit = parse_lsn(victim.header("Outbox-Commit-Lsn")).context("commit LSN")?;
    // The precondition: the relay must read the event again after the restart.
    let checkpoint = env.checkpoint().await?.unwrap_or(0);
    ensure!(
        checkpoint < victim_commit,
        "the checkpoint {checkpoint:X} is already past the event ({victim_commit:X}): nothing to re-read"
    );
    let stream = js.get_stream(STREAM).await?;
    ensure!(stream.delete_message(51).await?, "sequence 51 deleted");

    let relay = Relay::start(&fast)?;
    relay
        .wait_log("answered `duplicate`", Duration::from_secs(20))
        .await?;
    // While the stream does not hold the event, nothing past it is confirmed.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (checkpoint, slot) = (env.checkpoint().await?, env.slot_confirmed().await?);
        let got = read_stream(&js).await?;
        let present = got.iter().any(|m| m.id() == victim_id);
        if !present {
            assert!(
                checkpoint.unwrap_or(0) <= victim_commit && slot.unwrap_or(0) <= victim_commit,
                "confirmed past event {victim_id} the stream does not hold: checkpoint {checkpoint:X?}, slot {slot:X?}, its commit {victim_commit:X}"
            );
        } else if checkpoint.unwrap_or(0) > victim_commit {
            let mut counts: HashMap<&str, usize> = HashMap::new();
            for m in &got {
                *counts.entry(m.id()).or_default() += 1;
            }
            for id in &ids {
                assert_eq!(counts.get(id.as_str()), Some(&1), "event {id} once");
            }
            assert_eq!(got.len(), ids.len());
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "event {victim_id} never stored again (present: {present}); log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
