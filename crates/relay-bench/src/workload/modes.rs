//! The publish-mode rows: catch-up of the same backlog per `[nats] publish_mode`, for
//! each transaction size, and commit-to-ack latency at a steady rate per mode.
//!
//! A mode the bench can run is one value of [`PublishModeArg`] (module `publish_mode`).

use anyhow::Result;

use crate::Args;
use crate::measure::micros_per_event;

use super::latency::latency_in_mode;
use super::publish_mode::PublishModeArg;
use super::relay::{CatchUpConfig, CaughtUp, relay_catch_up_with, relay_log};
use super::setup::{Env, reset, write_backlog};
use super::{LatencyRun, RelayRun, say};

/// What the relay logs when it cannot publish in the configured batch mode and publishes each
/// message on its own instead (relay-nats `with_publish_mode` and the in-run switch).
const FELL_BACK_LOG: &str = "publishing each message on its own";

/// One mode's run, or why there is none.
#[derive(Debug, Clone)]
pub enum ModeOutcome<T> {
    /// `fell_back`: the relay's log says it published per message after all.
    Ran {
        run: T,
        fell_back: bool,
    },
    Skipped(String),
    Failed(String),
}

/// One backlog shape, caught up once per mode.
#[derive(Debug)]
pub struct ModeScenario {
    pub label: String,
    pub rows: u64,
    pub per_tx: u64,
    pub runs: Vec<(PublishModeArg, ModeOutcome<RelayRun>)>,
}

/// The catch-up rows of every `--mode-tx-sizes` backlog, then the latency row of every mode.
pub(super) async fn modes(
    env: &Env,
    args: &Args,
) -> Result<(
    Vec<ModeScenario>,
    Vec<(PublishModeArg, ModeOutcome<LatencyRun>)>,
)> {
    let mut scenarios = Vec::new();
    let rows = args.mode_rows();
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    let server = env.nats.version();
    if rows > 0 && !args.publish_modes.is_empty() {
        for &per_tx in &args.mode_tx_sizes {
            let per_tx = per_tx.clamp(1, rows);
            let label = if per_tx >= rows {
                format!("1 tx of {rows} rows")
            } else {
                format!("{per_tx}-row txs")
            };
            say(format!("== publish modes, {label}: writing {rows} rows"));
            reset(env).await?;
            let (inside_last, _, write_secs) = write_backlog(env, rows, per_tx).await?;
            say(format!("   written in {write_secs:.1} s"));
            let mut runs = Vec::new();
            for &mode in &args.publish_modes {
                if let Some(why) = mode.unsupported_on(&server) {
                    say(format!("   {}: {why}", mode.as_config()));
                    runs.push((mode, ModeOutcome::Skipped(why)));
                    continue;
                }
                let setup = CatchUpConfig {
                    nats: &mode.nats_keys(),
                    ..Default::default()
                };
                let bin = &env.relay_bin;
                let variant = mode.variant();
                let caught_up =
                    relay_catch_up_with(env, bin, variant, mif, rows, inside_last, &setup).await;
                let outcome = match caught_up {
                    Ok(CaughtUp { run, slot, .. }) => {
                        say(format!(
                            "   {}: {:.0} events/s ({:.2} s), {:.2} CPU µs/event",
                            mode.as_config(),
                            run.events_per_s,
                            run.secs,
                            micros_per_event(run.cpu_secs, rows)
                        ));
                        ModeOutcome::Ran {
                            run,
                            fell_back: fell_back(env, &slot),
                        }
                    }
                    Err(e) => {
                        say(format!("   {} failed: {e:#}", mode.as_config()));
                        ModeOutcome::Failed(format!("{e:#}"))
                    }
                };
                runs.push((mode, outcome));
            }
            scenarios.push(ModeScenario {
                label,
                rows,
                per_tx,
                runs,
            });
        }
    }
    let mut latency = Vec::new();
    let rate = args.mode_latency_rate;
    if rate > 0 && rows > 0 {
        for &mode in &args.publish_modes {
            say(format!(
                "== latency, publish_mode {}: commit to ack at {rate}/s",
                mode.as_config()
            ));
            if let Some(why) = mode.unsupported_on(&server) {
                latency.push((mode, ModeOutcome::Skipped(why)));
                continue;
            }
            let outcome = match latency_in_mode(env, args, mode, &[rate]).await {
                Ok((mut runs, _)) if !runs.is_empty() => ModeOutcome::Ran {
                    run: runs.remove(0),
                    fell_back: fell_back(env, &format!("relay_latency{}", mode.variant())),
                },
                Ok(_) => ModeOutcome::Failed("no latency run".into()),
                Err(e) => {
                    say(format!("   failed: {e:#}"));
                    ModeOutcome::Failed(format!("{e:#}"))
                }
            };
            latency.push((mode, outcome));
        }
    }
    Ok((scenarios, latency))
}

/// Whether the relay run named `name` logged that it published per message instead.
fn fell_back(env: &Env, name: &str) -> bool {
    std::fs::read_to_string(relay_log(env, name)).is_ok_and(|log| log.contains(FELL_BACK_LOG))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_emit_and_slots_part_is_on_by_default_and_off_with_an_empty_list() {
        use clap::Parser as _;
        let default = crate::Args::try_parse_from(["relay-bench"]).unwrap();
        assert_eq!(
            default.publish_modes,
            [
                PublishModeArg::PerMessage,
                PublishModeArg::AtomicBatch,
                PublishModeArg::FastBatch
            ]
        );
        assert_eq!(default.mode_tx_sizes, [1, 100, 10_000]);
        assert_eq!(default.message_tx_sizes, [1, 100]);
        assert_eq!(default.slot_counts, [1, 2, 4]);
        assert_eq!(default.mode_rows(), 100_000);
        let quick = crate::Args::try_parse_from(["relay-bench", "--quick"]).unwrap();
        assert_eq!(quick.mode_rows(), 10_000);
        let off = crate::Args::try_parse_from([
            "relay-bench",
            "--publish-modes",
            "--message-tx-sizes",
            "--slot-counts",
        ])
        .unwrap();
        assert!(off.publish_modes.is_empty());
        assert!(off.message_tx_sizes.is_empty());
        assert!(off.slot_counts.is_empty());
        let one = crate::Args::try_parse_from(["relay-bench", "--publish-modes", "atomic-batch"])
            .unwrap();
        assert_eq!(one.publish_modes, [PublishModeArg::AtomicBatch]);
    }
}
