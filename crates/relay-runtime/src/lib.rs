//! The relay as a library: [`Relay`] is everything one relay does for one slot (the
//! replication sessions, the background upkeep, cleanup, backfill at slot creation, its
//! telemetry, the publish strategy), built from its [`config::RelayConfig`] and owned by one
//! value. The `outbox-relay` binary parses the command line and the configuration, builds a
//! relay, serves its telemetry (relay-console: the `[http]` endpoints and the console), runs
//! it, maps its [`Failure`] to an exit code and prints. Nothing here serves HTTP.
//!
//! Also here, because the running relay uses them and the commands act as it does: the
//! settings ([`config`]), the broker connection ([`broker`]), how a run fails ([`failure`]),
//! the router bound to the catalog ([`routing`]), the files read before connecting
//! ([`files`]), the table backfill ([`table_backfill`]: at slot creation, and by command), the
//! signals from SQL the relay carries out ([`signal`]) and what they start besides a backfill:
//! a replay ([`replay`], from where [`position`] finds an LSN or time in the stream) and a
//! restore ([`restore`]), read-only looks at the slot and the stream ([`inspect`], for the
//! sampler) and progress reporting ([`progress`]). The operations only the commands run are
//! relay-ops; what is served over HTTP is relay-console.

pub mod broker;
pub mod config;
pub mod failure;
pub mod files;
pub mod fleet;
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
pub use fleet::{Fleet, FleetConfig, FleetView};
pub use relay::{Relay, RelayOptions};
