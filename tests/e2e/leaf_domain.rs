//! `[nats] domain`: the relay connected to a leaf node publishes into a stream of the hub's
//! JetStream domain, and refuses an acknowledgement from any other domain.

use std::time::Duration;

use anyhow::Result;
use async_nats::jetstream;
use relay_testkit::{HUB_DOMAIN, LEAF_DOMAIN, NatsLeafPair, NatsOptions, NatsServer};

use crate::support::*;

/// The hub's own JetStream (its `$JS.API`), for reading what it stored.
async fn jetstream_of(server: &NatsServer) -> Result<jetstream::Context> {
    Ok(jetstream::new(async_nats::connect(server.url()).await?))
}

/// The relay on the leaf with `domain = "hub"` creates the stream in the hub (not in the leaf),
/// publishes into it, and moves the checkpoint and the slot past the events only once the
/// hub's JetStream acknowledged them; `tail` and `status` read the stream through the leaf, and
/// `validate --connect` says when nothing answers in the configured domain.
#[tokio::test]
async fn a_relay_on_a_leaf_publishes_into_the_hubs_domain() -> Result<()> {
    let (hub, leaf) = NatsLeafPair::start_with(NatsOptions::default())
        .await?
        .into_servers();
    let env = Env::start_on_nats(leaf).await?;
    let config = env.config_full(
        &format!("create_stream = true\ndomain = \"{HUB_DOMAIN}\""),
        "",
    );
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let before = env.checkpoint().await?.unwrap_or(0);
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(insert_event(&db, "order", "created", &format!(r#"{{"n":{n}}}"#)).await?);
    }
    let inserted = env.current_wal().await?;
    assert!(
        before < inserted,
        "precondition: the inserts are past the checkpoint"
    );

    let on_hub = jetstream_of(&hub).await?;
    let stored = wait_for_messages(&on_hub, 3, Duration::from_secs(30), Some(&relay)).await?;
    let stored_ids: Vec<&str> = stored.iter().map(Received::id).collect();
    assert_eq!(stored_ids, ids, "in commit order, in the hub's stream");
    // The leaf's own JetStream has no such stream: the relay created it in the hub.
    let on_leaf = env.jetstream().await?;
    assert!(
        on_leaf.get_stream(STREAM).await.is_err(),
        "the stream is in the leaf's domain too"
    );
    let checkpoint = env
        .wait_checkpoint(inserted, Duration::from_secs(30))
        .await?;
    assert!(checkpoint >= inserted, "{checkpoint:X} < {inserted:X}");
    wait_until("the slot confirms the events", &relay, async || {
        Ok(env.slot_confirmed().await?.unwrap_or(0) >= inserted)
    })
    .await?;
    assert!(!relay.log().contains("ERROR"), "{}", relay.log());

    // The other commands address the hub's domain too.
    let tail = relay_cmd(&config, &["tail", "--count", "3", "--idle-timeout", "5s"]).await?;
    let printed = String::from_utf8_lossy(&tail.stdout);
    assert!(tail.status.success(), "{printed}");
    for id in &ids {
        assert!(printed.contains(id.as_str()), "{id}: {printed}");
    }
    let status = relay_cmd(&config, &["status", "--json"]).await?;
    let doc: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    assert_eq!(
        (
            &doc["stream_state"]["present"],
            &doc["stream_state"]["last_sequence"]
        ),
        (&serde_json::json!(true), &serde_json::json!(3)),
        "the hub's stream, through the leaf: {doc}"
    );
    let preflight = relay_cmd(&config, &["validate", "--connect"]).await?;
    let report = String::from_utf8_lossy(&preflight.stdout);
    assert!(report.contains("PASS  jetstream: enabled"), "{report}");
    let nowhere = env.config_full("domain = \"nowhere\"", "");
    let preflight = relay_cmd(&nowhere, &["validate", "--connect"]).await?;
    let report = String::from_utf8_lossy(&preflight.stdout);
    assert!(!preflight.status.success(), "{report}");
    assert!(
        report.contains("FAIL  jetstream: no JetStream answers in domain `nowhere`")
            && report.contains("set [nats] domain"),
        "{report}"
    );
    Ok(())
}

/// A stream of the same name in the leaf's own domain captures the subjects, and the leaf
/// does not pass them on to the hub: the leaf stores the event and acknowledges it from domain
/// `leaf`. The relay (configured for the hub's domain, whose stream passed the start-up check)
/// stops with the error naming the stream and both domains, and confirms nothing: checkpoint
/// and slot stay before the event. On the relay's own publish connection and through async-nats.
#[tokio::test]
async fn an_ack_from_another_domain_is_refused_and_nothing_is_confirmed() -> Result<()> {
    refused_from_the_leafs_domain("lean", "per-message").await
}

#[tokio::test]
async fn an_ack_from_another_domain_is_refused_through_async_nats_too() -> Result<()> {
    refused_from_the_leafs_domain("async-nats", "per-message").await
}

/// An atomic batch's commit PubAck is checked like a single one (nats-server 2.12.1+; on an
/// older server the relay publishes per message and the same refusal follows).
#[tokio::test]
async fn an_atomic_batch_acknowledged_from_another_domain_is_refused() -> Result<()> {
    refused_from_the_leafs_domain("lean", "atomic-batch").await
}

async fn refused_from_the_leafs_domain(publish_path: &str, publish_mode: &str) -> Result<()> {
    let (hub, leaf) =
        NatsLeafPair::start_with_remote(NatsOptions::default(), r#"deny_exports: ["outbox.>"]"#)
            .await?
            .into_servers();
    let on_hub = jetstream_of(&hub).await?;
    let on_leaf = jetstream_of(&leaf).await?;
    for js in [&on_hub, &on_leaf] {
        js.create_stream(jetstream::stream::Config {
            name: STREAM.into(),
            subjects: vec!["outbox.>".into()],
            storage: jetstream::stream::StorageType::File,
            allow_atomic_publish: publish_mode == "atomic-batch",
            ..Default::default()
        })
        .await?;
    }
    let env = Env::start_on_nats(leaf).await?;
    let batches = publish_mode == "atomic-batch" && env.nats.version_at_least((2, 12, 1));
    let config = env.config_full(
        &format!(
            "domain = \"{HUB_DOMAIN}\"\npublish_path = \"{publish_path}\"\npublish_mode = \"{publish_mode}\""
        ),
        "",
    );
    let mut relay = Relay::start_streaming(&config).await?;
    if batches {
        relay
            .wait_log(
                "publishing each transaction as one atomic batch",
                Duration::from_secs(30),
            )
            .await?;
    }
    let mut db = env.db().await?;
    let checkpoint_before = env.checkpoint().await?.unwrap_or(0);
    let slot_before = env.slot_confirmed().await?.unwrap_or(0);
    // Two events in one transaction: an atomic batch where the server has them.
    let tx = db.transaction().await?;
    let id = insert_event(&tx, "order", "created", r#"{"n":1}"#).await?;
    let second = insert_event(&tx, "order", "created", r#"{"n":2}"#).await?;
    tx.commit().await?;
    let inserted = env.current_wal().await?;
    assert!(
        checkpoint_before < inserted && slot_before < inserted,
        "precondition: the insert is past the checkpoint and the slot"
    );

    expect_exit(
        &mut relay,
        65,
        Duration::from_secs(30),
        &[
            "stream `OUTBOX` acknowledged from JetStream domain `leaf`",
            "[nats] domain = \"hub\"",
            "not counted as delivered",
        ],
    )
    .await?;
    // What the refused acknowledgement said: the leaf stored it, the hub did not.
    let in_leaf = read_stream(&on_leaf).await?;
    let stored: Vec<&str> = in_leaf.iter().map(Received::id).collect();
    assert!(
        stored.first() == Some(&id.as_str()) && stored.len() <= 2,
        "stored in the {LEAF_DOMAIN} domain's stream: {stored:?}"
    );
    if batches {
        assert_eq!(stored, [id.as_str(), second.as_str()], "the whole batch");
        assert!(
            in_leaf
                .iter()
                .all(|m| !m.header("Nats-Batch-Id").is_empty()),
            "stored as one atomic batch"
        );
    }
    assert_eq!(stream_count(&on_hub).await?, 0, "nothing reached the hub");
    let checkpoint = env.checkpoint().await?.unwrap_or(0);
    let slot = env.slot_confirmed().await?.unwrap_or(0);
    assert!(
        checkpoint < inserted,
        "checkpoint {checkpoint:X} moved past the refused event at {inserted:X}"
    );
    assert!(
        slot < inserted,
        "slot {slot:X} moved past the refused event at {inserted:X}"
    );
    Ok(())
}
