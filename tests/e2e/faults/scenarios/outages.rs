//! Fault scenarios 4-7: NATS and PostgreSQL stopped, killed, restarted or cut off under load.

use std::time::Duration;

use anyhow::Result;

use super::{config_via, settle, started};
use crate::faults::oracle::*;
use crate::support::*;

/// 4. nats-server down for 30 s under load, then back: the relay waits with bounded memory,
/// keeps its replication session (keepalives answered), confirms nothing while NATS is down,
/// and resumes.
#[tokio::test(flavor = "multi_thread")]
async fn s04_nats_down_30s_under_load() -> Result<()> {
    let mut env = Env::start().await?;
    let config = env.config("");
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    wait_stream_count(&env, 300, Duration::from_secs(30)).await?;
    env.nats.stop().await?;
    // Acks already on the wire may still land; after that nothing may move.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let frozen = (env.checkpoint().await?, env.slot_confirmed().await?);
    let mut peak_rss = 0;
    for _ in 0..28 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak_rss = peak_rss.max(relay.rss_bytes());
        let now = (env.checkpoint().await?, env.slot_confirmed().await?);
        assert_eq!(now, frozen, "checkpoint/slot moved while NATS was down");
    }
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
    let sessions = relay.log().matches("replication started").count();
    v.note = format!(
        "nothing confirmed while down; peak RSS {} MB; replication sessions {}",
        peak_rss / (1 << 20),
        sessions
    );
    v.pass &= peak_rss < 128 << 20;
    v.assert();
    Ok(())
}

/// 5. nats-server kill -9 with publishes outstanding, under load.
#[tokio::test(flavor = "multi_thread")]
async fn s05_nats_kill9_with_publishes_outstanding() -> Result<()> {
    let mut env = Env::start().await?;
    let config = env.config("");
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    wait_stream_count(&env, 500, Duration::from_secs(30)).await?;
    env.nats.kill9()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.nats.start_again().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    load.stop().await;
    let v = classify(
        &env,
        "5 nats-server kill -9",
        false,
        settle(),
        "file storage; restart after 3 s",
    )
    .await?;
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
    let config = env.config("");
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
    let v = classify(
        &env,
        "6 PostgreSQL restart + crash",
        true,
        settle(),
        "dup allowed after a crash",
    )
    .await?;
    if !v.pass {
        eprintln!("{}", relay.log());
    }
    assert!(relay.log().contains("reconnecting"), "{}", relay.log());
    v.assert();
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
        &env.config(""),
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
    v.pass &= reconnected;
    v.assert();
    Ok(())
}
