//! An active/standby pair on one slot. The standby waits at the slot until it is free; then its
//! session reads the checkpoint, then the slot, and another relay that took the slot meanwhile
//! stores and confirms between the two reads. That must never look like "slot ahead of the
//! checkpoint" (exit 65, which the systemd unit does not restart): high availability would be
//! lost.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use nix::sys::signal::Signal;
use relay_core::Lsn;

use crate::ops::{get, wait_http};
use crate::pause::Pause;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);
/// What a relay logs when the slot moved past the checkpoint it read (relay_postgres::bootstrap).
const INTERLEAVED: &str = "while the slot was read";

/// The slot's confirmed position, then the stored checkpoint, read in that order: a relay
/// stores a position before it confirms it, so read this way the slot is never ahead.
async fn slot_then_checkpoint(env: &Env) -> Result<(u64, u64)> {
    let slot = env.slot_confirmed().await?.context("slot")?;
    let checkpoint = env.checkpoint().await?.context("checkpoint")?;
    Ok((slot, checkpoint))
}

/// Starts a relay and waits until it waits as a standby. Once it finds the slot free, it takes
/// 200 ms between its checkpoint read and its slot read (`RELAY_DELAY`).
async fn standby(config: &std::path::Path) -> Result<Relay> {
    let relay = Relay::start_with_env(
        config,
        &["run"],
        &[
            ("RELAY_RELAY__RECONNECT_MAX", "100ms"),
            ("RELAY_DELAY", "after_checkpoint_read:200"),
        ],
    )?;
    relay
        .wait_log("in use by another process", Duration::from_secs(30))
        .await?;
    Ok(relay)
}

/// A standby found the slot free and is held between its checkpoint read and its slot read,
/// while another relay takes the slot and stores and confirms a later position: the standby
/// must read the checkpoint again, lose the slot to the other relay, go on waiting, and take
/// over later.
#[tokio::test(flavor = "multi_thread")]
async fn standby_sees_the_slot_move_between_its_reads_and_keeps_waiting() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("");
    let mut first = Relay::start_streaming(&config).await?;
    let one = insert_event(&db, "Order", "Created", r#"{"n":1}"#).await?;
    wait_for_id(&js, &one, &first).await?;
    first.signal(Signal::SIGTERM);
    ensure!(first.wait_exit(WAIT).await?.code() == Some(0));

    // The slot is free: the standby goes past its wait and is held after the checkpoint read.
    let pause = Pause::new(&env, "after_checkpoint_read");
    let (_, http) = http_listen();
    let mut standby = Relay::start_with_env(
        &config,
        &["run"],
        &[
            ("RELAY_PAUSE", &pause.spec()),
            ("RELAY_HTTP__LISTEN", &http),
        ],
    )?;
    pause.reached(&standby).await?;
    let read = env.checkpoint().await?.context("checkpoint")?;
    let mut active = Relay::start_streaming(&config).await?;
    let two = insert_event(&db, "Order", "Created", r#"{"n":2}"#).await?;
    wait_for_id(&js, &two, &active).await?;
    let deadline = Instant::now() + WAIT;
    while env.slot_confirmed().await?.context("slot")? <= read {
        ensure!(
            Instant::now() < deadline,
            "the slot never moved past {read}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pause.release()?;

    standby
        .wait_log("waiting as a standby", WAIT)
        .await
        .with_context(|| format!("standby: {:?}", standby.try_status()))?;
    assert!(
        standby.try_status()?.is_none(),
        "the standby stopped:\n{}",
        standby.log()
    );
    assert!(
        standby.log().contains(INTERLEAVED),
        "the standby never read the checkpoint again:\n{}",
        standby.log()
    );
    // Not ready, and why: /readyz and /status name the process that streams the slot.
    let holder = env
        .slot_active_pid()
        .await?
        .context("the active relay streams")?;
    let why = format!("standby: slot `relay_slot` is held by another process (pid {holder})");
    let readyz = wait_http(&http, "/readyz", 503, WAIT, &standby).await?;
    assert!(readyz.contains(&why), "{readyz}");
    let (_, status) = get(&http, "/status").await?;
    assert!(status.contains(&why), "{status}");

    active.kill9();
    standby.wait_log("replication started", WAIT).await?;
    wait_http(&http, "/readyz", 200, WAIT, &standby).await?;
    let three = insert_event(&db, "Order", "Created", r#"{"n":3}"#).await?;
    wait_for_id(&js, &three, &standby).await?;
    let (slot, checkpoint) = slot_then_checkpoint(&env).await?;
    assert!(
        slot <= checkpoint,
        "slot {slot} ahead of checkpoint {checkpoint}"
    );
    Ok(())
}

/// Inserts one event every 10 ms until stopped; returns the ids that committed.
fn steady_load(env: &Env, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Result<Vec<String>>> {
    let url = env.pg.url(DB);
    tokio::spawn(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let mut ids = Vec::new();
        for n in 0u64.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            ids.push(insert_event(&client, "Order", "Created", &format!("{{\"n\":{n}}}")).await?);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(ids)
    })
}

/// 20 takeovers in a row under steady insert load: kill -9 the active relay, the standby takes
/// over, a new standby starts. Every event arrives (exactly once), no relay stops, and the
/// slot is never ahead of the checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn twenty_takeovers_under_load_lose_nothing_and_never_stop() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let config = env.config("");
    let stop = Arc::new(AtomicBool::new(false));
    let mut active = Relay::start_streaming(&config).await?;
    let load = steady_load(&env, stop.clone());
    let mut waiting = standby(&config).await?;
    let started = Instant::now();
    let mut interleaved = 0;
    for round in 1..=20 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let (slot, checkpoint) = slot_then_checkpoint(&env).await?;
        ensure!(
            slot <= checkpoint,
            "round {round}: slot {slot} ahead of checkpoint {checkpoint}"
        );
        for (role, relay) in [("active", &mut active), ("standby", &mut waiting)] {
            if let Some(status) = relay.try_status()? {
                bail!(
                    "round {round}: the {role} relay exited ({status}):\n{}",
                    relay.log()
                );
            }
        }
        active.kill9();
        interleaved += active.log().matches(INTERLEAVED).count();
        let killed = Instant::now();
        waiting
            .wait_log("replication started", WAIT)
            .await
            .with_context(|| format!("round {round}"))?;
        println!("takeover {round}: {:?}", killed.elapsed());
        active = waiting;
        waiting = standby(&config).await?;
    }
    stop.store(true, Ordering::Relaxed);
    let ids = load.await??;
    interleaved += [&active, &waiting]
        .iter()
        .map(|r| r.log().matches(INTERLEAVED).count())
        .sum::<usize>();
    println!(
        "20 takeovers in {:?}, {} events; a standby saw the slot move between its reads {interleaved} times",
        started.elapsed(),
        ids.len()
    );

    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(&active)).await?;
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for m in &got {
        *copies.entry(m.id()).or_default() += 1;
    }
    let written: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let lost: Vec<_> = ids
        .iter()
        .filter(|id| !copies.contains_key(id.as_str()))
        .collect();
    let duplicated = copies.values().filter(|&&n| n > 1).count();
    let phantom = copies.keys().filter(|id| !written.contains(*id)).count();
    assert!(
        lost.is_empty(),
        "{} events lost, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    assert_eq!(duplicated, 0, "events stored twice");
    assert_eq!(phantom, 0, "messages that are no committed event");

    // Both stop cleanly; the slot is at the stored checkpoint, past every event.
    for relay in [&mut active, &mut waiting] {
        relay.signal(Signal::SIGTERM);
        assert_eq!(
            relay.wait_exit(WAIT).await?.code(),
            Some(0),
            "{}",
            relay.log()
        );
    }
    let newest: Lsn = got
        .iter()
        .map(|m| m.header("Outbox-Commit-Lsn").parse::<Lsn>())
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .max()
        .context("events")?;
    let (slot, checkpoint) = slot_then_checkpoint(&env).await?;
    assert!(
        slot <= checkpoint,
        "slot {slot} ahead of checkpoint {checkpoint}"
    );
    assert!(
        Lsn(checkpoint) > newest,
        "checkpoint {} not past the newest event {newest}",
        Lsn(checkpoint)
    );
    Ok(())
}

/// Two relays of a pair started together on a fresh database: the second finds the slot while
/// the first is still creating it (no confirmed position yet), or loses the race to create it
/// (42710). Either way it waits as the standby; before, it exited 65 ("invalidated") or 78.
#[tokio::test(flavor = "multi_thread")]
async fn two_relays_started_together_on_a_fresh_database_become_active_and_standby() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("");
    // An open transaction with an xid holds slot creation until it ends (the snapshot builder
    // waits for running transactions), so the second relay meets a slot being created.
    let holder = env.db().await?;
    holder
        .batch_execute("BEGIN; SELECT txid_current();")
        .await?;
    let mut first = Relay::start_with_env(
        &config,
        &["run"],
        &[("RELAY_RELAY__RECONNECT_MAX", "100ms")],
    )?;
    let deadline = Instant::now() + WAIT;
    loop {
        let row = db
            .query_opt(
                "SELECT confirmed_flush_lsn IS NULL FROM pg_replication_slots",
                &[],
            )
            .await?;
        if row.is_some_and(|r| r.get::<_, bool>(0)) {
            break; // precondition: the slot exists and is still being created
        }
        ensure!(
            Instant::now() < deadline,
            "slot never appeared:\n{}",
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut second = Relay::start_with_env(
        &config,
        &["run"],
        &[("RELAY_RELAY__RECONNECT_MAX", "100ms")],
    )?;
    // It waits for the slot's creator (the slot shows it as its reader), or it lost the race to
    // create the slot and starts over to wait.
    let deadline = Instant::now() + WAIT;
    while !["waiting as a standby", "was created by another relay"]
        .iter()
        .any(|needle| second.log().contains(needle))
    {
        ensure!(
            Instant::now() < deadline,
            "the second relay never waited:\n{}",
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.batch_execute("COMMIT").await?;
    // A row committed before the slot is consistent (its creation ends at the next running-xacts
    // record after the holder's commit) is from before the slot: never streamed, by PostgreSQL's
    // design (backfill's business). Write the row once the slot exists in full.
    let deadline = Instant::now() + WAIT;
    while db
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE confirmed_flush_lsn IS NOT NULL",
            &[],
        )
        .await?
        .get::<_, i64>(0)
        == 0
    {
        ensure!(
            Instant::now() < deadline,
            "the slot's creation never finished:\n{}",
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let id = insert_event(&db, "Order", "Created", r#"{"n":1}"#).await?;
    wait_for_id(&js, &id, &first).await?;
    ensure!(
        second.try_status()?.is_none(),
        "the second relay stopped:\n{}",
        second.log()
    );
    // The preflight a service manager runs before starting a relay (the systemd unit's
    // ExecStartPre) passes while the other relay streams: a warning, not a refusal.
    let preflight = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&config)
        .args(["validate", "--connect"])
        .output()?;
    let report = String::from_utf8_lossy(&preflight.stdout);
    ensure!(
        preflight.status.success() && report.contains("a relay started now waits as its standby"),
        "validate --connect while the other relay streams: {:?}\n{report}",
        preflight.status
    );
    // The first one goes away; the second takes over and delivers.
    first.kill9();
    let id = insert_event(&db, "Order", "Created", r#"{"n":2}"#).await?;
    wait_for_id(&js, &id, &second).await?;
    second.signal(Signal::SIGTERM);
    ensure!(second.wait_exit(WAIT).await?.code() == Some(0));
    Ok(())
}
