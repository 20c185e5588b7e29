//! `outbox-relay restore --from-lsn X` of a 200,000-event window against the catch-up rate of
//! the same backlog.
//!
//! The relay catches up on a backlog of 100-row transactions with `[relay] replay_retention`
//! (its catch-up timed as in the catch-up rows), so its slot keeps the backlog's WAL behind the
//! checkpoint. Then the stream is purged and `outbox-relay restore --from-lsn <LSN before the
//! first event>` is timed from spawn to exit. Afterwards the stream must hold every event of
//! the table exactly once (by `Nats-Msg-Id`), and neither the main slot's
//! `confirmed_flush_lsn` nor the stored checkpoint may have moved.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::Args;
use crate::measure::{children_cpu_seconds, micros_per_event};

use super::relay::{CatchUpConfig, Perf, checkpoint_of, finished_line, relay_catch_up_with, tail};
use super::setup::{Env, drop_slot, insert_lsn, reset, stream_id_copies, write_backlog};
use super::{RelayRun, STREAM, say};

/// Rows per transaction of the window.
const PER_TX: u64 = 100;
/// The stream's duplicate window: a purge leaves the ids in it (docs/replay.md), so the
/// restore waits it out; short, so the wait is too.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(1);
/// Far more than the window's WAL (about 0.7 kB per event): the slot keeps all of it.
const RETENTION: &str = "4GB";

/// One restore run and the catch-up it is compared with.
#[derive(Debug, Clone)]
pub struct RestoreRun {
    pub events: u64,
    /// WAL of the window, bytes.
    pub wal_bytes: u64,
    /// The relay's catch-up on the same backlog, same run (it published what restore publishes
    /// again).
    pub catch_up: RelayRun,
    /// `--max-in-flight` of the restore (the catch-up's `max_in_flight`).
    pub max_in_flight: usize,
    /// Wall time of the `outbox-relay restore` process, spawn to exit.
    pub secs: f64,
    pub events_per_s: f64,
    /// utime + stime of the restore process.
    pub cpu_secs: f64,
    /// The restore's own summary line (`restore … finished: …`).
    pub summary: String,
    /// What is wrong afterwards, if anything: the stream not holding every event exactly once,
    /// the main slot or the checkpoint moved.
    pub problem: Option<String>,
}

impl RestoreRun {
    /// Restore rate / catch-up rate.
    pub fn ratio(&self) -> f64 {
        self.events_per_s / self.catch_up.events_per_s
    }
}

/// `0/16B3748`: the text form of an LSN, as `--from-lsn` takes it.
fn lsn_text(lsn: u64) -> String {
    outbox_contract::Lsn(lsn).to_string()
}

async fn confirmed_flush(env: &Env, slot: &str) -> Result<Option<u64>> {
    let row = env
        .client
        .query_opt(
            "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row
        .and_then(|r| r.get::<_, Option<i64>>(0))
        .map(|l| l as u64))
}

/// Every event of the table in the stream exactly once: `None`, or what is wrong.
async fn exactly_once(env: &Env, events: u64) -> Result<Option<String>> {
    let copies = stream_id_copies(env, STREAM).await?;
    let ids: Vec<String> = env
        .client
        .query("SELECT id::text FROM outbox", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let missing = ids.iter().filter(|id| !copies.contains_key(*id)).count();
    let twice = copies.values().filter(|&&n| n > 1).count();
    let stored: u64 = copies.values().map(|&n| u64::from(n)).sum();
    let foreign = copies.len() - (ids.len() - missing);
    let ok = missing == 0 && twice == 0 && foreign == 0 && ids.len() as u64 == events;
    Ok((!ok).then(|| {
        format!(
            "the stream holds {stored} messages for {} events: {missing} missing, {twice} ids more than once, {foreign} ids not in the table",
            ids.len()
        )
    }))
}

pub(super) async fn restore(env: &Env, args: &Args) -> Result<RestoreRun> {
    let events = args.restore_events();
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    say(format!(
        "== restore: {events} events in {PER_TX}-row txs, relay with replay_retention {RETENTION}, stream purged, `outbox-relay restore`"
    ));
    reset(env).await?;
    let from = insert_lsn(&env.client).await?;
    let (inside_last, end, write_secs) = write_backlog(env, events, PER_TX).await?;
    say(format!(
        "   written in {write_secs:.1} s, {:.0} MB of WAL",
        (end - from) as f64 / 1e6
    ));
    let nats = format!(
        "duplicate_window = \"{}\"",
        humantime::format_duration(DUPLICATE_WINDOW)
    );
    let relay = format!("replay_retention = \"{RETENTION}\"");
    let setup = CatchUpConfig {
        nats: &nats,
        relay: &relay,
        keep_slot: true,
    };
    let caught_up =
        relay_catch_up_with(env, &env.relay_bin, "", mif, events, inside_last, &setup).await?;
    let slot = caught_up.slot.as_str();
    say(format!(
        "   relay catch-up (replay_retention {RETENTION}): {:.0} events/s ({:.2} s, {:.2} CPU µs/event)",
        caught_up.run.events_per_s,
        caught_up.run.secs,
        micros_per_event(caught_up.run.cpu_secs, events)
    ));
    let result = purge_and_restore(env, slot, &caught_up.config, from, mif).await;
    drop_slot(env, slot).await;
    let (secs, cpu_secs, summary, moved) = result?;
    let mut problem = exactly_once(env, events).await?;
    if let Some(moved) = moved {
        problem = Some(problem.map_or(moved.clone(), |p| format!("{p}; {moved}")));
    }
    let _ = env.js.delete_stream(STREAM).await;
    let run = RestoreRun {
        events,
        wal_bytes: end - from,
        catch_up: caught_up.run,
        max_in_flight: mif,
        secs,
        events_per_s: events as f64 / secs,
        cpu_secs,
        summary,
        problem,
    };
    say(format!(
        "   restore: {:.0} events/s ({:.2} s, {:.2} CPU µs/event), {:.0}% of the catch-up's {:.0} events/s",
        run.events_per_s,
        run.secs,
        micros_per_event(run.cpu_secs, events),
        run.ratio() * 100.0,
        run.catch_up.events_per_s
    ));
    say(format!("   {}", run.summary));
    if let Some(p) = &run.problem {
        say(format!("   restore: {p}"));
    }
    Ok(run)
}

/// Purges the stream and times the restore; returns (seconds, CPU seconds, its summary line,
/// what moved of the main slot and the checkpoint, if anything).
async fn purge_and_restore(
    env: &Env,
    slot: &str,
    config: &std::path::Path,
    from: u64,
    mif: usize,
) -> Result<(f64, f64, String, Option<String>)> {
    let slot_before = confirmed_flush(env, slot).await?;
    let checkpoint_before = checkpoint_of(env, slot).await?;
    env.js
        .get_stream(STREAM)
        .await?
        .purge()
        .await
        .map_err(|e| anyhow::anyhow!("purging stream {STREAM}: {e}"))?;
    // Past the duplicate window: inside it JetStream still answers "duplicate" for the purged
    // ids and restore refuses to count those as restored.
    tokio::time::sleep(DUPLICATE_WINDOW * 2).await;
    let log = env.log_dir.join("restore.log");
    let cpu_before = children_cpu_seconds();
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&env.relay_bin)
        .arg("--config")
        .arg(config)
        .args(["restore", "--from-lsn", &lsn_text(from)])
        .args(["--max-in-flight", &mif.to_string()])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("running outbox-relay restore")?;
    let perf = Perf::attach(child.id().unwrap_or(0), &format!("restore-{slot}"))?;
    let status = child
        .wait()
        .await
        .context("waiting for outbox-relay restore")?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = children_cpu_seconds() - cpu_before;
    perf.finish();
    if !status.success() {
        bail!(
            "outbox-relay restore failed ({status}); log {}:\n{}",
            log.display(),
            tail(&log)
        );
    }
    let summary = finished_line(&log);
    let slot_after = confirmed_flush(env, slot).await?;
    let checkpoint_after = checkpoint_of(env, slot).await?;
    let show = |l: Option<u64>| l.map_or_else(|| "none".to_owned(), lsn_text);
    let mut moved = Vec::new();
    if slot_after != slot_before {
        moved.push(format!(
            "the main slot's confirmed_flush_lsn moved from {} to {}",
            show(slot_before),
            show(slot_after)
        ));
    }
    if checkpoint_after != checkpoint_before {
        moved.push(format!(
            "the checkpoint moved from {} to {}",
            show(checkpoint_before),
            show(checkpoint_after)
        ));
    }
    let moved = (!moved.is_empty()).then(|| moved.join("; "));
    Ok((secs, cpu, summary, moved))
}
