//! The PostgreSQL side of outbox-relay.
//!
//! Public API (everything else is private to the crate):
//! - connecting: [`PostgresSettings`] (the `[postgres]` section), [`connect`] and
//!   [`connect_primary`] (every session goes through the `connect` module), [`PgError`];
//! - [`bootstrap`]: checks `wal_level`, the outbox tables, the publication and the slot, creating
//!   the publication and slot only when allowed and only when that cannot skip events;
//! - [`catalog`]: the reads of PostgreSQL's catalog (server, role, tables, publication, slot)
//!   but those only the backfill or cleanup make, which are in their crates;
//! - [`checkpoint`]: the relay's durable progress in `outbox_relay.checkpoint` and where its
//!   events are in the stream (`outbox_relay.position_map`);
//! - [`PgSource`]: the replication stream (pgwire-replication, pgoutput v1) decoded by the
//!   `pgoutput` crate into [`relay_core::stage::SourceEvent`]s;
//! - [`session`]: the kept session and ticks of the periodic tasks beside the relay;
//! - [`age_column`]: the time a row's age counts from, read by the column's type (cleanup's
//!   `age_column` and the outbox tables' sampled age);
//! - [`sql`]: quoting, and the predicate of rows committed after a snapshot;
//! - small helpers other crates share: [`ShardSpec`], [`EmitFunctions`], [`SqlStateKind`],
//!   [`quote_relation`], [`redact_url`].
//!
//! Two concerns that build on this crate are crates of their own, which it never imports:
//! reading an outbox table's existing rows (the backfill, the filter check, signals from SQL) is
//! `relay-backfill`; trimming the outbox tables behind the checkpoint is `relay-cleanup`.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

pub mod age_column;
pub mod bootstrap;
pub mod catalog;
pub mod checkpoint;
mod connect;
mod emit_functions;
mod error;
mod publication_order;
mod server_version;
pub mod session;
mod settings;
mod shard;
mod source;
pub mod sql;
mod sqlstate;

/// Host, port, role, password and database of the URL (for messages and the replication session).
pub use connect::ConnectionParts;
/// Connects a plain session (on the read-write server when the URL lists several hosts).
pub use connect::connect;
/// Connects the read-write server and returns the settings bound to it.
pub use connect::connect_primary;
/// Connects a plain session whose `NOTIFY`s are handed over (for `LISTEN`).
pub use connect::{Notifications, connect_with_notifications};
/// Installs the `[[messages]]` SQL helpers unless they are there, and what it found.
pub use emit_functions::{EmitFunctions, ensure as ensure_emit_functions};
/// Failures of the PostgreSQL side outside the replication stream.
pub use error::PgError;
/// The `[postgres]` section of the configuration, the types of its fields, and URL redaction.
pub use settings::{FailoverSetting, PostgresSettings, SslMode, redact_url};
/// A relay's shard of a shared outbox, and what a server's row filters allow.
pub use shard::{RowFilterVerdict, ShardSpec, row_filters_unsupported};
/// The replication stream as a `ChangeSource`.
pub use source::{PgSource, WindowSource};
/// A schema-qualified relation name, quoted for SQL.
pub use sql::quote_relation;
/// What a server error means, by SQLSTATE class; whether a failed query may be retried.
pub use sqlstate::{SqlStateKind, is_transient_query_error};
