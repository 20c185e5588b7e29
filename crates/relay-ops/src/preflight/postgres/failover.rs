//! What a failover needs, on the primary and on each other host of `postgres.url`, and the
//! retention window: never failures, except `postgres.failover = true` on a server without
//! failover slots.

use relay_postgres::catalog::failover;
use relay_postgres::catalog::retention::{self, SHORT_SAMPLE, TakeoverPolicy};

use super::*;

/// After the catalog checks: failover on the primary, then on the standbys, then the retention
/// window (not measured on a standby).
pub(super) async fn failover_and_retention_checks(
    config: &RelayConfig,
    client: &Client,
    server: &PostgresSettings,
    r: &mut Report,
) {
    let in_recovery = match failover_checks(config, client, "", r).await {
        Ok(in_recovery) => in_recovery,
        Err(e) => {
            r.hinted(
                Verdict::Warn,
                "failover",
                format!("cannot read what failover needs: {e}"),
                "run the preflight again; the settings are in pg_settings and pg_replication_slots",
            );
            false
        }
    };
    standby_checks(config, server, r).await;
    if in_recovery {
        r.pass(
            "retention",
            "not measured on a standby (in recovery): run the preflight against the primary",
        );
        return;
    }
    if let Err(e) = retention_checks(config, client, r).await {
        r.hinted(
            Verdict::Warn,
            "retention",
            format!("cannot read the retention window: {e}"),
            "run the preflight again; the numbers are in pg_settings and pg_replication_slots",
        );
    }
}

/// What a failover needs (docs/operations.md, "Failover"), from `relay_postgres::catalog::failover`:
/// on a primary the slot's failover flag, `synchronized_standby_slots` and the standbys it sees;
/// on a standby (`pg_is_in_recovery()`) the settings slot synchronization needs and the
/// synchronized slot. Lines are named `failover …`, after `prefix` (a standby's address).
/// Returns whether the server is a standby.
async fn failover_checks(
    config: &RelayConfig,
    client: &Client,
    prefix: &str,
    r: &mut Report,
) -> Result<bool, tokio_postgres::Error> {
    let pg = &config.postgres;
    let facts = failover::facts(client, &pg.slot).await?;
    let database = catalog::current_database(client).await?;
    match failover::assess(&facts, pg.failover, &pg.slot, &database) {
        Ok(checks) => {
            for check in checks {
                r.assessed(format!("{prefix}failover {}", check.aspect.name()), check);
            }
        }
        // postgres.failover = true on a server without failover slots: `run` refuses it.
        Err(e) => r.fail(
            format!("{prefix}failover failover slot"),
            "postgres.failover = true, but this server has no failover slots",
            e.to_string(),
        ),
    }
    Ok(facts.in_recovery)
}

/// The other hosts of a multi-host `postgres.url`: each checked as a failover target (a
/// standby), as far as it can be reached. Never a failure: the relay runs on the primary.
async fn standby_checks(config: &RelayConfig, primary: &PostgresSettings, r: &mut Report) {
    let Ok(hosts) = config.postgres.each_host() else {
        return;
    };
    for host in hosts {
        let target = host.display_target();
        if target == primary.display_target() {
            continue;
        }
        let prefix = format!("{target}: ");
        match relay_postgres::connect(&host).await {
            Ok(client) => {
                if let Err(e) = failover_checks(config, &client, &prefix, r).await {
                    r.hinted(
                        Verdict::Warn,
                        format!("{prefix}failover"),
                        format!("cannot read what failover needs: {e}"),
                        "run the preflight against that server",
                    );
                }
            }
            Err(e) => r.hinted(
                Verdict::Warn,
                format!("{prefix}connection"),
                format!("{e}: {}", error_chain(&e)),
                "a host of postgres.url the relay would turn to after a failover is not reachable now; check it before you need it",
            ),
        }
    }
}

/// How long a stopped relay has before the slot is invalidated, at the WAL rate of a short
/// sample (docs/operations.md, "Retention window"): the numbers, then one line per aspect,
/// warnings with a hint. Never a failure: the relay can run, but an outage may cost the slot.
async fn retention_checks(
    config: &RelayConfig,
    client: &Client,
    r: &mut Report,
) -> Result<(), tokio_postgres::Error> {
    let policy = TakeoverPolicy {
        budget: config.relay.takeover_budget,
        standby_poll: config.relay.standby_poll_interval,
    };
    let window = retention::measure(client, &config.postgres.slot, SHORT_SAMPLE, policy).await?;
    r.pass("retention", window.numbers());
    for check in window.checks() {
        r.assessed(check.aspect.name(), check);
    }
    // The WAL kept for `outbox-relay restore` ([relay] replay_retention).
    let replay = relay_postgres::checkpoint::replay_window(client, &config.postgres.slot).await?;
    let setting = config
        .relay
        .replay_retention
        .map_or_else(|| "not set".to_owned(), |r| r.to_string());
    match replay.warning(config.relay.replay_retention_bytes()) {
        None => r.pass(
            "replay window",
            format!("replay_retention {setting}; {}", replay.summary()),
        ),
        Some((detail, hint)) => r.hinted(
            Verdict::Warn,
            "replay window",
            format!("{detail}; {}", replay.summary()),
            hint,
        ),
    }
    Ok(())
}
