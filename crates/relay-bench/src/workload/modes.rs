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
use super::{LatencyRun, RelayRun, median_by, say};

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
    /// The relay's run per mode (the median round's with `--rounds`).
    pub runs: Vec<(PublishModeArg, ModeOutcome<RelayRun>)>,
    /// With `--compare-bin`: each mode's runs of both builds, round by round.
    pub compared: Vec<(PublishModeArg, ModeAb)>,
}

/// One mode's runs of the relay and of `--compare-bin` on the same backlog, one pair per round
/// (the two builds one right after the other).
#[derive(Debug, Default)]
pub struct ModeAb {
    pub relay: Vec<RelayRun>,
    pub compare: Vec<RelayRun>,
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
            let (runs, compared) =
                catch_up_per_mode(env, args, &server, mif, rows, inside_last).await;
            scenarios.push(ModeScenario {
                label,
                rows,
                per_tx,
                runs,
                compared,
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

/// One mode's runs of one backlog while they are made.
#[derive(Default)]
struct ModeRuns {
    mode: PublishModeArg,
    /// The relay's runs, one per round.
    runs: Vec<RelayRun>,
    /// The slot of the relay's last run (its log says whether it fell back).
    last_slot: String,
    failed: Option<String>,
    ab: ModeAb,
}

/// The catch-up of one backlog in each mode the server can do: `--rounds` rounds, in each the
/// relay then `--compare-bin` (if given) per mode. The relay's median round stands for the mode.
// Long: one measured run: set-up, the timed region and its readings in order, so what the figure
// includes reads in one place
async fn catch_up_per_mode(
    env: &Env,
    args: &Args,
    server: &str,
    mif: usize,
    rows: u64,
    inside_last: u64,
) -> (
    Vec<(PublishModeArg, ModeOutcome<RelayRun>)>,
    Vec<(PublishModeArg, ModeAb)>,
) {
    let mut outcomes = Vec::new();
    let mut ran: Vec<ModeRuns> = Vec::new();
    for &mode in &args.publish_modes {
        match mode.unsupported_on(server) {
            Some(why) => {
                say(format!("   {}: {why}", mode.as_config()));
                outcomes.push((mode, ModeOutcome::Skipped(why)));
            }
            None => ran.push(ModeRuns {
                mode,
                ..ModeRuns::default()
            }),
        }
    }
    let rounds = args.rounds.max(1);
    for round in 1..=rounds {
        if rounds > 1 {
            say(format!("   round {round} of {rounds}"));
        }
        for ModeRuns {
            mode,
            runs,
            last_slot,
            failed,
            ab,
        } in &mut ran
        {
            let nats = mode.nats_keys();
            let setup = CatchUpConfig {
                nats: &nats,
                ..Default::default()
            };
            let mut builds = vec![("", mode.variant(), &env.relay_bin)];
            if let Some(bin) = &args.compare_bin {
                builds.push((" (--compare-bin)", mode.compare_variant(), bin));
            }
            for (which, variant, bin) in builds {
                let caught_up =
                    relay_catch_up_with(env, bin, variant, mif, rows, inside_last, &setup).await;
                let CaughtUp { run, slot, .. } = match caught_up {
                    Ok(caught_up) => caught_up,
                    Err(e) => {
                        say(format!("   {}{which} failed: {e:#}", mode.as_config()));
                        failed.get_or_insert(format!("{e:#}"));
                        continue;
                    }
                };
                say(format!(
                    "   {}{which}: {:.0} events/s ({:.2} s), {:.2} CPU µs/event",
                    mode.as_config(),
                    run.events_per_s,
                    run.secs,
                    micros_per_event(run.cpu_secs, rows)
                ));
                if which.is_empty() {
                    runs.push(run.clone());
                    *last_slot = slot;
                    ab.relay.push(run);
                } else {
                    ab.compare.push(run);
                }
            }
        }
    }
    let mut compared = Vec::new();
    for ModeRuns {
        mode,
        runs,
        last_slot: slot,
        failed,
        ab,
    } in ran
    {
        let outcome = match (failed, median_by(runs, |r| r.secs)) {
            (None, Some(run)) => ModeOutcome::Ran {
                run,
                fell_back: fell_back(env, &slot),
            },
            (Some(e), _) => ModeOutcome::Failed(e),
            (None, None) => ModeOutcome::Failed("no run".into()),
        };
        outcomes.push((mode, outcome));
        if args.compare_bin.is_some() {
            compared.push((mode, ab));
        }
    }
    outcomes.sort_by_key(|(mode, _)| args.publish_modes.iter().position(|m| m == mode));
    (outcomes, compared)
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
