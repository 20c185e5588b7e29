//! The operator commands besides `run` and `tail`: `validate --connect` (preflight), `setup`,
//! `status` and `config print`.

pub mod backfill;
pub mod config_print;
pub mod position;
pub mod replay;
pub mod restore;
pub mod setup;
pub mod status;
pub mod validate;

use std::time::Duration;

use relay_core::pipeline::PipelineError;
use relay_core::stage::ErrorClass;

use crate::exit::ExitKind;

/// The exit of an error class of a stage (`backfill`, `restore`).
pub(crate) fn class_kind(class: ErrorClass) -> ExitKind {
    match class {
        ErrorClass::Transient => ExitKind::Unavailable,
        ErrorClass::Fatal => ExitKind::Config,
        ErrorClass::SlotLost => ExitKind::DataSafety,
    }
}

/// The exit of a pipeline that stopped on `error` (`backfill`, `restore`).
pub(crate) fn pipeline_exit_kind(error: &PipelineError) -> ExitKind {
    match error {
        PipelineError::Route { .. } | PipelineError::Publish { .. } => ExitKind::DataSafety,
        PipelineError::Schema { .. } => ExitKind::Config,
        PipelineError::Source(e) => class_kind(e.class),
        PipelineError::Store { error, .. } => class_kind(error.class),
        PipelineError::Protocol(_) => ExitKind::Internal,
    }
}

/// Prints `line()` every `every` (at least 100 ms; the first after one interval) until the
/// handle is aborted: the progress lines of `backfill` and `restore`.
pub(crate) fn spawn_progress(
    every: Duration,
    line: impl Fn() + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
        tick.tick().await;
        loop {
            tick.tick().await;
            line();
        }
    })
}
