//! The console's cost: the relay's CPU per event under a steady load, with the console off and
//! with it on and open (a reader asking for the overview every second, five times as often as
//! the page refreshes, and for the latest events every five seconds), alternating runs on one
//! relay build in this run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::Args;
use crate::measure::{cpu_seconds, micros_per_event};

use super::latency::{Load, produce_load, wait_stored, warm_up};
use super::relay::{RelayProc, relay_config_full};
use super::say;
use super::setup::{Env, copy_slot, drop_slot, reset};

/// Events per second of the load.
pub const CONSOLE_RATE: u64 = 5_000;

/// One run of the load.
#[derive(Debug, Clone)]
pub struct ConsoleRun {
    pub console_open: bool,
    pub events: u64,
    pub relay_cpu_secs: f64,
    /// Console requests answered during the run.
    pub requests: u64,
}

impl ConsoleRun {
    pub fn cpu_us_per_event(&self) -> f64 {
        micros_per_event(self.relay_cpu_secs, self.events)
    }
}

/// `rounds` pairs of runs (off, then open), `secs` of load each.
pub(super) async fn console(env: &Env, args: &Args) -> Result<Vec<ConsoleRun>> {
    let secs = args.console_secs();
    if secs == 0 {
        return Ok(Vec::new());
    }
    say(format!(
        "== console: relay CPU per event at {CONSOLE_RATE}/s, console off vs open ({secs} s each, {} rounds)",
        args.rounds.max(2)
    ));
    let mut runs = Vec::new();
    for round in 0..args.rounds.max(2) {
        for open in [false, true] {
            let run = one_run(env, args, open, secs, round)
                .await
                .with_context(|| format!("console {} run", if open { "open" } else { "off" }))?;
            say(format!(
                "   console {}: {:.2} CPU µs/event ({} events, {:.2} CPU s, {} console requests)",
                if open { "open" } else { "off " },
                run.cpu_us_per_event(),
                run.events,
                run.relay_cpu_secs,
                run.requests
            ));
            runs.push(run);
        }
    }
    Ok(runs)
}

async fn one_run(env: &Env, args: &Args, open: bool, secs: u64, round: u32) -> Result<ConsoleRun> {
    reset(env).await?;
    let slot = format!("relay_console_{}{round}", if open { "on" } else { "off" });
    copy_slot(env, &slot).await?;
    let addr = format!("127.0.0.1:{}", relay_testkit::free_port());
    // Both runs serve /metrics and /status and sample alike; only the console differs.
    let http =
        format!("\n[http]\nlisten = \"{addr}\"\nconsole = {open}\nsample_interval = \"5s\"\n");
    let mif = args.max_in_flight.first().copied().unwrap_or(1024);
    let config = relay_config_full(env, &slot, mif, "", &http)?;
    let mut relay = RelayProc::start_config(env, &env.relay_bin, &config, &slot)?;
    let warm = warm_up(env, &mut relay, "outbox", "Order").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let reader = open.then(|| tokio::spawn(read_console(addr, stop.clone(), requests.clone())));
    let pid = relay.pid().to_string();
    let before = cpu_seconds(&pid).unwrap_or(f64::NAN);
    let (events, _) = produce_load(env, Load::steady(CONSOLE_RATE, secs, 2)).await?;
    // Until the relay stored the last of them: its CPU for exactly these events.
    wait_stored(env, &mut relay, warm + events).await?;
    let relay_cpu_secs = cpu_seconds(&pid).unwrap_or(f64::NAN) - before;
    stop.store(true, Ordering::Relaxed);
    if let Some(reader) = reader {
        reader.await??;
    }
    relay.stop().await?;
    drop_slot(env, &slot).await;
    Ok(ConsoleRun {
        console_open: open,
        events,
        relay_cpu_secs,
        requests: requests.load(Ordering::Relaxed),
    })
}

/// Asks for the overview every second and the latest events every fifth, until `stop`.
async fn read_console(addr: String, stop: Arc<AtomicBool>, requests: Arc<AtomicU64>) -> Result<()> {
    let mut tick = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let path = if tick % 5 == 4 {
            "/console/api/events?limit=50"
        } else {
            "/console/api/overview"
        };
        let (code, body) = relay_ops::client::get_text(&addr, path, Duration::from_secs(5)).await?;
        if code != 200 {
            bail!("{path} answered {code}: {body}");
        }
        requests.fetch_add(1, Ordering::Relaxed);
        tick += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}
