//! A three-node JetStream cluster: R3 stream, leader stepdown, kill -9 and
//! restart of a node.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::ServerAddr;
use async_nats::jetstream::{self, stream};
use relay_testkit::{NatsCluster, stream_leader, stream_leader_stepdown};

/// Retries `f` for up to 20 s (elections answer "no responders" or time
/// out meanwhile).
async fn retry<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline => {
                eprintln!("{what}: {e:#} (retrying)");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.context(format!("{what}: still failing after 20 s"))),
        }
    }
}

async fn publish(js: &jetstream::Context, n: u32) -> anyhow::Result<()> {
    let payload = format!("event {n}");
    retry(&format!("publish {n}"), || async {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", n.to_string().as_str());
        let ack = js
            .publish_with_headers("orders.created", headers, payload.clone().into())
            .await?;
        let ack = tokio::time::timeout(Duration::from_secs(3), ack)
            .await
            .context("ack timed out")??;
        anyhow::ensure!(ack.stream == "ORDERS", "{ack:?}");
        Ok(())
    })
    .await
}

async fn leader(client: &async_nats::Client) -> anyhow::Result<String> {
    retry("stream leader", || async {
        stream_leader(client, "ORDERS")
            .await?
            .context("no stream leader yet")
    })
    .await
}

#[tokio::test]
async fn three_node_cluster_survives_kill9_and_stepdown() -> anyhow::Result<()> {
    let t = Instant::now();
    let mut cluster = NatsCluster::start(3).await?;
    eprintln!(
        "cluster {} of nats-server {} ready in {:?}",
        cluster.name(),
        cluster.nodes()[0].version(),
        t.elapsed()
    );
    assert_eq!(cluster.len(), 3);
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    assert_eq!(cluster.url(), urls.join(","));
    assert_eq!(cluster.node_index(cluster.server_name(2)), Some(2));
    let mut ports: Vec<u16> = cluster.nodes().iter().map(|n| n.port()).collect();
    ports.extend((0..3).map(|i| cluster.cluster_port(i)));
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 6, "ports are not distinct");

    let addrs = urls
        .iter()
        .map(|u| u.parse::<ServerAddr>())
        .collect::<Result<Vec<_>, _>>()?;
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(addrs)
        .await?;
    let js = jetstream::new(client.clone());
    let created = js
        .create_stream(stream::Config {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            storage: stream::StorageType::File,
            num_replicas: 3,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;
    assert_eq!(created.cached_info().config.num_replicas, 3);
    for n in 0..10 {
        publish(&js, n).await?;
    }

    // Step the leader down: another node leads.
    let first = leader(&client).await?;
    stream_leader_stepdown(&client, "ORDERS").await?;
    let second = retry("new leader", || async {
        let now = leader(&client).await?;
        anyhow::ensure!(now != first, "{now} still leads");
        Ok(now)
    })
    .await?;
    eprintln!("leader {first} stepped down, {second} leads");
    for n in 10..20 {
        publish(&js, n).await?;
    }

    // kill -9 the leader's node: publishing goes on.
    let victim = cluster
        .node_index(&second)
        .with_context(|| format!("unknown leader {second}"))?;
    let t = Instant::now();
    cluster.node(victim).kill9()?;
    for n in 20..30 {
        publish(&js, n).await?;
    }
    eprintln!(
        "published again {:?} after kill -9 of the leader",
        t.elapsed()
    );
    let third = leader(&client).await?;
    assert_ne!(third, second);

    // Restart it: the cluster is ready again, with all three peers.
    cluster.node(victim).start_again().await?;
    cluster.wait_ready(Duration::from_secs(30)).await?;
    for n in 30..40 {
        publish(&js, n).await?;
    }
    // A re-sent id is deduplicated by the stream.
    publish(&js, 5).await?;
    let messages = retry("stream info", || async {
        let mut stream = js.get_stream("ORDERS").await?;
        Ok(stream.info().await?.state.messages)
    })
    .await?;
    assert_eq!(messages, 40);

    // A stepdown of a missing stream reports the server's error.
    let err = stream_leader_stepdown(&client, "NO_SUCH_STREAM")
        .await
        .expect_err("stepdown of a missing stream");
    assert!(format!("{err:#}").contains("not found"), "{err:#}");
    Ok(())
}
