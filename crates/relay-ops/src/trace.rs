//! `outbox-relay trace <event-id>`: one event's way from its outbox row to each consumer, each
//! step with what proves it.
//!
//! 1. The row ([`row`]): which outbox table holds it, its columns, and the subject and headers
//!    today's mapping gives it; or that no table holds it (cleaned up, or never there).
//! 2. The stream ([`stream`]): the message with that `Nats-Msg-Id`, found by reading only the
//!    messages on the row's subject from where the row's time (its `[outbox.cleanup]
//!    age_column`, `created_at` by default, or `--since`) is in the stream (the position map,
//!    then the stream); else the relay's dead-letter subject; else "not yet published" with the
//!    relay's confirmed position.
//! 3. The consumers ([`consumers`]): each consumer of the stream whose filter covers the
//!    subject: acknowledged, parked (its copy in the consumer library's dead-letter subject),
//!    in flight or not yet reached; and the consumer libraries' ledger
//!    (`outbox_consumer_ledger`) where it is reachable: applied when, by which service.
//!
//! Every search is bounded (messages read, time); an answer that found nothing says what it
//! searched.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use relay_runtime::config::RelayConfig;
use relay_runtime::failure::{Failure, FailureKind};

pub mod consumers;
pub mod row;
pub mod stream;

pub use consumers::{Applied, ConsumerStep, Delivery};
pub use row::RowStep;
pub use stream::PublishStep;

/// How far a trace may search.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    /// Where the stream search starts (by commit time), when the row's time is not known.
    pub since: Option<SystemTime>,
    /// Messages the stream search reads at most.
    pub max_scan: u64,
    /// How long the whole trace may take.
    pub timeout: Duration,
    /// The consumers' ledger database, when it is not the relay's.
    pub ledger_url: Option<String>,
    /// Dead-letter subjects of the consumer libraries besides each consumer's default
    /// `dlq.<consumer>`.
    pub parked_subjects: Vec<String>,
}

/// One event's way.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    /// The event id traced.
    pub event_id: String,
    /// Its outbox row.
    pub row: RowStep,
    /// Its message.
    pub publish: PublishStep,
    /// Each consumer whose filter covers its subject (empty when it is not in the stream).
    pub consumers: Vec<ConsumerStep>,
    /// The ledger's rows for it, or why the ledger could not be read.
    pub ledger: Result<Vec<Applied>, String>,
}

/// An event id that cannot be one: empty, or with control characters (a header value cannot
/// hold them).
fn check_event_id(event_id: &str) -> Result<(), Failure> {
    if event_id.trim().is_empty() {
        return Err(Failure::config(anyhow::anyhow!(
            "the event id is empty: give the value of the row's event id column (the message's Nats-Msg-Id)"
        )));
    }
    if event_id.chars().any(char::is_control) {
        return Err(Failure::config(anyhow::anyhow!(
            "the event id {event_id:?} holds control characters, which no Nats-Msg-Id can: give the value of the row's event id column"
        )));
    }
    Ok(())
}

/// Traces `event_id`. PostgreSQL or NATS out of reach is a failure (unavailable); everything
/// else (no such row, no such message, a consumer deleted meanwhile) is part of the answer.
pub async fn trace(
    config: &RelayConfig,
    event_id: &str,
    options: &TraceOptions,
) -> Result<Trace, Failure> {
    check_event_id(event_id)?;
    let unavailable = |e: anyhow::Error| Failure::new(FailureKind::Unavailable, e);
    let client = relay_postgres::connect(&config.postgres)
        .await
        .map_err(|e| unavailable(e.into()))?;
    let nats = relay_nats::connect(&config.nats)
        .await
        .map_err(|e| unavailable(e.into()))?;
    let js = nats.jetstream().context().clone();
    let deadline = tokio::time::Instant::now() + options.timeout;

    let row = row::find(config, &client, event_id).await;
    let publish = stream::find(config, &client, &js, event_id, &row, options, deadline)
        .await
        .map_err(unavailable)?;
    let consumers = match &publish {
        PublishStep::Published {
            sequence, subject, ..
        } => {
            let parked = consumers::ParkedSearch {
                subjects: &options.parked_subjects,
                max_scan: options.max_scan,
                deadline,
            };
            let (stream, sequence) = (&config.nats.stream, *sequence);
            consumers::of_message(&js, stream, subject, sequence, event_id, &parked)
                .await
                .map_err(unavailable)?
        }
        _ => Vec::new(),
    };
    let ledger = consumers::ledger(&client, options.ledger_url.as_deref(), event_id).await;
    Ok(Trace {
        event_id: event_id.to_owned(),
        row,
        publish,
        consumers,
        ledger,
    })
}
