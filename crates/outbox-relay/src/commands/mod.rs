//! The operator commands besides `run` and `tail`: `validate --connect` (preflight), `setup`,
//! `status` and `config print`.

pub mod backfill;
pub mod config_print;
pub mod position;
pub(crate) mod progress;
pub mod replay;
pub mod restore;
pub mod setup;
pub mod status;
pub mod validate;

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
