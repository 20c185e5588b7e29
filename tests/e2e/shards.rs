//! `[postgres] shard` (docs/scaling.md, scaling past one slot): two relays over one outbox, each with its
//! own slot and a publication whose row filter keeps its shard's rows. Every event arrives once,
//! each aggregate's events in commit order, both slots and both checkpoints move past the last
//! commit; a publication whose filter is not the configured shard's is refused.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::support::*;

const EX_CONFIG: i32 = 78;
const WAIT: Duration = Duration::from_secs(60);

/// The relay config of shard `index` of 2 (slot and publication of its own).
fn shard_config(
    env: &Env,
    index: u32,
    publication_of: u32,
    extra: &str,
) -> Result<std::path::PathBuf> {
    let path = env.config(extra);
    let text = std::fs::read_to_string(&path)?
        .replace(
            "slot = \"relay_slot\"",
            &format!("slot = \"relay_slot_{index}\""),
        )
        .replace(
            "publication = \"relay_pub\"",
            &format!(
                "publication = \"relay_pub_{publication_of}\"\n\
                 shard = {{ key = \"aggregateid\", count = 2, index = {index} }}"
            ),
        );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Inserts `per_tx` events per transaction over `aggregates` aggregates, each numbered in its
/// aggregate's order; returns `(id, aggregate, n)` in commit order.
async fn write(
    db: &mut tokio_postgres::Client,
    txs: usize,
    per_tx: usize,
    next: &mut HashMap<String, u32>,
) -> Result<Vec<(String, String, u32)>> {
    let mut out = Vec::new();
    for t in 0..txs {
        let tx = db.transaction().await?;
        for r in 0..per_tx {
            let aggregate = format!("order-{}", (t * per_tx + r) % 23);
            let n = next.entry(aggregate.clone()).or_default();
            *n += 1;
            let id = uuid::Uuid::new_v4().to_string();
            tx.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1::text::uuid, 'Order', $2, 'Numbered', jsonb_build_object('n', $3::int))",
                &[&id, &aggregate, &(*n as i32)],
            )
            .await?;
            out.push((id, aggregate, *n));
        }
        tx.commit().await?;
    }
    Ok(out)
}

async fn lsn_of(db: &tokio_postgres::Client, sql: &str, slot: &str) -> Result<Option<u64>> {
    Ok(db
        .query_opt(sql, &[&slot])
        .await?
        .map(|r| r.get::<_, i64>(0) as u64))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_shards_deliver_every_event_once_in_aggregate_order() -> Result<()> {
    let env = Env::start().await?;
    let mut db = env.db().await?;
    let js = env.jetstream().await?;
    let mut next = HashMap::new();

    // The relays create their slots and row-filtered publications; rows written before the
    // slots exist are not theirs to send.
    let (http0, addr0) = http_listen();
    let mut shard0 = Relay::start_streaming(&shard_config(&env, 0, 0, &http0)?).await?;
    let mut shard1 = Relay::start_streaming(&shard_config(&env, 1, 1, "")?).await?;
    let mut written = write(&mut db, 20, 10, &mut next).await?;
    // One shard killed and restarted while the other goes on.
    shard1.kill9();
    written.extend(write(&mut db, 20, 10, &mut next).await?);
    let shard1_config = shard_config(&env, 1, 1, "")?;
    shard1 = Relay::start_streaming(&shard1_config).await?;
    written.extend(write(&mut db, 10, 1, &mut next).await?);
    let last_commit: i64 = db
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await?
        .get(0);

    // Precondition: both shards have aggregates (23 keys over two shards).
    let shard_of: HashMap<String, i32> = db
        .query(
            "SELECT k, ((hashtext(k) % 2) + 2) % 2 FROM unnest($1::text[]) k",
            &[&next.keys().cloned().collect::<Vec<_>>()],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for s in [0, 1] {
        assert!(
            shard_of.values().any(|&v| v == s),
            "no aggregate in shard {s}"
        );
    }

    let messages = wait_for_messages(&js, written.len(), WAIT, Some(&shard0)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let messages = if read_stream(&js).await?.len() == messages.len() {
        messages
    } else {
        read_stream(&js).await?
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for m in &messages {
        *seen.entry(m.id()).or_default() += 1;
    }
    for (id, aggregate, _) in &written {
        assert_eq!(
            seen.get(id.as_str()),
            Some(&1),
            "event {id} of {aggregate} (shard {}) not exactly once",
            shard_of[aggregate]
        );
    }
    assert_eq!(messages.len(), written.len(), "only the written events");
    // Each aggregate's events in its order.
    let by_id: HashMap<&str, (&str, u32)> = written
        .iter()
        .map(|(id, a, n)| (id.as_str(), (a.as_str(), *n)))
        .collect();
    let mut last: HashMap<&str, u32> = HashMap::new();
    for m in &messages {
        let (aggregate, n) = by_id[m.id()];
        let prev = last.insert(aggregate, n).unwrap_or(0);
        assert_eq!(n, prev + 1, "{aggregate}: event {n} after {prev}");
    }

    // Both slots and both stored checkpoints move past the last commit.
    let deadline = std::time::Instant::now() + WAIT;
    for slot in ["relay_slot_0", "relay_slot_1"] {
        loop {
            let confirmed = lsn_of(
                &db,
                "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1",
                slot,
            )
            .await?;
            let checkpoint = lsn_of(
                &db,
                "SELECT (confirmed_lsn - '0/0')::bigint FROM outbox_relay.checkpoint WHERE slot_name = $1",
                slot,
            )
            .await?;
            if confirmed.is_some_and(|c| c >= last_commit as u64)
                && checkpoint.is_some_and(|c| c >= last_commit as u64)
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{slot}: confirmed {confirmed:?}, checkpoint {checkpoint:?}, last commit {last_commit}; logs:\n{}\n{}",
                shard0.log(),
                shard1.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Shard 0 ran throughout (nothing re-sent): it published exactly its shard's events. A
    // filter that kept more would show here, not in the stream (the duplicates are dropped).
    let in_shard0 = written
        .iter()
        .filter(|(_, aggregate, _)| shard_of[aggregate] == 0)
        .count();
    assert_eq!(
        metric(&addr0, "outbox_relay_events_published_total").await?,
        in_shard0 as f64,
        "shard 0 published other shards' events; log:\n{}",
        shard0.log()
    );
    let filter: String = db
        .query_one(
            "SELECT rowfilter FROM pg_publication_tables WHERE pubname = 'relay_pub_1'",
            &[],
        )
        .await?
        .get(0);
    assert!(filter.contains("hashtext"), "{filter}");
    shard0.signal(nix::sys::signal::Signal::SIGTERM);
    shard1.signal(nix::sys::signal::Signal::SIGTERM);
    shard0.wait_exit(WAIT).await?;
    shard1.wait_exit(WAIT).await?;

    // Shard 1 pointed at shard 0's publication: refused, with the filter that would fix it.
    let mut wrong = Relay::start(&shard_config(&env, 1, 0, "")?)?;
    expect_exit(
        &mut wrong,
        EX_CONFIG,
        WAIT,
        &[
            "not that shard's",
            "ALTER PUBLICATION relay_pub_0 SET TABLE",
        ],
    )
    .await?;
    // And a publication filtered by hand, without postgres.shard: the relay runs and says so.
    db.batch_execute(
        "CREATE PUBLICATION relay_pub_hand FOR TABLE outbox WHERE (aggregateid <> 'skip') \
         WITH (publish = 'insert')",
    )
    .await?;
    let path = env.config("");
    let text = std::fs::read_to_string(&path)?.replace("relay_pub", "relay_pub_hand");
    std::fs::write(&path, text)?;
    let hand = Relay::start_streaming(&path).await?;
    hand.wait_log("rows it does not keep are never relayed", WAIT)
        .await?;
    Ok(())
}

/// Waits until `slot`'s stored checkpoint is at or past `lsn`.
async fn wait_checkpoint(db: &tokio_postgres::Client, slot: &str, lsn: u64) -> Result<()> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let stored = lsn_of(
            db,
            "SELECT (confirmed_lsn - '0/0')::bigint FROM outbox_relay.checkpoint WHERE slot_name = $1",
            slot,
        )
        .await?;
        if stored.is_some_and(|c| c >= lsn) {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{slot}: checkpoint {stored:?} never reached {lsn}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `position` with shards reads every shard's position map: a shard that was down publishes
/// its part of a window after the other shard did, so one shard's map alone starts the replay
/// after events the other shard stored earlier (events replay would skip).
#[tokio::test(flavor = "multi_thread")]
async fn position_with_shards_starts_at_the_earliest_shards_event() -> Result<()> {
    let env = Env::start().await?;
    let mut db = env.db().await?;
    let js = env.jetstream().await?;
    let mut next = HashMap::new();
    let config0 = shard_config(&env, 0, 0, "")?;
    let config1 = shard_config(&env, 1, 1, "")?;
    let mut shard0 = Relay::start_streaming(&config0).await?;
    let shard1 = Relay::start_streaming(&config1).await?;
    // Anchors of both shards before the target.
    write(&mut db, 10, 10, &mut next).await?;
    let before = env.current_wal().await?;
    wait_checkpoint(&db, "relay_slot_0", before).await?;
    wait_checkpoint(&db, "relay_slot_1", before).await?;

    // Shard 0 down over two batches, one committed before the target and one after: shard 1
    // stores its parts of both first; shard 0, restarted, stores its part of the first batch
    // (its last anchor before the target) after every event shard 1 stored.
    shard0.kill9();
    write(&mut db, 10, 10, &mut next).await?;
    let target = env.current_wal().await?;
    write(&mut db, 10, 10, &mut next).await?;
    let after = env.current_wal().await?;
    wait_checkpoint(&db, "relay_slot_1", after).await?;
    let _shard0 = Relay::start_streaming(&config0).await?;
    wait_checkpoint(&db, "relay_slot_0", after).await?;

    let messages = read_stream(&js).await?;
    let first = messages
        .iter()
        .find(|m| parse_lsn(m.header("Outbox-Commit-Lsn")).is_some_and(|l| l >= target))
        .context("no event after the target")?;
    // Precondition: shard 0's map alone starts after that event.
    let shard0_only = relay_postgres::checkpoint::map_start(
        &db,
        "relay_slot_0",
        STREAM,
        relay_postgres::checkpoint::MapTarget::Lsn(relay_core::Lsn(target)),
    )
    .await?
    .context("shard 0's map has an anchor before the target")?;
    anyhow::ensure!(
        shard0_only.start_seq > first.seq,
        "precondition: shard 0's map starts at {} , after the first event at or after the target ({})",
        shard0_only.start_seq,
        first.seq
    );
    let target_text = format!("{:X}/{:X}", target >> 32, target & 0xFFFF_FFFF);
    for config in [&config0, &config1] {
        let out = relay_cmd(config, &["position", "--lsn", &target_text, "--json"]).await?;
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("position: {}", String::from_utf8_lossy(&out.stderr)))?;
        anyhow::ensure!(
            doc["sequence"].as_u64() == Some(first.seq)
                && doc["method"] == "position_map"
                && doc["position_map_slots"].as_array().map(Vec::len) == Some(2),
            "position --lsn {target_text} with {}: expected sequence {} (the first event at or after it, shard 1's); got {doc}",
            config.display(),
            first.seq
        );
    }
    drop(shard1);
    Ok(())
}
