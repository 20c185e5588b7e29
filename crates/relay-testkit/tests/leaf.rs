//! The hub and leaf node pair: each JetStream answers in its own domain, and a client on the
//! leaf reaches the hub's through `$JS.hub.API`.

use relay_testkit::{HUB_DOMAIN, LEAF_DOMAIN, NatsLeafPair, nats_request};

#[tokio::test]
async fn a_client_on_the_leaf_reaches_the_hubs_jetstream_by_domain() -> anyhow::Result<()> {
    let pair = NatsLeafPair::start().await?;
    let (hub, leaf) = (pair.hub().port(), pair.leaf().port());
    assert_ne!(hub, leaf);
    // Each server's own JetStream is in its own domain.
    for (port, domain) in [(hub, HUB_DOMAIN), (leaf, LEAF_DOMAIN)] {
        let info = nats_request(port, "$JS.API.INFO", "").await?;
        assert!(info.contains(&format!("\"domain\":\"{domain}\"")), "{info}");
    }
    // A stream created from the leaf in the hub's domain is the hub's, not the leaf's.
    let created = nats_request(
        leaf,
        &format!("$JS.{HUB_DOMAIN}.API.STREAM.CREATE.EDGE"),
        r#"{"name":"EDGE","subjects":["edge.>"],"storage":"file"}"#,
    )
    .await?;
    assert!(!created.contains("\"error\""), "{created}");
    let on_leaf = nats_request(leaf, "$JS.API.STREAM.INFO.EDGE", "").await?;
    assert!(
        on_leaf.contains("\"error\""),
        "the leaf has no such stream: {on_leaf}"
    );
    // A message published on the leaf is stored by the hub, whose PubAck names its domain (the
    // stream's interest reaches the leaf shortly after the stream is created).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let ack = loop {
        match nats_request(leaf, "edge.a", "x").await {
            Ok(ack) => break ack,
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("not yet: {e:#}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    };
    assert!(
        ack.contains(&format!("\"domain\":\"{HUB_DOMAIN}\"")),
        "{ack}"
    );
    let on_hub = nats_request(hub, "$JS.API.STREAM.INFO.EDGE", "").await?;
    assert!(on_hub.contains("\"messages\":1"), "{on_hub}");
    Ok(())
}
