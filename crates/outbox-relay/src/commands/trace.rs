//! `outbox-relay trace <event-id>`: the event's way from its outbox row to each consumer, each
//! step with what proves it (gathered by `relay_ops::trace`), as text or one JSON document.
//!
//! Exit code: 0 with an answer, whatever it found; 69 when PostgreSQL or NATS cannot be
//! reached; 78 for an event id that cannot be one.

use std::time::{Duration, SystemTime};

use relay_ops::trace::{Delivery, PublishStep, RowStep, Trace, TraceOptions};
use relay_runtime::config::RelayConfig;

use super::position::{parse_time, rfc3339};
use crate::exit::Failure;

/// `trace`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct TraceArgs {
    /// The event id: the row's event id column, the message's Nats-Msg-Id.
    pub event_id: String,
    /// Search the stream from this commit time (RFC 3339 or `15m ago`) when the row is gone or
    /// its time column is not a time.
    #[arg(long, value_parser = parse_time)]
    pub since: Option<SystemTime>,
    /// Read at most this many messages while searching the stream.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_scan: u64,
    /// Give up searching after this long (e.g. `30s`).
    #[arg(long, default_value = "30s", value_parser = relay_runtime::config::parse_duration)]
    pub timeout: Duration,
    /// The database of the consumers' ledger (outbox_consumer_ledger), when it is not the
    /// relay's.
    #[arg(long)]
    pub ledger_url: Option<String>,
    /// A dead-letter subject a consumer library parks messages on, besides each consumer's
    /// default `dlq.<consumer>` (repeat for several).
    #[arg(long = "parked-subject")]
    pub parked_subjects: Vec<String>,
    /// One JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Traces the event and prints its way.
pub async fn trace(config: &RelayConfig, args: &TraceArgs) -> Result<(), Failure> {
    let options = TraceOptions {
        since: args.since,
        max_scan: args.max_scan,
        timeout: args.timeout,
        ledger_url: args.ledger_url.clone(),
        parked_subjects: args.parked_subjects.clone(),
    };
    let trace = relay_ops::trace::trace(config, &args.event_id, &options).await?;
    if args.json {
        let doc = serde_json::to_value(&trace).map_err(Failure::internal)?;
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_text(&trace);
    }
    Ok(())
}

fn print_text(t: &Trace) {
    println!("event {}", t.event_id);
    print_row(&t.row);
    print_publish(&t.publish);
    print_consumers(t);
}

fn print_row(row: &RowStep) {
    match row {
        RowStep::Found {
            table,
            subject,
            route_error,
            time_unix_micros,
            headers,
            ..
        } => {
            let at = time_unix_micros
                .map(|us| {
                    let t = std::time::UNIX_EPOCH + Duration::from_micros(us.max(0) as u64);
                    format!(", created {}", rfc3339(t))
                })
                .unwrap_or_default();
            println!("  row: in {table}{at}");
            match (subject, route_error) {
                (Some(subject), _) => println!("    mapped to subject {subject}"),
                (None, Some(e)) => println!("    cannot be routed: {e}"),
                (None, None) => {}
            }
            for (name, value) in headers {
                println!("    header {name}: {value}");
            }
        }
        RowStep::Missing {
            searched,
            unreadable,
        } => {
            println!(
                "  row: no longer in the table (cleaned up, or never there); searched {}",
                if searched.is_empty() {
                    "no table".into()
                } else {
                    searched.join(", ")
                }
            );
            for u in unreadable {
                println!("    could not read {u}");
            }
        }
        RowStep::NotUnique { tables } => {
            println!(
                "  row: more than one row has this id ({}): the relay publishes the first, JetStream drops the others as duplicates",
                tables.join(", ")
            );
        }
    }
}

fn print_publish(publish: &PublishStep) {
    match publish {
        PublishStep::Published {
            sequence,
            subject,
            stored,
            searched,
        } => {
            println!("  published: stream sequence {sequence}, subject {subject}, stored {stored}");
            println!("    found reading {searched}");
        }
        PublishStep::DeadLettered {
            sequence,
            subject,
            stored,
            reason,
        } => {
            println!(
                "  dead-lettered: sequence {sequence} on {subject}, stored {stored}: {reason}"
            );
        }
        PublishStep::NotFound {
            searched,
            checkpoint,
            wal_past_checkpoint_bytes,
        } => {
            println!("  not published (as far as the search read): read {searched}");
            if let Some(c) = checkpoint {
                println!(
                    "    the relay's confirmed position is {c}, {} bytes of WAL behind the server: an event committed since is not published yet",
                    wal_past_checkpoint_bytes.unwrap_or_default()
                );
            }
        }
    }
}

fn print_consumers(t: &Trace) {
    for c in &t.consumers {
        let state = match &c.delivery {
            Delivery::Acknowledged => format!("acknowledged (ack floor {})", c.ack_floor),
            Delivery::InFlight {
                ack_pending,
                redelivered,
            } => format!(
                "in flight: delivered, not acknowledged ({ack_pending} awaiting an ack, {redelivered} redelivered)"
            ),
            Delivery::Parked {
                stream,
                subject,
                sequence,
                reason,
            } => {
                format!("parked: its copy is #{sequence} on {subject} (stream {stream}): {reason}")
            }
            Delivery::NotReached { sequences_before } => format!(
                "not reached yet: {sequences_before} stream sequences before it (delivered up to {})",
                c.delivered
            ),
        };
        println!("  consumer {}: {state}", c.name);
    }
    match &t.ledger {
        Ok(rows) if rows.is_empty() => println!("  ledger: no service recorded it as applied"),
        Ok(rows) => {
            for a in rows {
                println!(
                    "  ledger: applied by {} at {} (sequence {})",
                    a.consumer, a.applied_at, a.stream_seq
                );
            }
        }
        Err(e) => println!("  ledger: {e}"),
    }
}
