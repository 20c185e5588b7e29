//! Exit codes (sysexits) and how a fatal error is printed.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | clean shutdown |
//! | 1 | `health`: the relay is not live/ready or does not answer |
//! | 65 | data-safety stop: slot lost or invalidated, slot ahead of the checkpoint, a row that cannot be published |
//! | 69 | a dependency is unavailable: PostgreSQL or NATS unreachable at start-up |
//! | 70 | internal error |
//! | 78 | configuration error: bad file, missing table/publication/slot/stream, wal_level, a publication newer than the slot |
//! | 130 | `backfill` stopped by a signal before it finished (its cursor is stored: run it again) |

use std::process::ExitCode;

pub use relay_runtime::failure::{Failure, FailureKind, nats_failure, pg_failure};

/// The exit code of a failure of `kind`.
pub fn code(kind: FailureKind) -> u8 {
    match kind {
        FailureKind::NotHealthy => 1,
        FailureKind::DataSafety => 65,
        FailureKind::Unavailable => 69,
        FailureKind::Internal => 70,
        FailureKind::Config => 78,
        FailureKind::Interrupted => 130,
    }
}

/// Prints `error: …` and each cause on stderr, logs the stop, and gives the exit code.
pub fn report(failure: &Failure) -> ExitCode {
    eprintln!("error: {}", failure.error);
    for cause in failure.error.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
    let code = code(failure.kind);
    tracing::error!(exit_code = code, error = %format!("{:#}", failure.error), "outbox-relay stopped");
    ExitCode::from(code)
}
