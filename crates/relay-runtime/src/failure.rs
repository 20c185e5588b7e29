//! How a relay or a command stops on a fatal error: a [`Failure`] is the error with its
//! [`FailureKind`], which the binary maps to an exit code (sysexits, see `outbox-relay`'s
//! `exit` module). Server errors are classified by their kind and SQLSTATE
//! ([`PgError::is_data_safety_stop`], [`PgError::is_transient`]), never by message text.

use relay_core::pipeline::PipelineError;
use relay_core::stage::ErrorClass;
use relay_nats::NatsError;
use relay_postgres::PgError;

/// What kind of stop a [`Failure`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// `health`: the relay is not live/ready or does not answer.
    NotHealthy,
    /// Events may be lost if the relay went on: an operator must act.
    DataSafety,
    /// PostgreSQL or NATS could not be reached.
    Unavailable,
    /// A bug or an unexpected condition.
    Internal,
    /// The configuration or the servers' setup is wrong.
    Config,
    /// Stopped by a signal before the work was done (`backfill`: run it again to resume).
    Interrupted,
}

/// A fatal error and its kind.
#[derive(Debug)]
pub struct Failure {
    /// What kind of stop this is.
    pub kind: FailureKind,
    /// What happened, with context.
    pub error: anyhow::Error,
}

impl Failure {
    pub fn new(kind: FailureKind, error: impl Into<anyhow::Error>) -> Self {
        Self {
            kind,
            error: error.into(),
        }
    }
    pub fn config(error: impl Into<anyhow::Error>) -> Self {
        Self::new(FailureKind::Config, error)
    }
    pub fn internal(error: impl Into<anyhow::Error>) -> Self {
        Self::new(FailureKind::Internal, error)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

/// The exit of a NATS failure at start-up: unreachable or no stream is a retry (69), the rest
/// a configuration error (78).
pub fn nats_failure(error: NatsError) -> Failure {
    let kind = match error {
        NatsError::Connect { .. } | NatsError::Stream { .. } => FailureKind::Unavailable,
        _ => FailureKind::Config,
    };
    Failure::new(kind, error)
}

/// The exit of a PostgreSQL failure: a data-safety stop (65), transient (69), else the
/// configuration (78).
pub fn pg_failure(error: PgError) -> Failure {
    let kind = if error.is_data_safety_stop() {
        FailureKind::DataSafety
    } else if error.is_transient() {
        FailureKind::Unavailable
    } else {
        FailureKind::Config
    };
    Failure::new(kind, error)
}

/// The exit of an error class of a stage (a backfill, `restore`).
pub fn class_kind(class: ErrorClass) -> FailureKind {
    match class {
        ErrorClass::Transient | ErrorClass::SlotInUse => FailureKind::Unavailable,
        ErrorClass::Fatal => FailureKind::Config,
        ErrorClass::SlotLost => FailureKind::DataSafety,
    }
}

/// The exit of a pipeline that stopped on `error` (a backfill, `restore`).
pub fn pipeline_failure_kind(error: &PipelineError) -> FailureKind {
    match error {
        PipelineError::Route { .. } | PipelineError::Publish { .. } => FailureKind::DataSafety,
        PipelineError::Schema { .. } => FailureKind::Config,
        PipelineError::Source(e) => class_kind(e.class),
        PipelineError::Store { error, .. } => class_kind(error.class),
        PipelineError::Protocol(_) => FailureKind::Internal,
        PipelineError::AcksNotHeld { .. } => FailureKind::DataSafety,
    }
}
