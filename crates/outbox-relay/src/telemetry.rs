//! What the running relay knows about itself: the model, the metric families and the log rate
//! limiter are `relay_telemetry`'s (re-exported here); the build is the binary's own.

pub use relay_telemetry::*;

/// The relay's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the relay was built from (`build.rs`): 12 hex digits, `-dirty` with uncommitted
/// changes, or `unknown`.
pub const COMMIT: &str = env!("OUTBOX_RELAY_COMMIT");

/// What `--version` prints after the name: the version and the commit.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("OUTBOX_RELAY_COMMIT"),
    ")"
);

/// The build `/status` and `outbox_relay_build_info` show.
pub const BUILD_INFO: BuildInfo = BuildInfo {
    version: VERSION,
    commit: COMMIT,
};
