//! `outbox-relay verify --from-lsn X [--to-lsn Y] [--json]`: whether every event committed in
//! the window is in the stream, checked against the WAL the slot still keeps
//! (`relay_runtime::restore::verify`). Exit 0: none missing; 65: a gap (the events named, and
//! the restore that brings them back); a window the slot keeps no WAL for fails saying what
//! could not be checked.

use relay_core::Lsn;
use relay_runtime::config::RelayConfig;
use relay_runtime::progress::{self, Mode};
use tokio_util::sync::CancellationToken;

use crate::exit::Failure;

/// `outbox-relay verify`'s options.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// Check the events committed at or after this commit LSN (e.g. 0/195D570). The slot must
    /// still keep WAL from it ([relay] replay_retention).
    #[arg(long, value_parser = super::position::parse_lsn)]
    pub from_lsn: Lsn,
    /// Stop before the events committed at or after this commit LSN (default and at most: the
    /// relay's stored checkpoint).
    #[arg(long, value_parser = super::position::parse_lsn)]
    pub to_lsn: Option<Lsn>,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// `--log-format json`: progress lines even on a terminal.
    #[arg(skip)]
    pub log_json: bool,
}

/// Checks the window and prints what is missing.
pub async fn verify(config: &RelayConfig, args: &VerifyArgs) -> Result<(), Failure> {
    let shutdown = CancellationToken::new();
    crate::signals::spawn_handler(
        shutdown.clone(),
        "stop requested: dropping the copy of the slot",
        "second signal: exiting now; the next verify or restore drops the copy of the slot",
    );
    let report = relay_runtime::restore::verify(
        config,
        args.from_lsn,
        args.to_lsn,
        Mode::for_stderr(args.log_json),
        progress::stderr(),
        &shutdown,
    )
    .await?;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::internal(anyhow::Error::new(e)))?;
        println!("{text}");
    } else if !report.checked {
        println!(
            "nothing to verify: the window from {} is empty",
            report.from
        );
    } else if report.missing.is_empty() {
        println!(
            "verified: every event committed in the window from {} is in stream {}",
            report.from, report.stream
        );
    } else {
        for missing in &report.missing {
            println!(
                "MISSING  {}  commit LSN {}",
                missing.event_id, missing.commit_lsn
            );
        }
    }
    report.verdict()
}
