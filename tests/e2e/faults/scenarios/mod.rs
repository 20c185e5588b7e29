//! Fault scenarios against the real relay, PostgreSQL and NATS. Numbers follow issue 3.
//!
//! * `crashes`: the relay killed or aborted (1-3, 14).
//! * `outages`: NATS or PostgreSQL down, restarted or cut off (4-7).
//! * `slots`: the replication slot: lag, standby takeover, lost or advanced slots, transaction
//!   shapes (8-13).
//! * `cluster`: a three-node NATS cluster (15).
//! * `failover`: the PostgreSQL primary killed and a standby promoted (17-19, issue 13).

mod cluster;
mod crashes;
mod failover;
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

async fn started(config: &std::path::Path, env: &[(&str, &str)]) -> Result<Relay> {
    let relay = Relay::start_with_env(config, &["run"], env)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
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
