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

use relay_core::pipeline::PipelineError;
use relay_core::stage::ErrorClass;
use relay_nats::NatsError;
use relay_postgres::PgError;

/// Process exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// `health`: the relay is not live/ready or does not answer.
    NotHealthy = 1,
    /// Events may be lost if the relay went on: an operator must act.
    DataSafety = 65,
    /// PostgreSQL or NATS could not be reached.
    Unavailable = 69,
    /// A bug or an unexpected condition.
    Internal = 70,
    /// The configuration or the servers' setup is wrong.
    Config = 78,
    /// Stopped by a signal before the work was done (`backfill`: run it again to resume).
    Interrupted = 130,
}

/// A fatal error with its exit code.
#[derive(Debug)]
pub struct Exit {
    /// The exit code.
    pub kind: ExitKind,
    /// What happened, with context.
    pub error: anyhow::Error,
}

impl Exit {
    pub fn new(kind: ExitKind, error: impl Into<anyhow::Error>) -> Self {
        Self {
            kind,
            error: error.into(),
        }
    }
    pub fn config(error: impl Into<anyhow::Error>) -> Self {
        Self::new(ExitKind::Config, error)
    }
    pub fn internal(error: impl Into<anyhow::Error>) -> Self {
        Self::new(ExitKind::Internal, error)
    }

    /// Prints `error: …` and each cause on stderr.
    pub fn report(&self) {
        eprintln!("error: {}", self.error);
        for cause in self.error.chain().skip(1) {
            eprintln!("  caused by: {cause}");
        }
        tracing::error!(exit_code = self.kind as i32, error = %format!("{:#}", self.error), "outbox-relay stopped");
    }

    /// The process exit code.
    pub fn code(&self) -> ExitCode {
        ExitCode::from(self.kind as u8)
    }
}

/// The exit of a NATS failure at start-up: unreachable or no stream is a retry (69), the rest
/// a configuration error (78).
pub(crate) fn nats_exit(error: NatsError) -> Exit {
    let kind = match error {
        NatsError::Connect { .. } | NatsError::Stream { .. } => ExitKind::Unavailable,
        _ => ExitKind::Config,
    };
    Exit::new(kind, error)
}

/// The exit of a PostgreSQL failure: a data-safety stop (65), transient (69), else the
/// configuration (78).
pub(crate) fn pg_exit(error: PgError) -> Exit {
    let kind = if error.is_data_safety_stop() {
        ExitKind::DataSafety
    } else if error.is_transient() {
        ExitKind::Unavailable
    } else {
        ExitKind::Config
    };
    Exit::new(kind, error)
}

/// The exit of an error class of a stage (a backfill, `restore`).
pub(crate) fn class_kind(class: ErrorClass) -> ExitKind {
    match class {
        ErrorClass::Transient => ExitKind::Unavailable,
        ErrorClass::Fatal => ExitKind::Config,
        ErrorClass::SlotLost => ExitKind::DataSafety,
    }
}

/// The exit of a pipeline that stopped on `error` (a backfill, `restore`).
pub(crate) fn pipeline_exit_kind(error: &PipelineError) -> ExitKind {
    match error {
        PipelineError::Route { .. } | PipelineError::Publish { .. } => ExitKind::DataSafety,
        PipelineError::Schema { .. } => ExitKind::Config,
        PipelineError::Source(e) => class_kind(e.class),
        PipelineError::Store { error, .. } => class_kind(error.class),
        PipelineError::Protocol(_) => ExitKind::Internal,
    }
}
