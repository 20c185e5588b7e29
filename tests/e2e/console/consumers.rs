//! The console's consumers data (`/console/api/consumers`) against the real nats-server of the
//! harness (Debian's 2.9 by default, a current one with `RELAY_TEST_NATS_SERVER`).

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use async_nats::jetstream::consumer;
use futures::StreamExt as _;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(10);

/// `behind_stream` is what a consumer has not acknowledged on every server version: a consumer
/// created at a start sequence that acknowledged nothing (nats-server 2.9 reports its ack floor
/// as 0, 2.10+ as the sequence before its start) and one that acknowledged from the stream's
/// first message.
#[tokio::test(flavor = "multi_thread")]
async fn behind_stream_counts_what_a_consumer_has_not_acknowledged() -> Result<()> {
    let env = Env::start().await?;
    let addr = format!("127.0.0.1:{}", relay_testkit::free_port());
    let config = env.config(&format!("[http]\nlisten = \"{addr}\"\nconsole = true\n"));
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let mut last = String::new();
    for n in 0..10 {
        last = insert_event(&db, "Order", "created", &format!(r#"{{"n": {n}}}"#)).await?;
    }
    wait_for_id(&js, &last, &relay).await?;
    ensure!(last_sequence(&js).await? == 10);
    let stream = js.get_stream(STREAM).await?;
    let from_4 = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("from-4".into()),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: 4 },
            ..Default::default()
        })
        .await?;
    // Two delivered, none acknowledged.
    let mut batch = from_4
        .fetch()
        .max_messages(2)
        .expires(Duration::from_secs(3))
        .messages()
        .await?;
    let mut delivered = 0;
    while let Some(m) = batch.next().await {
        m.map_err(|e| anyhow::anyhow!(e))?;
        delivered += 1;
    }
    ensure!(delivered == 2, "{delivered} delivered");
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("acked-3".into()),
            ..Default::default()
        })
        .await?;
    ensure!(fetch_acked(&js, "acked-3", 3).await?.len() == 3);

    check_behind(&addr, &env.nats.version()).await
}

/// Reads `/console/api/consumers` at `addr` until it lists both consumers; checks their
/// `behind_stream`.
async fn check_behind(addr: &str, version: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let data = loop {
        let got = relay_ops::client::get_text(addr, "/console/api/consumers", WAIT).await;
        if let Ok((200, body)) = &got {
            let data: serde_json::Value = serde_json::from_str(body)?;
            if data["consumers"].as_array().is_some_and(|c| c.len() == 2) {
                break data;
            }
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no consumers listed: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let of = |name: &str| -> Result<&serde_json::Value> {
        data["consumers"]
            .as_array()
            .and_then(|all| all.iter().find(|c| c["name"] == name))
            .with_context(|| format!("{name} listed: {data}"))
    };
    let from_4 = of("from-4")?;
    ensure!(
        (
            &from_4["pending"],
            &from_4["ack_pending"],
            &from_4["behind_stream"]
        ) == (&5.into(), &2.into(), &7.into()),
        "nats-server {version}: from-4 has 7 of sequences 4..=10 unacknowledged: {from_4}"
    );
    let acked = of("acked-3")?;
    ensure!(
        acked["behind_stream"] == 7,
        "nats-server {version}: acked-3 acknowledged 3 of 10: {acked}"
    );
    Ok(())
}
