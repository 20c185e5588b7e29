//! Fault scenarios 17-19: the primary killed and a standby promoted. The relay runs
//! on a multi-host `postgres.url` (`target_session_attrs=read-write`) and finds the new primary
//! by itself. The oracle reads the outbox table of the promoted standby: a row the old primary
//! committed but never sent to the standby is gone with it, and its event, if published, is a
//! phantom.
//!
//! 17 and 18 need failover slots (PostgreSQL 17+) and pass with a note on older servers; 19 runs
//! on every version (below 17 without failover slots, on 17+ with `postgres.failover = false`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use relay_testkit::{PgOptions, StandbyOptions};

use super::{in_mode, settle};
use crate::failover::*;
use crate::faults::oracle::*;
use crate::support::*;

/// Waits until every event committed on the new primary is in the stream (or `timeout`), then
/// classifies the stream against that server's outbox table, and its order unless `order` is
/// false.
async fn classify_on(
    pair: &Pair,
    scenario: &str,
    timeout: Duration,
    order: bool,
) -> Result<Verdict> {
    let committed = committed_on(&pair.standby).await?;
    let js = pair.env.jetstream().await?;
    let deadline = Instant::now() + timeout;
    let (counts, messages) = loop {
        let messages = read_stream(&js).await?;
        let mut counts: HashMap<String, usize> = HashMap::new();
        for m in &messages {
            *counts.entry(m.id().to_owned()).or_default() += 1;
        }
        if committed.iter().all(|id| counts.contains_key(id)) || Instant::now() > deadline {
            break (counts, messages);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut v = Verdict::from_counts(scenario, &committed, &counts, false, "");
    if order {
        v.judge_order(&pair.standby.connect(DB).await?, &messages)
            .await?;
    }
    Ok(v)
}

/// 17. Failover slot, synchronized to the standby, `synchronized_standby_slots` on the primary:
/// under steady inserts the primary is killed (-9) and the standby promoted. The relay finds
/// the new primary among the URL's hosts, resumes from the checkpoint that came over with the
/// database on the slot that came over with it: nothing lost, nothing phantom, no second copy.
#[tokio::test(flavor = "multi_thread")]
async fn s17_failover_slot_survives_kill9_of_the_primary_and_promotion() -> Result<()> {
    let mut pair = Pair::start(PgOptions::default(), StandbyOptions::default()).await?;
    if !failover_slots_or_skip(&pair.env.pg, "s17") {
        return Ok(());
    }
    pair.synchronize_standby_slots().await?;
    let (http, addr) = http_listen();
    let config = in_mode(pair.config("", &http)?);
    let mut relay = Relay::start_streaming(&config).await?;
    let writers = Writers::start(&pair.url(), 2, Duration::from_millis(10));
    let js = pair.env.jetstream().await?;
    wait_for_messages(&js, 300, Duration::from_secs(30), Some(&relay)).await?;
    // The standby holds the slot, synchronized to where the relay confirmed it by now.
    pair.slot_synced_while_streaming(&js).await?;
    let before_kill = stream_count(&js).await?;
    let outstanding = metric(&addr, "outbox_relay_outstanding_acks")
        .await
        .unwrap_or(0.0);

    pair.env.pg.kill9()?;
    let killed = Instant::now();
    // A standby is promoted a moment after the primary died (by an operator or a tool): 2 s,
    // so the relay's reconnects (backoff 250 ms doubling to 1 s) meet the read-only standby
    // first even on a loaded machine (at 1 s one CI run saw none before the promotion).
    tokio::time::sleep(Duration::from_secs(2)).await;
    pair.standby.promote().await?;
    let promoted = killed.elapsed();
    wait_log_count(&relay, "replication started", 2, Duration::from_secs(30)).await?;
    let resumed = killed.elapsed();
    // Inserts keep going on the new primary.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let committed = writers.stop().await;
    let mut v = classify_on(
        &pair,
        "17 failover: kill -9 primary, promote standby",
        settle(),
        true,
    )
    .await?;
    let log = relay.log();
    v.note = format!(
        "{before_kill} in the stream at the kill ({outstanding} publishes outstanding); promoted {:.1} s after the kill, the relay streamed from the new primary {:.1} s after it; {committed} inserts acknowledged to the writers in all",
        promoted.as_secs_f64(),
        resumed.as_secs_f64()
    );
    let waited = log.matches("is read-only (a standby").count();
    v.note.push_str(&format!(
        "; {waited} reconnects found only the standby, read-only, before the promotion"
    ));
    v.require(
        waited > 0,
        "the relay waited for the promotion (no read-write server among the URL's hosts)",
    );
    v.require(
        log.contains("came over from the former primary (synced = true)"),
        "the relay resumed on the synchronized slot",
    );
    v.require(
        relay.try_status()?.is_none(),
        "the relay kept running through the failover",
    );
    v.assert_with_log(&log);
    Ok(())
}

/// 18. No `synchronized_standby_slots` on the primary. The preflight warns. The standby's
/// synchronized slot is left behind (slot synchronization turned off after the first sync),
/// the checkpoint replicates past it, then the standby is cut off its primary while the
/// primary commits 5 more events, which the relay publishes. kill -9, promotion: the
/// relay resumes from the standby's copy of the checkpoint, ahead of the slot, and skips
/// nothing the standby has; the 5 events are in the stream, their rows are not (phantoms: what
/// `synchronized_standby_slots` prevents).
#[tokio::test(flavor = "multi_thread")]
async fn s18_without_synchronized_standby_slots() -> Result<()> {
    let mut pair = Pair::start(PgOptions::default(), StandbyOptions::default()).await?;
    if !failover_slots_or_skip(&pair.env.pg, "s18") {
        return Ok(());
    }
    let config = in_mode(pair.config("", "")?);
    let out = relay_cmd(&config, &["validate", "--connect"]).await?;
    let preflight = String::from_utf8_lossy(&out.stdout).into_owned();
    let warned = line(&preflight, "WARN", "failover synchronized_standby_slots").is_some_and(|l| {
        l.contains("empty: the relay may be sent changes before any standby has them")
    });

    let relay = Relay::start_streaming(&config).await?;
    let js = pair.env.jetstream().await?;
    let primary = pair.env.db().await?;
    insert_events(&primary, "First", 10).await?;
    wait_for_messages(&js, 10, Duration::from_secs(20), Some(&relay)).await?;
    pair.slot_synced_while_streaming(&js).await?;

    // Freeze the synchronized slot, then move the checkpoint on past it.
    let standby_admin = pair.standby.connect("postgres").await?;
    standby_admin
        .batch_execute("ALTER SYSTEM SET sync_replication_slots = off")
        .await?;
    standby_admin
        .batch_execute("SELECT pg_reload_conf()")
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let synced_at = slot_on_standby(&pair).await?;
    let before = stream_count(&js).await?;
    insert_events(&primary, "Second", 10).await?;
    wait_for_messages(&js, before + 10, Duration::from_secs(20), Some(&relay)).await?;
    let wal = pair.env.current_wal().await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while pair.env.checkpoint().await?.unwrap_or(0) < wal {
        anyhow::ensure!(Instant::now() < deadline, "checkpoint never passed {wal}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pair.env
        .pg
        .wait_replayed(&pair.standby, Duration::from_secs(20))
        .await?;
    let standby_checkpoint = checkpoint_on_standby(&pair).await?;
    let synced_now = slot_on_standby(&pair).await?;

    // The standby stops receiving; the primary commits 5 events the relay publishes.
    pair.standby.disconnect_from_primary().await?;
    let before = stream_count(&js).await?;
    let lost_with_primary = insert_events(&primary, "NeverOnStandby", 5).await?;
    wait_for_messages(&js, before + 5, Duration::from_secs(20), Some(&relay)).await?;
    pair.env.pg.kill9()?;
    pair.standby.promote().await?;
    relay
        .wait_log("behind the stored checkpoint", Duration::from_secs(30))
        .await?;
    wait_log_count(&relay, "replication started", 2, Duration::from_secs(30)).await?;
    let new_primary = pair.standby.connect(DB).await?;
    insert_events(&new_primary, "AfterPromotion", 10).await?;

    let mut v = classify_on(
        &pair,
        "18 failover without synchronized_standby_slots",
        settle(),
        true,
    )
    .await?;
    let phantoms = v.phantom;
    let stream = read_stream(&js).await?;
    let phantom_ids: Vec<&str> = stream
        .iter()
        .map(Received::id)
        .filter(|id| lost_with_primary.iter().any(|l| l == id))
        .collect();
    v.pass = v.lost == 0 && v.dup == 0 && v.written > 0 && phantoms == lost_with_primary.len();
    v.note = format!(
        "validate warned: {warned}; synced slot frozen at {synced_at} (still {synced_now}), checkpoint replicated to {standby_checkpoint}: resumed from the checkpoint, nothing skipped; {phantoms} phantom = the {} events the standby never received, published from the old primary (what synchronized_standby_slots prevents)",
        lost_with_primary.len()
    );
    v.require(
        warned,
        "validate --connect warned about synchronized_standby_slots",
    );
    v.require(
        synced_now < standby_checkpoint,
        "the synchronized slot behind the standby's checkpoint",
    );
    v.require(
        phantom_ids.len() == lost_with_primary.len(),
        "the phantoms are the events of the rows the standby never received",
    );
    v.assert_with_log(&relay.log());
    Ok(())
}

async fn slot_on_standby(pair: &Pair) -> Result<String> {
    let row = pair
        .standby
        .connect("postgres")
        .await?
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'relay_slot'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

async fn checkpoint_on_standby(pair: &Pair) -> Result<String> {
    let row = pair
        .standby
        .connect(DB)
        .await?
        .query_one(
            "SELECT confirmed_lsn::text FROM outbox_relay.checkpoint WHERE slot_name = 'relay_slot'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// 19. No failover slot (PostgreSQL below 17; on 17+ `postgres.failover = false`): after kill
/// -9 and promotion the slot is missing on the new primary while the checkpoint came over. The
/// relay stops (exit 65) naming the slot, the timeline and the recovery procedure instead of
/// creating a slot that would skip what was committed since. The procedure of
/// docs/operations.md then recovers everything: a fresh start with a new slot, and
/// `outbox-relay backfill` for the rows committed since the checkpoint was stored.
#[tokio::test(flavor = "multi_thread")]
async fn s19_without_a_failover_slot_the_relay_stops_and_backfill_recovers() -> Result<()> {
    let mut pair = Pair::start(
        PgOptions::default(),
        StandbyOptions {
            sync_replication_slots: false,
            ..StandbyOptions::default()
        },
    )
    .await?;
    let version = pair.env.pg.version_num();
    let postgres_extra = if version >= FAILOVER_SLOTS_SINCE {
        "failover = false"
    } else {
        ""
    };
    let config = in_mode(pair.config(postgres_extra, "")?);
    let mut relay = Relay::start_streaming(&config).await?;
    let js = pair.env.jetstream().await?;
    let primary = pair.env.db().await?;
    insert_events(&primary, "BeforeFailover", 20).await?;
    wait_for_messages(&js, 20, Duration::from_secs(20), Some(&relay)).await?;
    let wal = pair.env.current_wal().await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while pair.env.checkpoint().await?.unwrap_or(0) < wal {
        anyhow::ensure!(Instant::now() < deadline, "checkpoint never passed {wal}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Events committed after the last checkpoint that reached the standby: the relay never
    // reads them (its slot is gone with the primary).
    pair.env
        .pg
        .wait_replayed(&pair.standby, Duration::from_secs(20))
        .await?;
    let noted = relay.log().contains("failover slots need PostgreSQL 17")
        || relay.log().contains("postgres.failover = false");
    pair.env.pg.kill9()?;
    pair.standby.promote().await?;
    let new_primary = pair.standby.connect(DB).await?;
    insert_events(&new_primary, "AfterPromotion", 10).await?;
    let stopped = expect_exit(
        &mut relay,
        65,
        Duration::from_secs(60),
        &[
            "replication slot `relay_slot` does not exist on this server, which is on timeline 2",
            "docs/operations.md, \"Failover\"",
            "outbox-relay backfill",
        ],
    )
    .await;
    let stopped_ok = stopped.is_ok();
    let relay_log = relay.log();
    let no_new_slot = new_primary
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'relay_slot'",
            &[],
        )
        .await?
        .is_none();

    // The recovery procedure: when was the checkpoint stored (it came over), start fresh,
    // backfill the rows committed since (with a margin: a row's created_at is its
    // transaction's start).
    let stored_at: String = new_primary
        .query_one(
            "SELECT (updated_at - interval '1 minute')::text FROM outbox_relay.checkpoint WHERE slot_name = 'relay_slot'",
            &[],
        )
        .await?
        .get(0);
    new_primary
        .execute(
            "DELETE FROM outbox_relay.checkpoint WHERE slot_name = 'relay_slot'",
            &[],
        )
        .await?;
    let relay = Relay::start_streaming(&config).await?;
    insert_events(&new_primary, "AfterRecovery", 5).await?;
    let filter = format!("created_at >= '{stored_at}'");
    let out = relay_cmd(
        &config,
        &["backfill", "--table", "public.outbox", "--where", &filter],
    )
    .await?;
    let backfilled = out.status.success();

    // Order is not judged: the recovery's backfill publishes the rows the failover skipped after
    // the events committed since, by design (docs/guarantees.md, "Commit order").
    let mut v = classify_on(
        &pair,
        "19 failover without a failover slot",
        settle(),
        false,
    )
    .await?;
    v.note = format!(
        "PostgreSQL {}.{}{}: order not judged (recovered by backfill); exit 65 naming the slot, timeline 2 and the procedure; no new slot; recovered: new slot, backfill --where \"created_at >= <checkpoint time - 1 min>\"",
        version / 10_000,
        version % 10_000,
        if postgres_extra.is_empty() {
            ""
        } else {
            " with failover = false"
        }
    );
    v.require(noted, "the start-up note that the slot is no failover slot");
    v.require(
        stopped_ok,
        format!(
            "exit 65 with the message ({})",
            stopped.err().map(|e| format!("{e:#}")).unwrap_or_default()
        ),
    );
    v.require(no_new_slot, "no slot created on the promoted standby");
    v.require(
        backfilled,
        format!("backfill succeeded: {}", describe(&out)),
    );
    v.assert_with_log(&format!(
        "{relay_log}\n--- after recovery ---\n{}",
        relay.log()
    ));
    Ok(())
}
