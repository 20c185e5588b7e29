//! `outbox-relay replay --from-lsn X | --since T --consumer NAME`: points a durable JetStream
//! consumer at the first stream sequence of the events committed from X (or T) on, found as
//! `position` finds it, so the events are delivered again through the normal path (no WAL is
//! read). `--dry-run` prints the range and how many messages it holds.
//!
//! An existing consumer is moved in place where nats-server has the consumer reset API (2.14
//! and later): it keeps its configuration, name and creation time, and may be read meanwhile.
//! On older servers it is deleted and created again under the same name, with the same
//! configuration and the new start: only with `--yes` and only while nothing reads from it.
//! Either way never past a message it has not acknowledged.

use std::time::SystemTime;

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::{self, consumer};
use outbox_position::Target;
use relay_core::Lsn;
use relay_nats::{set_filters, skips_unacked};

use super::position::{Lookup, Search, lookup, parse_lsn, parse_time, rfc3339};
use crate::exit::{Failure, FailureKind};
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

/// An LSN or a time.
fn parse_bound(s: &str) -> Result<Target, String> {
    match parse_lsn(s) {
        Ok(lsn) => Ok(Target::Lsn(lsn)),
        Err(_) => parse_time(s).map(Target::Time),
    }
}

/// `outbox-relay replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub from: From,
    /// End of the range `--dry-run` counts (exclusive): a commit LSN or a time. The consumer
    /// itself reads on past it: JetStream consumers have no end position.
    #[arg(long, value_parser = parse_bound)]
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

fn unavailable(e: impl Into<anyhow::Error>) -> Failure {
    Failure::new(FailureKind::Unavailable, e)
}

/// Prints the range: where it starts, where it ends, how many messages.
async fn describe_range(
    config: &RelayConfig,
    js: &jetstream::Context,
    args: &ReplayArgs,
    from: &Lookup,
) -> Result<(), Failure> {
    let p = &from.position;
    let until = match args.until {
        Some(target) => Some(lookup(config, js, target, &args.search).await?),
        None => None,
    };
    let until_seq = until.as_ref().map(|u| u.position.sequence);
    let count = outbox_position::count(
        js,
        &config.nats.stream,
        p.sequence,
        until_seq,
        &args.subjects,
    )
    .await
    .map_err(unavailable)?;
    let first = match &p.found {
        Some(f) => format!(
            "sequence {} (event {}, commit LSN {}, committed {})",
            f.seq,
            f.event_id.as_deref().unwrap_or("-"),
            f.commit_lsn,
            f.commit_time.map(rfc3339).unwrap_or_default()
        ),
        None => format!("sequence {} (the next message stored)", p.sequence),
    };
    let last = match (&until, until_seq) {
        (Some(u), Some(seq)) => format!(
            "sequence {} (before the first message committed at or after {})",
            seq.saturating_sub(1).max(p.sequence.saturating_sub(1)),
            u.position.target
        ),
        _ => format!("the end of the stream (now sequence {})", p.stream_last),
    };
    let on = if args.subjects.is_empty() {
        String::new()
    } else {
        format!(" on {}", args.subjects.join(", "))
    };
    println!("replay of the events committed at or after {}", p.target);
    println!("  from {first}");
    println!("  to {last}: {count} messages{on}");
    println!("  {}", from.how());
    for warning in from.warnings() {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// `outbox-relay replay`.
// Long: the command's steps in order (connect, find the start, create the consumer, print); each
// needs the previous one's result
pub async fn replay(config: &RelayConfig, args: &ReplayArgs) -> Result<(), Failure> {
    let nats = relay_nats::connect(&config.nats)
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, e))?;
    let js = nats.jetstream().context().clone();
    let target = match (args.from.from_lsn, args.from.since) {
        (Some(lsn), _) => Target::Lsn(lsn),
        (None, Some(t)) => Target::Time(t),
        (None, None) => return Err(Failure::config(anyhow::anyhow!("--from-lsn or --since"))),
    };
    let from = lookup(config, &js, target, &args.search).await?;
    describe_range(config, &js, args, &from).await?;
    let start = from.position.sequence;
    let stream = js
        .get_stream(&config.nats.stream)
        .await
        .map_err(unavailable)?;
    let existing = match stream.consumer_info(&args.consumer).await {
        Ok(info) => Some(info),
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => None,
        Err(e) => return Err(unavailable(e)),
    };
    let name = &args.consumer;
    let Some(info) = existing else {
        if args.dry_run {
            println!(
                "dry run: consumer {name} does not exist; it would be created at sequence {start}"
            );
            return Ok(());
        }
        let mut created = consumer::Config {
            durable_name: Some(name.clone()),
            description: Some(format!("created by outbox-relay replay from {target}")),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ack_policy: consumer::AckPolicy::Explicit,
            // Like the consumer library: it counts deliveries and parks messages itself.
            max_deliver: -1,
            ..Default::default()
        };
        set_filters(&mut created, &args.subjects);
        stream.create_consumer(created).await.map_err(unavailable)?;
        println!("created durable consumer {name}: it delivers from sequence {start}");
        return Ok(());
    };
    let was = format!(
        "it had delivered up to sequence {}, ack floor {}",
        info.delivered.stream_sequence, info.ack_floor.stream_sequence
    );
    let skips =
        skips_unacked(&info, start).map(|why| format!("not repositioning consumer {name}: {why}"));
    let version = nats.client().server_info().version;
    let way = Way::for_server(&version);
    if args.dry_run {
        println!("consumer {name} exists ({was}); {}", way.would(start));
        for refusal in skips.iter().chain(&way.refusal(&info, args)) {
            println!("it would refuse now: {refusal}");
        }
        println!("dry run: nothing changed");
        return Ok(());
    }
    if let Some(why) = skips {
        return Err(Failure::new(FailureKind::DataSafety, anyhow::anyhow!(why)));
    }
    if let Some(why) = way.refusal(&info, args) {
        return Err(Failure::config(anyhow::anyhow!(why)));
    }
    match way {
        Way::InPlace { .. } => {
            let reset = relay_nats::reset_consumer(&js, &info.stream_name, name, start)
                .await
                .map_err(|e| reset_failed(e, &info, start))?;
            println!(
                "reset durable consumer {name} in place ({}; its configuration kept; {was}): it delivers from sequence {}",
                way.why(),
                reset.reset_seq
            );
        }
        Way::Recreate { .. } => {
            if !args.yes {
                println!("consumer {name} exists ({was}); {}", way.would(start));
                return Err(Failure::config(anyhow::anyhow!(
                    "consumer {name} on stream {} exists and {}: run again with --yes to delete and re-create it",
                    info.stream_name,
                    way.why()
                )));
            }
            relay_nats::recreate_consumer(&stream, &info, start, &args.subjects)
                .await
                .map_err(unavailable)?;
            println!(
                "deleted and re-created durable consumer {name} with its configuration ({}; {was}): it delivers from sequence {start}",
                way.why()
            );
        }
    }
    Ok(())
}

/// How an existing consumer is moved: reset in place where the server has the API, else deleted
/// and created again.
enum Way {
    InPlace { version: String },
    Recreate { version: String },
}

impl Way {
    fn for_server(version: &str) -> Self {
        let version = version.to_owned();
        if relay_nats::supports_consumer_reset(&version) {
            Way::InPlace { version }
        } else {
            Way::Recreate { version }
        }
    }

    /// Why this way, for the output.
    fn why(&self) -> String {
        match self {
            Way::InPlace { version } => format!("nats-server {version} has the consumer reset API"),
            Way::Recreate { version } => {
                format!("nats-server {version} has no consumer reset API (2.14 and later have it)")
            }
        }
    }

    /// What a run would do, for a dry run and the refusal without `--yes`.
    fn would(&self, start: u64) -> String {
        match self {
            Way::InPlace { .. } => format!(
                "{}, so replay would reset it in place, keeping its configuration, to deliver from sequence {start}",
                self.why()
            ),
            Way::Recreate { .. } => format!(
                "{}, so replay would delete it and create it again with the same configuration, delivering from sequence {start} (with --yes)",
                self.why()
            ),
        }
    }

    /// Why this way cannot be taken now, if it cannot.
    fn refusal(&self, info: &consumer::Info, args: &ReplayArgs) -> Option<String> {
        let name = &info.name;
        let stream = &info.stream_name;
        match self {
            Way::InPlace { .. } => (!args.subjects.is_empty()).then(|| {
                format!(
                    "consumer {name} on stream {stream} is reset in place, which keeps its subject filters: drop --subjects, or change its filters first (nats consumer edit {stream} {name} --filter ...)"
                )
            }),
            // Deleting a consumer under a running service races it.
            Way::Recreate { .. } => (info.num_waiting > 0 || info.push_bound).then(|| {
                format!(
                    "consumer {name} on stream {stream} is being read ({} pull requests waiting{}): stop the service that reads it first (pull requests expire within their timeout, 30 s for the consumer library), then run replay again",
                    info.num_waiting,
                    if info.push_bound { ", push subscription bound" } else { "" }
                )
            }),
        }
    }
}

/// The error of a refused or failed reset: names the consumer, the stream and the fix.
fn reset_failed(e: relay_nats::ConsumerResetError, info: &consumer::Info, start: u64) -> Failure {
    let (name, stream) = (&info.name, &info.stream_name);
    match &e {
        relay_nats::ConsumerResetError::Refused { .. } => {
            let policy = serde_json::to_value(&info.config)
                .ok()
                .and_then(|v| v.get("deliver_policy").cloned())
                .map(|v| v.to_string())
                .unwrap_or_default();
            Failure::config(anyhow::Error::new(e).context(format!(
                "consumer {name} on stream {stream} cannot be reset to sequence {start} (its deliver policy is {policy}; JetStream resets a consumer delivering all messages, or one by start sequence or time to a sequence at or after its start): delete it (nats consumer rm {stream} {name}) and run replay again, which creates it at sequence {start}"
            )))
        }
        relay_nats::ConsumerResetError::Request { .. } => unavailable(anyhow::Error::new(e).context(format!(
            "consumer {name} on stream {stream} was not reset; check that nats-server answers JetStream requests and run replay again"
        ))),
    }
}
