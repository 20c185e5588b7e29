//! The relay as a library: [`Relay`] is everything one relay does for one slot (the
//! replication sessions, the background upkeep, cleanup, backfill at slot creation, its
//! telemetry, the publish strategy), built from its [`config::RelayConfig`] and owned by one
//! value. The `outbox-relay` binary parses the command line and the configuration, builds a
//! relay, serves its telemetry (relay-console: the `[http]` endpoints and the console), runs
//! it, maps its [`Failure`] to an exit code and prints. Nothing here serves HTTP.
//!
//! Also here, for the commands that act as the relay does: the broker connection
//! ([`broker`]), the table backfill ([`table_backfill`]) and the signals from SQL that start one
//! ([`signal`]), read-only looks at the slot and the
//! stream ([`inspect`]) and progress reporting ([`progress`]).

pub mod broker;
pub mod config;
pub mod failure;
pub mod files;
pub mod inspect;
pub mod position;
pub mod progress;
pub mod relay;
pub mod replay;
pub mod restore;
pub mod routing;
pub mod signal;
pub mod table_backfill;

pub use failure::{Failure, FailureKind};
pub use relay::{Relay, RelayOptions};
