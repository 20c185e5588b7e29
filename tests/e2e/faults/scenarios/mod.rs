//! Fault scenarios against the real relay, PostgreSQL and NATS. Numbers follow docs/guarantees.md's scenario table.
//!
//! * `crashes`: the relay killed or aborted (1-3, 14).
//! * `outages`: NATS or PostgreSQL down, restarted or cut off (4-7).
//! * `slots`: the replication slot: lag, standby takeover, lost or advanced slots, transaction
//!   shapes (8-13).
//! * `cluster`: a three-node NATS cluster: step-downs and a node kill (15), the stream
//!   leader killed under load (22).
//! * `full`: the stream full under load, then its limit raised (20), with a relay kill while
//!   full (21).
//! * `failover`: the PostgreSQL primary killed and a standby promoted (17-19).

mod cluster;
mod crashes;
mod failover;
mod full;
mod outages;
mod slots;

use std::time::Duration;

use anyhow::Result;

use crate::support::*;

const SETTLE: Duration = Duration::from_secs(60);

/// `FAULT_SOAK=1` (scripts/soak.sh): heavier load and longer settling for the same scenarios.
fn soak() -> bool {
    std::env::var_os("FAULT_SOAK").is_some_and(|v| v == "1")
}

fn settle() -> Duration {
    if soak() {
        Duration::from_secs(600)
    } else {
        SETTLE
    }
}

/// `FAULT_PUBLISH_MODE` (`atomic-batch` or `fast-batch`; scripts/soak.sh with `FAULT_MODES`): every
/// scenario's relay publishes in that `[nats] publish_mode`, and the report names it.
pub(crate) fn publish_mode() -> Option<String> {
    std::env::var("FAULT_PUBLISH_MODE")
        .ok()
        .filter(|m| !m.is_empty() && m != "per-message")
}

/// `FAULT_PUBLISH_PATH` (`async-nats`; scripts/soak.sh with `FAULT_PATHS`): every scenario's
/// relay publishes through that `[nats] publish_path`, and the report names it.
pub(crate) fn publish_path() -> Option<String> {
    std::env::var("FAULT_PUBLISH_PATH")
        .ok()
        .filter(|p| !p.is_empty() && p != "lean")
}

/// How a run in another mode or path names its rows (`atomic-batch`, `async-nats`,
/// `atomic-batch, async-nats`), `None` for the defaults.
pub(crate) fn run_name() -> Option<String> {
    let parts: Vec<String> = publish_mode().into_iter().chain(publish_path()).collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// `path`, a relay config, in the publish mode of [`publish_mode`] and the path of
/// [`publish_path`] (added to its `[nats]` section).
fn in_mode(path: std::path::PathBuf) -> std::path::PathBuf {
    let mut lines = String::new();
    if let Some(mode) = publish_mode() {
        lines.push_str(&format!("publish_mode = \"{mode}\"\n"));
    }
    if let Some(publish_path) = publish_path() {
        lines.push_str(&format!("publish_path = \"{publish_path}\"\n"));
    }
    if !lines.is_empty() {
        let text = std::fs::read_to_string(&path).expect("reading a test config");
        let text = text.replacen("[nats]\n", &format!("[nats]\n{lines}"), 1);
        std::fs::write(&path, text).expect("writing a test config");
    }
    path
}

/// [`Env::config_full`] with stream creation on, in the publish mode of [`publish_mode`].
fn config_in_mode(env: &Env, nats_extra: &str, extra: &str) -> std::path::PathBuf {
    in_mode(env.config_full(&format!("create_stream = true\n{nats_extra}"), extra))
}

/// `env.config(extra)` in the publish mode of [`publish_mode`].
fn fault_config(env: &Env, extra: &str) -> std::path::PathBuf {
    in_mode(env.config(extra))
}

/// The checkpoint and the slot's confirmed position once they held still for 2 s, or as they
/// are after 10 s.
pub(crate) async fn positions_at_rest(env: &Env) -> Result<(Option<u64>, Option<u64>)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut last = (env.checkpoint().await?, env.slot_confirmed().await?);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = (env.checkpoint().await?, env.slot_confirmed().await?);
        if now == last || std::time::Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

async fn started(config: &std::path::Path, env: &[(&str, &str)]) -> Result<Relay> {
    let relay = Relay::start_with_env(config, &["run"], env)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    // A run in a publish mode proves the relay took it (it falls back where it cannot).
    let took = match publish_mode().as_deref() {
        Some("atomic-batch") => Some("publishing each transaction as one atomic batch"),
        Some("fast-batch") => Some("publishing in fast batches (one flow ack for many messages)"),
        _ => None,
    };
    if let Some(line) = took {
        let waited = relay.wait_log(line, Duration::from_secs(5)).await;
        // Fast batches are not used on a replicated stream of 2.14+ (docs/guarantees.md,
        // "Commit order"): the relay says so instead, and the cluster scenarios check why.
        let fell_back = publish_mode().as_deref() == Some("fast-batch")
            && relay
                .log()
                .contains("does not keep commit order on a replicated stream");
        if !fell_back {
            waited?;
        }
    }
    if publish_path().as_deref() == Some("async-nats") {
        relay
            .wait_log(
                "publishing through async-nats ([nats] publish_path",
                Duration::from_secs(5),
            )
            .await?;
    }
    Ok(relay)
}

/// Rewrites a config file so the relay reaches PostgreSQL and NATS through other addresses.
fn config_via(
    env: &Env,
    config: &std::path::Path,
    pg_port: u16,
    nats_url: &str,
) -> Result<std::path::PathBuf> {
    let text = std::fs::read_to_string(config)?
        .replace(
            &format!("127.0.0.1:{}/", env.pg.port()),
            &format!("127.0.0.1:{pg_port}/"),
        )
        .replace(&env.nats.url(), nats_url);
    let path = config.with_extension("via.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}
