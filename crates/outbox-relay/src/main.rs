//! `outbox-relay`: PostgreSQL outbox table → NATS JetStream, without polling.
//!
//! Orchestration only: parse the command line, load the configuration, start logging, then
//! build a [`relay_runtime::Relay`], serve its `[http]` endpoints and console (relay-console)
//! and run it, or run one of the [`commands`], and map the outcome to an exit code ([`exit`]).

mod commands;
mod exit;
mod fleet;
#[cfg(test)]
mod reference_drift;
mod signals;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::exit::Failure;
use relay_runtime::config::RelayConfig;
use relay_runtime::fleet::FleetConfig;

/// glibc malloc/free was about a quarter of the relay's CPU per event (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Relays outbox-table inserts from PostgreSQL (logical replication, pgoutput) to NATS
/// JetStream. The replication slot is advanced only after JetStream acknowledged every event
/// before the new position: restarts may re-send (deduplicated by Nats-Msg-Id), never skip.
#[derive(Debug, Parser)]
#[command(version = telemetry::LONG_VERSION, propagate_version = true)]
struct Cli {
    /// TOML configuration file. Every key can be overridden by an environment variable
    /// RELAY_<SECTION>__<KEY>, e.g. RELAY_POSTGRES__URL, RELAY_POSTGRES__PASSWORD,
    /// RELAY_NATS__URL. Without a file, defaults plus environment are used.
    #[arg(long, short, global = true, env = "RELAY_CONFIG")]
    config: Option<PathBuf>,

    /// The pipeline of a fleet configuration ([[pipeline]] or [fleet] pipelines_dir) a
    /// command acts on. `status`, `validate` and `setup` act on every pipeline without it;
    /// the others need it when the fleet has more than one.
    #[arg(long, global = true, env = "RELAY_PIPELINE")]
    pipeline: Option<String>,

    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "RELAY_LOG_FORMAT")]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the relay (the default): every pipeline of a fleet configuration, each alone
    /// (SIGHUP reads the configuration again and starts, stops or restarts only the pipelines
    /// that changed).
    Run {
        /// Start even though the slot's confirmed position is ahead of the stored checkpoint
        /// (events in between were confirmed without this relay publishing them). Use only
        /// after reconciling those events from the outbox table.
        #[arg(long)]
        accept_slot_position: bool,
        /// In a fleet, exit on the first pipeline's fatal condition with its exit code (as a
        /// single relay does), instead of stopping only that pipeline.
        #[arg(long, env = "RELAY_FAIL_FAST")]
        fail_fast: bool,
    },
    /// Check the configuration and the files it names (credentials, certificates, the console
    /// token) as `run` does, and print it (secrets redacted); with --connect, a preflight of
    /// PostgreSQL and JetStream instead: one PASS/WARN/FAIL line per check, with a hint for
    /// each failure. Exit 0 when nothing failed, 65/69/78 otherwise.
    Validate {
        /// Connect and check everything `run` needs, without changing anything.
        #[arg(long)]
        connect: bool,
    },
    /// Create what is missing, idempotently: the checkpoint table, the publication, the slot
    /// and, with --create-stream, the JetStream stream.
    Setup {
        /// Also create the stream when it is missing (file storage, [nats] stream_subjects and
        /// duplicate_window).
        #[arg(long)]
        create_stream: bool,
    },
    /// Show the slot (lag, wal_status), the stored checkpoint, the stream, and a running
    /// relay's health.
    Status {
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// host:port of a running relay's HTTP endpoint (default: [http] listen).
        #[arg(long)]
        relay: Option<String>,
    },
    /// Ask the relay running on this host (its [http] listen address, or --relay) whether it is
    /// live (default) or ready; exit 0 if so, 1 if not. For container health checks in images
    /// without curl.
    Health {
        /// Check /readyz instead of /livez.
        #[arg(long)]
        ready: bool,
        /// host:port of the relay's HTTP endpoint (default: [http] listen).
        #[arg(long)]
        relay: Option<String>,
    },
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        action: ConfigCommand,
    },
    /// Publish the rows an outbox table already held before the relay's slot existed, in
    /// keyset pages beside the running relay, exactly as the relay would (plus
    /// Outbox-Backfill: true). Resumable: a cursor in outbox_relay.backfill moves only over
    /// rows JetStream acknowledged. See docs/replay.md.
    Backfill(commands::backfill::BackfillArgs),
    /// The first stream sequence to replay from so that every event committed at or after a
    /// commit LSN or time is delivered, and how it was found (the position map, or a search of
    /// the stream). See docs/replay.md.
    Position {
        #[command(flatten)]
        at: commands::position::At,
        #[command(flatten)]
        search: commands::position::Search,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Point a durable consumer (new; an existing one reset in place on nats-server 2.14+, or
    /// deleted and re-created with --yes before) at the events committed from a commit LSN or
    /// time, so they are delivered again; --dry-run prints the range and its size. See
    /// docs/replay.md.
    Replay(commands::replay::ReplayArgs),
    /// Publish again, from the WAL the slot still keeps ([relay] replay_retention), the events
    /// committed from a commit LSN that the stream no longer holds (purged, re-created, lost),
    /// with the same Nats-Msg-Id; ids still in the stream are skipped. Decodes from a copy of
    /// the slot; never moves the slot or the stored checkpoint. See docs/replay.md.
    Restore(commands::restore::RestoreArgs),
    /// Check, against the WAL the slot still keeps, that every event committed from a commit
    /// LSN is in the stream (by Nats-Msg-Id); publish nothing. Exit 65 on a gap, naming the
    /// missing events and the restore that brings them back. See docs/replay.md.
    Verify(commands::verify::VerifyArgs),
    /// Follow one event from its outbox row to each consumer: the row and the subject it maps
    /// to, its message in the stream (or the dead-letter subject, or "not yet published"), each
    /// consumer's position with it, and the consumers' ledger.
    Trace(commands::trace::TraceArgs),
    /// Event contracts ([outbox.contracts]): `check` reports every event the configured
    /// contracts would refuse among the rows still in the outbox tables and the last messages
    /// of the stream; exit 65 when any would be. See docs/contracts.md.
    Contracts {
        #[command(subcommand)]
        action: ContractsCommand,
    },
    /// Write an AsyncAPI 3.0 document (JSON) of what the relay publishes: the server, a
    /// channel per outbox table (its subject template's parameters), [[messages]] prefix and
    /// dead-letter subject, each message's headers and its payload schema (the contract, where
    /// [outbox.contracts] names one). Reads only the configuration and the contract files.
    Asyncapi {
        /// Write to this file instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
    /// Print messages from the JetStream stream: subject, headers and payload.
    Tail {
        /// Stop after this many messages.
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// Stop after this long without a message (e.g. `10s`).
        #[arg(long, default_value = "10s", value_parser = relay_runtime::config::parse_duration)]
        idle_timeout: std::time::Duration,
    },
}

#[derive(Debug, Subcommand)]
enum ContractsCommand {
    /// Check the rows in the outbox tables and the last messages of the stream against the
    /// configured contracts (point --config at the configuration with the new schemas).
    Check(commands::contracts::CheckArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print the merged configuration, secrets redacted, each value with where it came from
    /// (file, environment variable, default).
    Print,
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // Repeated warnings and errors (an outage) are limited to 5 per 10 s per log statement.
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(telemetry::RateLimit::new(
            std::time::Duration::from_secs(10),
            5,
        ));
    match format {
        LogFormat::Text => registry.with(fmt).init(),
        LogFormat::Json => registry.with(fmt.json()).init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match try_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => exit::report(&failure),
    }
}

fn try_main(cli: Cli) -> Result<(), Failure> {
    let fleet = FleetConfig::load(cli.config.as_deref(), &[]).map_err(Failure::config)?;
    let log_json = matches!(cli.log_format, LogFormat::Json);
    let command = cli.command.unwrap_or(Command::Run {
        accept_slot_position: false,
        fail_fast: false,
    });
    let pipeline = cli.pipeline;
    match command {
        Command::Validate { connect: false } => {
            return commands::validate::offline(&fleet, pipeline.as_deref());
        }
        Command::Asyncapi { output } => {
            let config = &fleet::one(&fleet, pipeline.as_deref())?.config;
            return commands::contracts::asyncapi(config, output);
        }
        Command::Config {
            action: ConfigCommand::Print,
        } => {
            let entry = fleet::one(&fleet, pipeline.as_deref())?;
            return commands::config_print::print(&entry.config, &entry.figment)
                .map_err(Failure::internal);
        }
        _ => {}
    }
    // One relay, one thread: the replication reader, the pipeline and the NATS connection hand
    // every event to each other, and on the same thread that costs a queue push instead of a
    // futex wake-up and a context switch (a fifth of the relay's CPU on a multi-thread
    // runtime); the relay needs well under one core, PostgreSQL and nats-server get the
    // others. A fleet's pipelines get `[fleet] threads` (default: one per core), so one
    // pipeline catching up a backlog does not hold the others' thread.
    let runtime = match fleet_threads(&fleet) {
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(threads) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build(),
    }
    .map_err(|e| Failure::internal(anyhow::Error::new(e).context("cannot start the runtime")))?;
    runtime.block_on(async move {
        let name = pipeline.as_deref();
        match command {
            Command::Run {
                accept_slot_position,
                fail_fast,
            } => run(fleet, accept_slot_position, fail_fast).await,
            Command::Validate { .. } => {
                fleet::each(&fleet, name, async |entry| {
                    commands::validate::preflight(&entry.config).await
                })
                .await
            }
            Command::Setup { create_stream } => {
                fleet::each(&fleet, name, async |entry| {
                    commands::setup::setup(&entry.config, create_stream).await
                })
                .await
            }
            Command::Status { json, relay } => {
                commands::status::status(&fleet, name, json, relay).await
            }
            Command::Health { ready, relay } => {
                commands::status::health(&fleet.http, ready, relay).await
            }
            command => {
                let config = &fleet::one(&fleet, name)?.config;
                one_pipeline(config, command, log_json).await
            }
        }
    })
}

/// The worker threads of a fleet's runtime (`None`: one relay's single thread).
fn fleet_threads(fleet: &FleetConfig) -> Option<usize> {
    if !fleet.is_fleet || fleet.pipelines.len() < 2 {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    Some(fleet.fleet.threads.unwrap_or(cores).max(1))
}

/// The commands that act on one pipeline.
async fn one_pipeline(
    config: &RelayConfig,
    command: Command,
    log_json: bool,
) -> Result<(), Failure> {
    match command {
        Command::Tail {
            count,
            idle_timeout,
        } => commands::tail::tail(config, count, idle_timeout).await,
        Command::Backfill(mut args) => {
            args.log_json = log_json;
            commands::backfill::backfill(config, args).await
        }
        Command::Position { at, search, json } => {
            commands::position::position(config, &at, &search, json).await
        }
        Command::Replay(args) => commands::replay::replay(config, &args).await,
        Command::Trace(args) => commands::trace::trace(config, &args).await,
        Command::Contracts {
            action: ContractsCommand::Check(args),
        } => commands::contracts::check(config, &args).await,
        Command::Restore(mut args) => {
            args.log_json = log_json;
            commands::restore::restore(config, args).await
        }
        Command::Verify(mut args) => {
            args.log_json = log_json;
            commands::verify::verify(config, &args).await
        }
        Command::Run { .. }
        | Command::Validate { .. }
        | Command::Setup { .. }
        | Command::Status { .. }
        | Command::Health { .. }
        | Command::Config { .. }
        | Command::Asyncapi { .. } => Ok(()),
    }
}

/// Runs every pipeline until a signal asks the process to stop, or (a single relay's
/// configuration, or `--fail-fast`) one fails.
async fn run(
    fleet: FleetConfig,
    accept_slot_position: bool,
    fail_fast: bool,
) -> Result<(), Failure> {
    let shutdown = tokio_util::sync::CancellationToken::new();
    signals::spawn_handler(
        shutdown.clone(),
        "shutdown requested: finishing outstanding publishes, then storing the checkpoint",
        "second signal: exiting now; unacknowledged events will be re-sent",
    );
    let reloads = signals::spawn_reload_handler();
    let options = relay_runtime::RelayOptions {
        accept_slot_position,
        build: telemetry::BUILD_INFO,
        sample: fleet.http.listen.is_some(),
    };
    // Every file is read, and the listener bound, before anything connects (the pipelines
    // connect only when they run): a bad file or a taken port is a configuration failure (78)
    // first.
    let http = fleet.http.clone();
    let fleet = relay_runtime::Fleet::build(fleet, options).await?;
    if let Some(endpoints) = relay_console::Endpoints::bind(&http).await? {
        // Served while the pipelines drain, until the fleet's run has returned.
        endpoints.serve(fleet.view(), fleet.ended());
    }
    fleet.run(shutdown, reloads, fail_fast).await
}
