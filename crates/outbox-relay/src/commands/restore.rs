//! `outbox-relay restore --from-lsn X [--to-lsn Y] [--dry-run]`: publishes again, from the WAL
//! PostgreSQL still keeps for the relay's slot (`[relay] replay_retention`), the events
//! committed from `X` that the stream no longer holds. The restore itself is
//! [`relay_runtime::restore`], which the `restore` signal from SQL shares; see docs/replay.md.

use std::time::Duration;

use relay_core::Lsn;
use relay_runtime::restore::RestoreRequest;
use tokio_util::sync::CancellationToken;

use crate::exit::Failure;
use relay_runtime::config::RelayConfig;
use relay_runtime::progress::{self, Mode};

/// `outbox-relay restore`'s options.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// Restore the events committed at or after this commit LSN (e.g. 0/195D570). It must be
    /// at or after the slot's confirmed position: older WAL is no longer kept.
    #[arg(long, value_parser = super::position::parse_lsn)]
    pub from_lsn: Lsn,
    /// Stop before the events committed at or after this commit LSN (default and at most: the
    /// relay's stored checkpoint).
    #[arg(long, value_parser = super::position::parse_lsn)]
    pub to_lsn: Option<Lsn>,
    /// Decode and route the window, print what would be published; publish nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Messages published and not yet acknowledged by JetStream, at most.
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: usize,
    /// How often to print progress on stderr (not on a terminal, which shows a bar).
    #[arg(long, default_value = "5s", value_parser = relay_runtime::config::parse_duration)]
    pub progress_interval: Duration,
    /// `--log-format json`: progress lines even on a terminal.
    #[arg(skip)]
    pub log_json: bool,
}

/// Runs one restore.
pub async fn restore(config: &RelayConfig, args: RestoreArgs) -> Result<(), Failure> {
    let shutdown = CancellationToken::new();
    crate::signals::spawn_handler(
        shutdown.clone(),
        "stop requested: waiting for outstanding acks, then dropping the copy of the slot",
        "second signal: exiting now; the next restore drops the copy of the slot this one leaves",
    );
    let request = RestoreRequest {
        from_lsn: args.from_lsn,
        to_lsn: args.to_lsn,
        dry_run: args.dry_run,
        max_in_flight: args.max_in_flight,
        progress_interval: args.progress_interval,
        progress_mode: Mode::for_stderr(args.log_json),
        say: progress::stderr(),
        would_publish: None,
    };
    relay_runtime::restore::restore(config, &request, &shutdown).await?;
    Ok(())
}
