//! Handler failures: retries with backoff, parking on the dead-letter subject.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use outbox_consumer::{Permanent, handler_fn};

use crate::common::{Env, dead_letters, header, record, shutdown, wait_for};

/// Fails `flaky` twice, fails `poison` always, fails `bad-json` permanently.
fn failing_handler(calls: Arc<Mutex<HashMap<String, u64>>>) -> impl outbox_consumer::Handler {
    handler_fn(move |tx, ev| {
        let calls = Arc::clone(&calls);
        async move {
            let n = {
                let mut calls = calls.lock().unwrap_or_else(|e| e.into_inner());
                let n = calls.entry(ev.id.clone()).or_default();
                *n += 1;
                *n
            };
            match ev.id.as_str() {
                "flaky" if n <= 2 => return Err(format!("flaky failure #{n}").into()),
                "poison" => return Err("poison payload rejected".into()),
                "bad-json" => {
                    ev.json::<Vec<u32>>().map_err(Permanent::new)?;
                }
                _ => {}
            }
            record(tx, ev, "svc").await
        }
        .boxed()
    })
}

#[tokio::test]
async fn handler_failing_twice_then_succeeding_is_applied_once() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    env.publish(Some("flaky"), "outbox.Order.order-created", "{}")
        .await?;
    env.publish(Some("after"), "outbox.Order.order-created", "{}")
        .await?;
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let consumer = env.builder("svc").max_deliver(5).build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(failing_handler(Arc::clone(&calls)), signal));
    assert_eq!(env.wait_applied("svc", 2).await?, ["flaky", "after"]);
    stop.notify_one();
    run.await??;
    let delivered: i64 = env
        .db
        .query_one(
            "SELECT delivered FROM applied WHERE event_id = 'flaky'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(delivered, 3, "applied on the third delivery");
    let s = stats.snapshot();
    assert_eq!((s.applied, s.retried, s.parked), (2, 2, 0), "{s:?}");
    Ok(())
}

#[tokio::test]
async fn always_failing_handler_is_parked_after_the_limit_and_the_stream_keeps_flowing()
-> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    env.publish(Some("before"), "outbox.Order.order-created", "{}")
        .await?;
    let (poison_seq, _) = env
        .publish(Some("poison"), "outbox.Order.order-created", r#"{"x":1}"#)
        .await?;
    env.publish(Some("bad-json"), "outbox.Order.order-created", "{")
        .await?;
    env.publish(None, "outbox.Order.order-created", "no id")
        .await?;
    for i in 0..3 {
        env.publish(
            Some(&format!("after{i}")),
            "outbox.Order.order-created",
            "{}",
        )
        .await?;
    }
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let consumer = env.builder("svc").max_deliver(3).build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(failing_handler(Arc::clone(&calls)), signal));
    let applied = env.wait_applied("svc", 4).await?;
    assert_eq!(applied, ["before", "after0", "after1", "after2"]);
    wait_for(10, "3 parked", || async {
        Ok(stats.snapshot().parked == 3)
    })
    .await?;
    stop.notify_one();
    run.await??;

    let calls = calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(calls.get("poison"), Some(&3), "handled max_deliver times");
    assert_eq!(
        calls.get("bad-json"),
        Some(&1),
        "permanent errors are not retried"
    );

    let dlq = dead_letters(&env, 3).await?;
    assert_eq!(
        dlq.len(),
        3,
        "every parked message is on the dead-letter subject"
    );
    let poison = &dlq[0];
    assert_eq!(poison.subject.as_str(), "dlq.svc");
    assert_eq!(header(poison, "Outbox-Dlq-Event-Id"), Some("poison"));
    assert_eq!(header(poison, "Outbox-Dlq-Deliveries"), Some("3"));
    assert_eq!(
        header(poison, "Outbox-Dlq-Subject"),
        Some("outbox.Order.order-created")
    );
    assert_eq!(header(poison, "Outbox-Dlq-Consumer"), Some("svc"));
    assert_eq!(
        header(poison, "Outbox-Dlq-Source"),
        Some(format!("OUTBOX:{poison_seq}").as_str())
    );
    let reason = header(poison, "Outbox-Dlq-Reason").unwrap_or_default();
    assert!(
        reason.contains("failed 3 times") && reason.contains("poison payload rejected"),
        "{reason}"
    );
    assert_eq!(header(poison, "Outbox-Table"), Some("public.outbox"));
    assert_eq!(&poison.payload[..], br#"{"x":1}"#);

    let bad_json = &dlq[1];
    assert_eq!(header(bad_json, "Outbox-Dlq-Event-Id"), Some("bad-json"));
    let reason = header(bad_json, "Outbox-Dlq-Reason").unwrap_or_default();
    assert!(reason.starts_with("permanent handler error"), "{reason}");

    let no_id = &dlq[2];
    let reason = header(no_id, "Outbox-Dlq-Reason").unwrap_or_default();
    assert!(reason.contains("no Nats-Msg-Id"), "{reason}");
    assert_eq!(&no_id.payload[..], b"no id");

    let s = stats.snapshot();
    assert_eq!((s.applied, s.parked, s.retried), (4, 3, 2), "{s:?}");
    assert_eq!(
        env.count("SELECT count(*) FROM outbox_consumer_ledger")
            .await?,
        4,
        "parked events have no ledger row"
    );
    Ok(())
}

#[tokio::test]
async fn message_is_kept_until_the_dead_letter_publish_succeeds() -> anyhow::Result<()> {
    // No stream captures `dlq.svc` at first: parking cannot be confirmed.
    let env = Env::start_with(Duration::from_secs(120), false).await?;
    env.publish(Some("poison"), "outbox.Order.order-created", "{}")
        .await?;
    let calls = Arc::new(Mutex::new(HashMap::new()));
    let consumer = env.builder("svc").max_deliver(1).build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(failing_handler(Arc::clone(&calls)), signal));
    wait_for(10, "a failed park", || async {
        Ok(stats.snapshot().park_failures >= 1)
    })
    .await?;
    assert_eq!(stats.snapshot().parked, 0);
    env.create_dlq_stream().await?;
    wait_for(10, "the park", || async {
        Ok(stats.snapshot().parked == 1)
    })
    .await?;
    stop.notify_one();
    run.await??;
    let dlq = dead_letters(&env, 1).await?;
    assert_eq!(dlq.len(), 1);
    assert_eq!(header(&dlq[0], "Outbox-Dlq-Event-Id"), Some("poison"));
    Ok(())
}
