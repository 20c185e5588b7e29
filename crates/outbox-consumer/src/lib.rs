//! Idempotent consumer for outbox-relay events.
//!
//! The relay delivers each outbox event to NATS JetStream at least once. This crate applies
//! each event **once** in a downstream service's PostgreSQL database: for every message it
//!
//! 1. begins a transaction,
//! 2. inserts `(service, event id)` into the ledger table (`ON CONFLICT DO NOTHING`),
//! 3. if the row already existed, skips the handler (a duplicate or a redelivery);
//!    otherwise calls the [`Handler`] with the open transaction and the typed [`Event`],
//! 4. commits, and only then acks the message.
//!
//! Handler errors roll back and NAK with bounded exponential backoff; after
//! [`ConsumerBuilder::max_deliver`] deliveries the message is parked on a dead-letter subject
//! (with the reason in `Outbox-Dlq-Reason`) and terminated, and later messages keep flowing.
//!
//! With [`ConsumerBuilder::validate_contracts`], an event whose `Outbox-Schema` header names
//! an event contract is checked against that contract (fetched from the relay's contracts KV
//! bucket) before the handler sees it; one that breaks it is parked instead of applied.
//!
//! ```no_run
//! use futures::FutureExt as _;
//! use outbox_consumer::{Consumer, handler_fn};
//!
//! # async fn demo(pg: tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let nats = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let jetstream = async_nats::jetstream::new(nats);
//! let handler = handler_fn(|tx, event| {
//!     async move {
//!         tx.execute("INSERT INTO seen (event_id) VALUES ($1)", &[&event.id]).await?;
//!         Ok(())
//!     }
//!     .boxed()
//! });
//! Consumer::builder(jetstream, pg, "billing")
//!     .stream("OUTBOX")
//!     .subjects(["outbox.Order.>"])
//!     .max_deliver(5)
//!     .dead_letter_subject("dlq.billing")
//!     .run(handler, async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! See `docs/consumers.md` for the crash windows, the ordering modes and ledger pruning.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

mod builder;
mod consumer;
mod contracts;
mod event;
mod handler;
mod ledger;
mod park;
mod shared;
mod stats;
mod worker;

pub use builder::ConsumerBuilder;
pub use consumer::Consumer;
pub use event::{
    Event, EventError, HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_COMMIT_LSN,
    HEADER_COMMIT_TIME, HEADER_EVENT_TYPE, HEADER_MSG_ID, HEADER_SCHEMA, HEADER_TABLE,
    HEADER_TRACEPARENT, HEADER_TX_INDEX, HEADER_XID, Lsn,
};
pub use handler::{BoxError, Handler, Permanent, handler_fn};
pub use ledger::{LEDGER_MIGRATION, LEDGER_TABLE, ensure_ledger, prune_ledger};
/// The wire contract shared with the relay (header names, dead-letter headers, the reserved
/// `Nats-*` headers, [`Lsn`]), re-exported so a service needs no second dependency for it.
pub use outbox_contract as contract;
pub use outbox_contract::{CONTRACTS_BUCKET, ParseLsnError};
/// Event contracts (JSON Schemas) as the relay compiles and checks them: [`schema::Limits`]
/// for [`ConsumerBuilder::contract_limits`], [`schema::Contract`] to check a payload yourself.
pub use outbox_schema as schema;
pub use park::{
    HEADER_DLQ_CONSUMER, HEADER_DLQ_DELIVERIES, HEADER_DLQ_EVENT_ID, HEADER_DLQ_REASON,
    HEADER_DLQ_SOURCE, HEADER_DLQ_SUBJECT, HEADER_ORIGINAL_PREFIX,
};
pub use shared::{Error, LedgerConnections, Ordering, Reapply, StartAt, hooks};
pub use stats::{ConsumerStats, StatsSnapshot};
