//! Parking events exactly as the relay publishes them: every relay message carries
//! `Nats-Expected-Stream: OUTBOX`, which the dead-letter stream would refuse (JetStream error
//! 10060) if the park copied it, so a Strict consumer would stall on the poison event forever
//! and a parallel one would retry it forever.

use std::time::Duration;

use futures::FutureExt as _;
use outbox_consumer::{Ordering, StatsSnapshot, handler_fn};

use crate::common::{Env, STREAM, dead_letters, header, record, relay_message, shutdown, wait_for};

/// Fails `poison` on every delivery, applies everything else.
fn poison_handler(service: &'static str) -> impl outbox_consumer::Handler {
    handler_fn(move |tx, ev| {
        async move {
            if ev.id == "poison" {
                return Err("poison payload rejected".into());
            }
            record(tx, ev, service).await
        }
        .boxed()
    })
}

/// The parked copy: on the dead-letter subject, no stream-binding header, the originals kept
/// under `Outbox-Original-…`, a deterministic `Nats-Msg-Id`, the relay's headers and payload.
fn assert_parked_copy(m: &async_nats::Message, service: &str) {
    assert_eq!(m.subject.as_str(), format!("dlq.{service}"));
    let names: Vec<String> = m
        .headers
        .iter()
        .flat_map(|h| h.iter().map(|(n, _)| n.to_string()))
        .collect();
    // Not even inside another name: nats-server before 2.11.11 finds `Nats-Msg-Id` in
    // `Outbox-Original-Nats-Msg-Id` when that comes first, and then deduplicates nothing.
    let reserved: Vec<&String> = names
        .iter()
        .filter(|n| n.to_ascii_lowercase().contains("nats-"))
        .collect();
    assert_eq!(
        reserved,
        ["Nats-Msg-Id"],
        "only the dead letter's own id: {names:?}"
    );
    assert_eq!(
        header(m, "Nats-Msg-Id"),
        Some(format!("dlq:{service}:poison").as_str())
    );
    assert_eq!(header(m, "Outbox-Original-Expected-Stream"), Some(STREAM));
    assert_eq!(header(m, "Outbox-Original-Msg-Id"), Some("poison"));
    assert_eq!(header(m, "Outbox-Dlq-Event-Id"), Some("poison"));
    assert_eq!(header(m, "Outbox-Dlq-Consumer"), Some(service));
    assert_eq!(header(m, "Outbox-Commit-Lsn"), Some("0/16B3748"));
    assert_eq!(header(m, "Outbox-Table"), Some("public.outbox"));
    let reason = header(m, "Outbox-Dlq-Reason").unwrap_or_default();
    assert!(reason.contains("poison payload rejected"), "{reason}");
    assert_eq!(&m.payload[..], br#"{"poison":true}"#);
}

async fn stats_reach(
    stats: &outbox_consumer::ConsumerStats,
    what: &str,
    done: impl Fn(&StatsSnapshot) -> bool,
) -> anyhow::Result<()> {
    wait_for(15, what, || async { Ok(done(&stats.snapshot())) })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; stats {:?}", stats.snapshot()))
}

#[tokio::test]
async fn strict_consumer_parks_a_relay_poison_event_and_moves_on() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let subject = "outbox.Order.order-created";
    env.publish(Some("before"), subject, "{}").await?;
    let (poison_seq, _) = env
        .publish(Some("poison"), subject, r#"{"poison":true}"#)
        .await?;
    env.publish(Some("after0"), subject, "{}").await?;
    env.publish(Some("after1"), subject, "{}").await?;

    // The stored copy the consumer receives carries every header the relay put on the wire,
    // `Nats-Expected-Stream` included: that is what the park must cope with.
    let stored = env
        .js
        .get_stream(STREAM)
        .await?
        .get_raw_message(poison_seq)
        .await?;
    let wire = env
        .relay
        .headers(&relay_message("poison", subject, r#"{"poison":true}"#)?);
    assert_eq!(
        stored.headers, wire,
        "JetStream stores the relay's headers as sent"
    );
    assert_eq!(
        stored
            .headers
            .get("Nats-Expected-Stream")
            .map(|v| v.as_str()),
        Some(STREAM)
    );

    let consumer = env.builder("strict").max_deliver(2).build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(poison_handler("strict"), signal));
    stats_reach(&stats, "the poison event parked", |s| s.parked == 1).await?;
    assert_eq!(
        env.wait_applied("strict", 3).await?,
        ["before", "after0", "after1"],
        "the consumer moves on past the parked event, in order"
    );
    stop.notify_one();
    run.await??;

    let dlq = dead_letters(&env, 1).await?;
    assert_eq!(dlq.len(), 1, "one dead letter");
    assert_parked_copy(&dlq[0], "strict");
    assert_eq!(
        header(&dlq[0], "Outbox-Dlq-Source"),
        Some(format!("{STREAM}:{poison_seq}").as_str())
    );
    let s = stats.snapshot();
    assert_eq!((s.applied, s.parked, s.park_failures), (3, 1, 0), "{s:?}");
    Ok(())
}

#[tokio::test]
async fn parallel_consumer_parks_a_relay_poison_event_once_and_moves_on() -> anyhow::Result<()> {
    // A 100 ms duplicate window, so a relay re-send of the poison event is stored twice.
    let env = Env::start(Duration::from_millis(100)).await?;
    let subject = "outbox.Order.order-created";
    let (first, _) = env
        .publish(Some("poison"), subject, r#"{"poison":true}"#)
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (second, dup) = env
        .publish(Some("poison"), subject, r#"{"poison":true}"#)
        .await?;
    assert!(
        !dup && second > first,
        "the re-send is a second stream copy"
    );
    for i in 0..4 {
        env.publish(Some(&format!("after{i}")), subject, "{}")
            .await?;
    }

    let consumer = env
        .builder("par")
        .ordering(Ordering::Parallel(4))
        .max_deliver(2)
        .build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(poison_handler("par"), signal));
    stats_reach(&stats, "both copies parked", |s| s.parked == 2).await?;
    let mut applied = env.wait_applied("par", 4).await?;
    applied.sort();
    assert_eq!(applied, ["after0", "after1", "after2", "after3"]);
    stop.notify_one();
    run.await??;

    // Both copies were parked, but the dead letter's id is the event's, so the dead-letter
    // stream keeps one.
    let dlq = dead_letters(&env, 2).await?;
    assert_eq!(
        dlq.len(),
        1,
        "the second park of the same event is deduplicated"
    );
    assert_parked_copy(&dlq[0], "par");
    let s = stats.snapshot();
    assert_eq!((s.applied, s.parked, s.park_failures), (4, 2, 0), "{s:?}");
    Ok(())
}
