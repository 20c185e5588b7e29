//! Fault scenarios 4-7: NATS and PostgreSQL stopped, killed, restarted or cut off under load.

use std::time::Duration;

use anyhow::Result;

use super::{config_via, fault_config, settle, started};
use crate::faults::oracle::*;
use crate::support::*;

const OUTSTANDING: &str = "outbox_relay_outstanding_acks";

/// 4. nats-server down for 30 s under load, then back: the relay waits with bounded memory,
/// keeps its replication session (keepalives answered), confirms nothing while NATS is down,
/// and resumes.
#[tokio::test(flavor = "multi_thread")]
async fn s04_nats_down_30s_under_load() -> Result<()> {
    let mut env = Env::start().await?;
    let (http, addr) = http_listen();
    let config = fault_config(&env, &http);
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    wait_stream_count(&env, 300, Duration::from_secs(30)).await?;
    let walsender = env.slot_active_pid().await?;
    env.nats.stop().await?;
    // Acks already on the wire may still land (later on a loaded machine): the positions are
    // frozen once they held for 2 s, or after 10 s; after that nothing may move.
    let frozen = super::positions_at_rest(&env).await?;
    // Something to hold back: publishes the relay made and NATS never acknowledged.
    let outstanding = metric(&addr, OUTSTANDING).await?;
    let mut peak_rss = 0;
    for _ in 0..28 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak_rss = peak_rss.max(relay.rss_bytes());
        let now = (env.checkpoint().await?, env.slot_confirmed().await?);
        assert_eq!(now, frozen, "checkpoint/slot moved while NATS was down");
    }
    let walsender_down = env.slot_active_pid().await?;
    env.nats.start_again().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop().await;
    let mut v = classify(
        &env,
        "4 nats-server down 30 s",
        false,
        Duration::from_secs(90),
        "",
    )
    .await?;
    let walsender_after = env.slot_active_pid().await?;
    let sessions = relay.log().matches("replication started").count();
    v.note = format!(
        "nothing confirmed while down with {outstanding} publishes outstanding; peak RSS {} MB; replication sessions {sessions}; walsender pid {walsender:?}",
        peak_rss / (1 << 20),
    );
    v.pass &= peak_rss < 128 << 20;
    v.require(
        outstanding > 0.0,
        "publishes outstanding while NATS was down",
    );
    v.require(
        walsender.is_some() && walsender_down == walsender && walsender_after == walsender,
        format!(
            "one replication session: walsender pid {walsender:?} before, {walsender_down:?} at the end of the outage, {walsender_after:?} after"
        ),
    );
    v.require(sessions == 1, "one replication session (log)");
    v.assert();
    Ok(())
}

/// 5. nats-server kill -9 with publishes outstanding, under load.
#[tokio::test(flavor = "multi_thread")]
async fn s05_nats_kill9_with_publishes_outstanding() -> Result<()> {
    let mut env = Env::start().await?;
    let (http, addr) = http_listen();
    let config = fault_config(&env, &http);
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    wait_stream_count(&env, 500, Duration::from_secs(30)).await?;
    // Acks from a running server take a millisecond: stop it first (SIGSTOP, it answers
    // nothing), so the kill lands while the relay's publishes are certainly outstanding.
    env.nats.pause()?;
    let outstanding = wait_metric(&addr, OUTSTANDING, Duration::from_secs(10), |n| n > 0.0)
        .await
        .unwrap_or(0.0);
    env.nats.kill9()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.nats.start_again().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    load.stop().await;
    let mut v = classify(
        &env,
        "5 nats-server kill -9",
        false,
        settle(),
        &format!(
            "file storage; {outstanding} publishes outstanding at the kill; restart after 3 s"
        ),
    )
    .await?;
    v.require(outstanding > 0.0, "publishes outstanding at the kill");
    if !v.pass {
        eprintln!("{}", relay.log());
    }
    v.assert();
    Ok(())
}

/// 6. PostgreSQL fast restart, then crash (-m immediate), under load.
#[tokio::test(flavor = "multi_thread")]
async fn s06_postgres_restart_and_crash_under_load() -> Result<()> {
    let mut env = Env::start().await?;
    let config = fault_config(&env, "");
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.pg.stop().await?;
    env.pg.start_again().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.pg.crash().await?;
    env.pg.start_again().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop().await;
    // A new replication session after the restart and after the crash.
    let sessions = relay.log().matches("replication started").count();
    let mut v = classify(
        &env,
        "6 PostgreSQL restart + crash",
        true,
        settle(),
        &format!("dup allowed after a crash; replication sessions {sessions}"),
    )
    .await?;
    v.require(
        sessions >= 3,
        "the relay reconnected after the restart and after the crash",
    );
    v.assert_with_log(&relay.log());
    Ok(())
}

/// 7. Network blackholes (a TCP proxy holding every byte): to PostgreSQL for longer than
/// `wal_sender_timeout` (10 s here), then to NATS. Detected by timeouts (the server's
/// wal_sender_timeout; the relay's ack timeout), recovered when the network heals; lost 0.
#[tokio::test(flavor = "multi_thread")]
async fn s07_network_blackholes_to_postgres_and_nats() -> Result<()> {
    let env = Env::start().await?;
    let pg_proxy = relay_testkit::FaultProxy::start(([127, 0, 0, 1], env.pg.port()).into()).await?;
    let nats_proxy =
        relay_testkit::FaultProxy::start(([127, 0, 0, 1], env.nats.port()).into()).await?;
    let config = config_via(
        &env,
        &fault_config(&env, ""),
        pg_proxy.port(),
        &format!("nats://127.0.0.1:{}", nats_proxy.port()),
    )?;
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    wait_stream_count(&env, 200, Duration::from_secs(30)).await?;

    pg_proxy.set_blackhole(true);
    tokio::time::sleep(Duration::from_secs(15)).await;
    pg_proxy.set_blackhole(false);
    let reconnected = relay
        .wait_log("reconnecting", Duration::from_secs(30))
        .await
        .is_ok();
    // Publishing again through the new session before NATS is cut off (its start-up reads the
    // stream, which the NATS blackhole would hold instead of the publishes).
    let before = stream_count(&env.jetstream().await?).await?;
    let flowing = wait_stream_count(&env, before + 100, Duration::from_secs(30))
        .await
        .is_ok();

    nats_proxy.set_blackhole(true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    nats_proxy.set_blackhole(false);
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop().await;
    let mut v = classify(
        &env,
        "7 blackhole PostgreSQL 15 s, NATS 10 s",
        false,
        settle(),
        "",
    )
    .await?;
    v.note = format!(
        "replication session re-established after the PostgreSQL blackhole: {reconnected}; publish retries: {}",
        relay.log().matches("re-publishing").count()
    );
    v.require(
        reconnected && flowing,
        "replication session re-established and publishing after the PostgreSQL blackhole",
    );
    v.require(
        relay.log().contains("re-publishing"),
        "publishes timed out and were retried during the NATS blackhole",
    );
    v.assert();
    Ok(())
}
