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
