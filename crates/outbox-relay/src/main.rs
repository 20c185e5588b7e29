//! `outbox-relay`: PostgreSQL outbox table → NATS JetStream, without polling.
//!
//! Orchestration only: parse the command line, load the configuration, start logging, then hand
//! over to [`run`] (the relay), [`tail`] (read the stream back) or `validate`.

mod config;
mod exit;
mod run;
mod tail;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::RelayConfig;
use crate::exit::Exit;

/// Relays outbox-table inserts from PostgreSQL (logical replication, pgoutput) to NATS
/// JetStream. The replication slot is advanced only after JetStream acknowledged every event
/// before the new position: restarts may re-send (deduplicated by Nats-Msg-Id), never skip.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    /// TOML configuration file. Every key can be overridden by an environment variable
    /// RELAY_<SECTION>__<KEY>, e.g. RELAY_POSTGRES__URL, RELAY_POSTGRES__PASSWORD,
    /// RELAY_NATS__URL. Without a file, defaults plus environment are used.
    #[arg(long, short, global = true, env = "RELAY_CONFIG")]
    config: Option<PathBuf>,

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
    /// Run the relay (the default).
    Run {
        /// Start even though the slot's confirmed position is ahead of the stored checkpoint
        /// (events in between were confirmed without this relay publishing them). Use only
        /// after reconciling those events from the outbox table.
        #[arg(long)]
        accept_slot_position: bool,
    },
    /// Check the configuration without connecting, print it (secrets redacted) and exit.
    Validate,
    /// Print messages from the JetStream stream: subject, headers and payload.
    Tail {
        /// Stop after this many messages.
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// Stop after this long without a message (e.g. `10s`).
        #[arg(long, default_value = "10s", value_parser = humantime_duration)]
        idle_timeout: std::time::Duration,
    },
}

fn humantime_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime_serde::re::humantime::parse_duration(s).map_err(|e| e.to_string())
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let exit = try_main(cli);
    if let Err(exit) = &exit {
        exit.report();
    }
    match exit {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => exit.code(),
    }
}

fn try_main(cli: Cli) -> Result<(), Exit> {
    let config = RelayConfig::load(cli.config.as_deref()).map_err(Exit::config)?;
    let command = cli.command.unwrap_or(Command::Run {
        accept_slot_position: false,
    });
    if let Command::Validate = command {
        let text = serde_json::to_string_pretty(&redacted(&config))
            .map_err(|e| Exit::internal(anyhow::Error::new(e)))?;
        println!("{text}");
        eprintln!("configuration is valid");
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Exit::internal(anyhow::Error::new(e).context("cannot start the runtime")))?;
    runtime.block_on(async move {
        match command {
            Command::Run {
                accept_slot_position,
            } => run::run(config, accept_slot_position).await,
            Command::Tail {
                count,
                idle_timeout,
            } => tail::tail(&config, count, idle_timeout).await,
            Command::Validate => Ok(()),
        }
    })
}

/// The configuration with secrets replaced, for printing.
fn redacted(config: &RelayConfig) -> RelayConfig {
    let mut c = config.clone();
    c.postgres.url = relay_postgres::redact_url(&c.postgres.url);
    for secret in [
        &mut c.postgres.password,
        &mut c.nats.password,
        &mut c.nats.token,
    ] {
        if secret.is_some() {
            *secret = Some("<redacted>".into());
        }
    }
    c
}
