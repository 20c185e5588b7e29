//! Fault scenarios 15 and 22: a three-node NATS cluster with leader step-downs and a node kill,
//! and its stream leader killed under load.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::{config_via, in_mode, publish_mode, settle, started};
use crate::faults::oracle::*;
use crate::support::*;

/// 15. A three-node NATS cluster with an R3 stream: the stream leader steps down every few
/// seconds under load, and one node is killed and restarted. "No responders" during elections
/// is retried; lost 0, no duplicate in the stream.
#[tokio::test(flavor = "multi_thread")]
async fn s15_three_node_cluster_with_leader_stepdowns_and_a_node_kill() -> Result<()> {
    let (env, mut cluster, client, js, config) = r3_cluster().await?;
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 2, 20, Duration::from_millis(20)).await?;
    // Each step-down must move the leadership: the leader before and the one elected after.
    let mut moves = Vec::new();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        moves.push(step_down(&client).await);
    }
    let stepped = moves.iter().filter(|m| m.is_ok()).count();
    let victim = 2;
    cluster.node(victim).kill9()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.node(victim).start_again().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop().await;

    // Classify against the cluster: read through a client of the cluster.
    let committed = committed_ids(&env).await?;
    let (counts, stored) = read_settled(&js, &committed, "s15").await?;
    let mut v = Verdict::from_counts(
        "15 NATS cluster R3: stepdowns + node kill",
        &committed,
        &counts,
        false,
        &format!(
            "{stepped} leader step-downs that moved the leader, kill -9 of node {victim}; retries {}",
            relay.log().matches("re-publishing").count()
        ),
    );
    v.judge_order(&env.db().await?, &stored).await?;
    v.require(
        stepped == 4,
        format!("4 step-downs, each electing another leader: {moves:?}"),
    );
    require_conditions_by_sequence(&mut v, &cluster, &relay.log());
    v.assert_with_log(&relay.log());
    Ok(())
}

/// 22. A three-node NATS cluster with an R3 stream: the stream's leader is killed (-9) under
/// load three times, each time restarted after a new leader was elected. Messages the old
/// leader had not stored must not be overtaken by later ones the new leader stores: lost 0,
/// no duplicate, and each aggregate's events in commit order.
#[tokio::test(flavor = "multi_thread")]
async fn s22_cluster_stream_leader_killed_under_load() -> Result<()> {
    let (env, mut cluster, client, js, config) = r3_cluster().await?;
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 3, 20, Duration::from_millis(10)).await?;
    let mut killed = Vec::new();
    let mut misses = Vec::new();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        // After a restart the cluster may take a while to elect and answer on a loaded machine.
        let leader = match leader_within(&client, Duration::from_secs(20)).await {
            Ok(leader) => leader,
            Err(e) => {
                misses.push(e);
                continue;
            }
        };
        let Some(victim) = cluster.node_index(&leader) else {
            misses.push(format!("leader {leader} is no node of the cluster"));
            continue;
        };
        cluster.node(victim).kill9()?;
        killed.push(leader);
        // A new leader is elected among the other two while load goes on.
        tokio::time::sleep(Duration::from_secs(4)).await;
        cluster.node(victim).start_again().await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    load.stop().await;
    let committed = committed_ids(&env).await?;
    let (counts, stored) = read_settled(&js, &committed, "s22").await?;
    let log = relay.log();
    let mut v = Verdict::from_counts(
        "22 NATS cluster R3: stream leader kill -9 x3 under load",
        &committed,
        &counts,
        false,
        &format!(
            "leaders killed: {killed:?}; re-send rounds {}",
            log.matches("re-publishing").count()
        ),
    );
    v.judge_order(&env.db().await?, &stored).await?;
    v.require(
        killed.len() == 3,
        format!("three leaders killed: {killed:?}, not found: {misses:?}"),
    );
    v.require(
        log.contains("re-publishing"),
        "publishes failed at the kills and were sent again",
    );
    require_conditions_by_sequence(&mut v, &cluster, &log);
    v.assert_with_log(&log);
    Ok(())
}

/// On a replicated stream of a server where a refused event-id condition fails the stream,
/// the relay conditions by sequence (and says so), and only there.
fn require_conditions_by_sequence(
    v: &mut Verdict,
    cluster: &relay_testkit::NatsCluster,
    log: &str,
) {
    let node = &cluster.nodes()[0];
    let by_sequence = node.version_at_least(relay_nats::MSG_ID_CONDITION_FAILS_REPLICAS);
    v.require(
        log.contains("commit order kept by the stream's sequence") == by_sequence,
        format!(
            "conditions by sequence on nats-server {}: {by_sequence}",
            node.version()
        ),
    );
}

/// A test's servers: PostgreSQL and a three-node NATS cluster with the R3 stream (in the publish
/// mode of the run), a client of the cluster and the relay's config through it.
async fn r3_cluster() -> Result<(
    Env,
    relay_testkit::NatsCluster,
    async_nats::Client,
    async_nats::jetstream::Context,
    std::path::PathBuf,
)> {
    let env = Env::start().await?;
    let cluster = relay_testkit::NatsCluster::start(3).await?;
    let client = async_nats::ConnectOptions::new()
        .connect(
            cluster
                .urls()
                .iter()
                .map(|u| u.parse::<async_nats::ServerAddr>())
                .collect::<Result<Vec<_>, _>>()?,
        )
        .await?;
    let js = async_nats::jetstream::new(client.clone());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        num_replicas: 3,
        storage: async_nats::jetstream::stream::StorageType::File,
        allow_atomic_publish: publish_mode().as_deref() == Some("atomic-batch"),
        allow_batch_publish: publish_mode().as_deref() == Some("fast-batch"),
        ..Default::default()
    })
    .await?;
    let config = config_via(
        &env,
        &in_mode(env.config_full("", "")),
        env.pg.port(),
        &cluster.url(),
    )?;
    Ok((env, cluster, client, js, config))
}

/// Reads the stream through the cluster until every committed event is in it (or the settle
/// time passed): copies per event id, and the messages in stream order. A node that just
/// restarted may still be catching up: a failed read is retried.
async fn read_settled(
    js: &async_nats::jetstream::Context,
    committed: &std::collections::HashSet<String>,
    scenario: &str,
) -> Result<(std::collections::HashMap<String, usize>, Vec<Received>)> {
    let deadline = Instant::now() + settle();
    loop {
        let messages = match read_stream(js).await {
            Ok(messages) => messages,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{scenario}: reading the stream failed, retrying: {e:#}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut counts = std::collections::HashMap::<String, usize>::new();
        for m in &messages {
            *counts.entry(m.id().to_owned()).or_default() += 1;
        }
        if committed.iter().all(|id| counts.contains_key(id)) || Instant::now() > deadline {
            return Ok((counts, messages));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The stream's leader, asked until one answers within `wait`; or why none was found.
async fn leader_within(client: &async_nats::Client, wait: Duration) -> Result<String, String> {
    let deadline = Instant::now() + wait;
    loop {
        let last = match relay_testkit::stream_leader(client, STREAM).await {
            Ok(Some(leader)) => return Ok(leader),
            Ok(None) => "no leader".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            return Err(format!("no stream leader within {wait:?}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asks the stream's leader to step down and waits (10 s) until another node leads it: the
/// old and the new leader's server names, or what went wrong.
async fn step_down(client: &async_nats::Client) -> Result<(String, String), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last: String;
    // The leader now (none during an election; requests fail while there is none).
    let before = leader_within(client, Duration::from_secs(10))
        .await
        .map_err(|e| format!("before the step-down: {e}"))?;
    while let Err(e) = relay_testkit::stream_leader_stepdown(client, STREAM).await {
        if Instant::now() > deadline {
            return Err(format!("step-down of {before} refused: {e:#}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    loop {
        match relay_testkit::stream_leader(client, STREAM).await {
            Ok(Some(leader)) if leader != before => return Ok((before, leader)),
            Ok(leader) => last = format!("leader {leader:?}"),
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{before} stepped down, still no other leader: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
