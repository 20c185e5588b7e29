//! `outbox-relay replay --from-lsn X | --since T --consumer NAME`: points a durable JetStream
//! consumer at the first stream sequence of the events committed from X (or T) on, so the
//! events are delivered again through the normal path (no WAL is read). `--dry-run` prints the
//! range and how many messages it holds. The replay itself is [`relay_runtime::replay`], which
//! the `replay` signal from SQL shares.

use std::time::SystemTime;

use outbox_position::Target;
use relay_core::Lsn;
use relay_runtime::replay::ReplayRequest;

use super::position::{Search, parse_lsn, parse_time};
use crate::exit::Failure;
use relay_runtime::config::RelayConfig;

/// Where the replay starts.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct From {
    /// Replay the events committed at or after this commit LSN (`0/16B3748`).
    #[arg(long, value_parser = parse_lsn)]
    pub from_lsn: Option<Lsn>,
    /// Replay the events committed at or after this time: RFC 3339 or `<duration> ago`.
    #[arg(long, value_parser = parse_time)]
    pub since: Option<SystemTime>,
}

/// `outbox-relay replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub from: From,
    /// End of the range `--dry-run` counts (exclusive): a commit LSN or a time. The consumer
    /// itself reads on past it: JetStream consumers have no end position.
    #[arg(long, value_parser = relay_runtime::position::parse_target)]
    pub until: Option<Target>,
    /// The durable consumer to reposition, or to create.
    #[arg(long)]
    pub consumer: String,
    /// Subject filters, comma-separated: of a consumer created here, of a re-created one
    /// (instead of its own; a consumer reset in place keeps its own), and of the count.
    #[arg(long, value_delimiter = ',')]
    pub subjects: Vec<String>,
    /// Print the range and the number of messages; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// On nats-server before 2.14 (no consumer reset API): delete and re-create an existing
    /// consumer, since its position cannot be changed in place there.
    #[arg(long)]
    pub yes: bool,
    #[command(flatten)]
    pub search: Search,
}

/// `outbox-relay replay`: prints the range, then what was done.
pub async fn replay(config: &RelayConfig, args: &ReplayArgs) -> Result<(), Failure> {
    let from = match (args.from.from_lsn, args.from.since) {
        (Some(lsn), _) => Target::Lsn(lsn),
        (None, Some(t)) => Target::Time(t),
        (None, None) => return Err(Failure::config(anyhow::anyhow!("--from-lsn or --since"))),
    };
    let request = ReplayRequest {
        from,
        until: args.until,
        consumer: args.consumer.clone(),
        subjects: args.subjects.clone(),
        dry_run: args.dry_run,
        recreate: args.yes,
        no_map: args.search.no_map,
        limits: args.search.limits(),
    };
    let done = relay_runtime::replay::replay(config, &request, |range| {
        for line in range.lines(&args.subjects) {
            println!("{line}");
        }
        for warning in range.from.warnings() {
            eprintln!("warning: {warning}");
        }
    })
    .await?;
    println!("{done}");
    Ok(())
}
