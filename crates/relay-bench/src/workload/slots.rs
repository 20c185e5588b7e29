//! The slots row: 1, 2, 4 … relays over one outbox, hash-sharded by `aggregateid`
//! (`[postgres] shard`, docs/scaling.md), each with its own slot and row-filtered publication,
//! catching up one backlog together; timed from their start until every relay's checkpoint is
//! past the last transaction. With the CPU of the relays, their walsenders and nats-server over
//! that time, which says where the limit sits.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use relay_postgres::ShardSpec;

use crate::Args;
use crate::measure::{cpu_seconds, peak_rss};

use super::relay::{RelayProc, checkpoint_of, relay_config_with, tail};
use super::setup::{Env, reset, stream_messages, write_backlog};
use super::{PUBLICATION, STREAM, say};

/// Rows per transaction of the backlog: every transaction then holds rows of every shard
/// (checked for the last one), so each relay's checkpoint passes it with its own events.
pub const SLOTS_PER_TX: u64 = 100;
const SHARD_KEY: &str = "aggregateid";

/// N relays (N slots) on one backlog.
#[derive(Debug, Clone)]
pub struct SlotsRun {
    pub slots: u32,
    pub rows: u64,
    pub secs: f64,
    pub events_per_s: f64,
    /// CPU seconds over the run: the relays, their walsenders (decoding), nats-server.
    pub relays_cpu_secs: f64,
    pub walsenders_cpu_secs: f64,
    pub nats_cpu_secs: f64,
    /// The largest peak RSS of one relay.
    pub max_relay_rss: u64,
}

impl SlotsRun {
    /// Cores the relays, walsenders and nats-server kept busy on average.
    pub fn busy_cores(&self) -> f64 {
        (self.relays_cpu_secs + self.walsenders_cpu_secs + self.nats_cpu_secs) / self.secs
    }
}

/// One run per `--slot-counts` value.
pub(super) async fn slots(env: &Env, args: &Args) -> Result<Vec<SlotsRun>> {
    let rows = args.mode_rows();
    let mut out = Vec::new();
    if rows == 0 {
        return Ok(out);
    }
    for &count in &args.slot_counts {
        if count == 0 {
            continue;
        }
        say(format!(
            "== {count} slot(s): {rows} rows in {SLOTS_PER_TX}-row txs"
        ));
        out.push(slots_run(env, args, count, rows).await?);
    }
    Ok(out)
}

/// The config of relay `index` of `count`: its own slot, and with 2 or more its shard's
/// publication and `shard = {…}`.
fn shard_config(
    env: &Env,
    mif: usize,
    count: u32,
    index: u32,
) -> Result<(String, std::path::PathBuf)> {
    let slot = format!("relay_s{count}_{index}");
    let config = relay_config_with(env, &slot, mif, "")?;
    if count > 1 {
        let text = std::fs::read_to_string(&config)?.replace(
            &format!("publication = \"{PUBLICATION}\""),
            &format!(
                "publication = \"{PUBLICATION}_s{count}_{index}\"\n\
                 shard = {{ key = \"{SHARD_KEY}\", count = {count}, index = {index} }}"
            ),
        );
        std::fs::write(&config, text)?;
    }
    Ok((slot, config))
}

// Long: one measured run: set-up, the timed region and its readings in order, so what the figure
// includes reads in one place
async fn slots_run(env: &Env, args: &Args, count: u32, rows: u64) -> Result<SlotsRun> {
    reset(env).await?;
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    // `outbox-relay setup` of each shard: its row-filtered publication and its slot, before the
    // backlog (rows written before a shard's slot exists are not that shard's to send).
    let mut shards = Vec::new();
    for index in 0..count {
        let (slot, config) = shard_config(env, mif, count, index)?;
        let setup = std::process::Command::new(&env.relay_bin)
            .arg("--config")
            .arg(&config)
            .arg("setup")
            .output()
            .context("running outbox-relay setup")?;
        if !setup.status.success() {
            bail!(
                "outbox-relay setup of {slot} failed ({}): {}",
                setup.status,
                String::from_utf8_lossy(&setup.stderr)
            );
        }
        shards.push((slot, config));
    }
    let (inside_last, _, write_secs) = write_backlog(env, rows, SLOTS_PER_TX).await?;
    say(format!("   written in {write_secs:.1} s"));
    if count > 1 {
        // Precondition of the end condition: the last transaction has rows of every shard.
        let spec = ShardSpec {
            key: SHARD_KEY.into(),
            count,
            index: 0,
        };
        let first = rows.saturating_sub(SLOTS_PER_TX - 1).max(1) as i64;
        let sql = format!(
            "SELECT count(DISTINCT {})::bigint FROM generate_series($1::bigint, $2::bigint) g",
            spec.shard_of_sql("g::text")
        );
        let shards_in_last: i64 = env
            .client
            .query_one(&sql, &[&first, &(rows as i64)])
            .await?
            .get(0);
        if shards_in_last != i64::from(count) {
            bail!("the last transaction holds rows of {shards_in_last} of {count} shards");
        }
    }
    let nats_cpu = || env.nats.pid().and_then(|p| cpu_seconds(&p.to_string()));
    let nats_before = nats_cpu();
    let started = Instant::now();
    let mut relays = Vec::new();
    for (slot, config) in &shards {
        relays.push(RelayProc::start_config(env, &env.relay_bin, config, slot)?);
    }
    let timeout = Duration::from_secs(120 + rows / 2_000);
    // The last CPU reading of every walsender seen serving a slot (a relay may reconnect, and
    // a walsender that exited keeps its last reading).
    let mut walsender_cpu: HashMap<i32, f64> = HashMap::new();
    let mut done = vec![false; shards.len()];
    while !done.iter().all(|d| *d) {
        for (i, (slot, _)) in shards.iter().enumerate() {
            if let Some(pid) = walsender_pid(env, slot).await?
                && let Some(cpu) = cpu_seconds(&pid.to_string())
            {
                walsender_cpu.insert(pid, cpu);
            }
            if !done[i] {
                done[i] = checkpoint_of(env, slot)
                    .await?
                    .is_some_and(|c| c > inside_last);
            }
        }
        for relay in &mut relays {
            relay.check_alive()?;
        }
        if started.elapsed() > timeout {
            bail!(
                "{count} relays did not catch up within {timeout:?}; log of the first:\n{}",
                tail(&relays[0].log)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let relays_cpu_secs: f64 = relays
        .iter()
        .map(|r| cpu_seconds(&r.pid().to_string()).unwrap_or(f64::NAN))
        .sum();
    for (slot, _) in &shards {
        if let Some(pid) = walsender_pid(env, slot).await?
            && let Some(cpu) = cpu_seconds(&pid.to_string())
        {
            walsender_cpu.insert(pid, cpu);
        }
    }
    let walsenders_cpu_secs: f64 = walsender_cpu.values().sum();
    let nats_cpu_secs = match (nats_before, nats_cpu()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    let max_relay_rss = relays
        .iter()
        .filter_map(|r| peak_rss(r.pid()))
        .max()
        .unwrap_or(0);
    let messages = stream_messages(env, STREAM).await?;
    for relay in relays {
        relay.stop().await?;
    }
    if messages != rows {
        bail!("{count} relays stored {messages} messages, expected {rows}");
    }
    let run = SlotsRun {
        slots: count,
        rows,
        secs,
        events_per_s: rows as f64 / secs,
        relays_cpu_secs,
        walsenders_cpu_secs,
        nats_cpu_secs,
        max_relay_rss,
    };
    say(format!(
        "   {count} relay(s): {:.0} events/s ({secs:.2} s); CPU s: relays {relays_cpu_secs:.2}, walsenders {walsenders_cpu_secs:.2}, nats-server {nats_cpu_secs:.2} ({:.2} cores busy)",
        run.events_per_s,
        run.busy_cores()
    ));
    Ok(run)
}

/// The walsender process serving `slot`, once the relay is connected.
async fn walsender_pid(env: &Env, slot: &str) -> Result<Option<i32>> {
    let row = env
        .client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.and_then(|r| r.get::<_, Option<i32>>(0)))
}
