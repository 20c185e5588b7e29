//! Which pipelines of the configuration a command acts on: `--pipeline NAME`, the only one,
//! or (for `status`, `validate` and `setup`) each in turn.

use relay_runtime::fleet::{FleetConfig, PipelineEntry};

use crate::exit::Failure;

/// The pipeline `name` names, or the only one; a refused pipeline is refused with its reason.
pub fn one<'a>(fleet: &'a FleetConfig, name: Option<&str>) -> Result<&'a PipelineEntry, Failure> {
    if let Some(refused) = name.and_then(|n| fleet.refused.iter().find(|r| r.name == n)) {
        return Err(Failure::config(anyhow::anyhow!("{refused}")));
    }
    fleet.pipeline(name).map_err(Failure::config)
}

/// Runs `command` for the pipeline `name` names, or for every pipeline (each under a heading
/// in a fleet), then fails with the first failure, after the others ran. Refused pipelines
/// are failures too.
pub async fn each(
    fleet: &FleetConfig,
    name: Option<&str>,
    command: impl AsyncFn(&PipelineEntry) -> Result<(), Failure>,
) -> Result<(), Failure> {
    if name.is_some() || !fleet.is_fleet {
        return command(one(fleet, name)?).await;
    }
    let mut first = None;
    for entry in &fleet.pipelines {
        println!("== pipeline {} ({})", entry.name, entry.origin);
        if let Err(failure) = command(entry).await {
            eprintln!("pipeline `{}`: {failure}", entry.name);
            first.get_or_insert(failure);
        }
    }
    for refused in &fleet.refused {
        println!("== pipeline {} ({})", refused.name, refused.origin);
        println!("REFUSED  {}", refused.reason);
        first.get_or_insert_with(|| Failure::config(anyhow::anyhow!("{refused}")));
    }
    first.map_or(Ok(()), Err)
}
