//! Every event applied once: with the example service, under duplicates, per service.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use futures::FutureExt as _;
use outbox_consumer::{Ordering, handler_fn};

use crate::common::{Env, record, recording_handler, shutdown, wait_for};
use crate::example_service::{NotifyOnOrderCreated, SCHEMA};

#[tokio::test]
async fn example_service_applies_every_event_exactly_once_in_parallel() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    // As the example's `main` does: the ledger and the service's table, before consuming.
    outbox_consumer::ensure_ledger(&env.db).await?;
    env.db.batch_execute(SCHEMA).await?;
    for i in 0..40 {
        let payload = format!(
            r#"{{"order_id":"o{i}","purchaser_id":"p{i}","supplier_id":"s{}","total_cents":{}}}"#,
            i % 3,
            1000 + i
        );
        env.publish(
            Some(&format!("ev-{i}")),
            "outbox.Order.order-created",
            &payload,
        )
        .await?;
    }
    for i in 0..5 {
        env.publish(
            Some(&format!("other-{i}")),
            "outbox.Order.order-shipped",
            "{}",
        )
        .await?;
    }
    let consumer = env.builder("notify").parallel(4).build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(NotifyOnOrderCreated, signal));

    wait_for(30, "45 ledger rows", || async {
        Ok(env
            .count("SELECT count(*) FROM outbox_consumer_ledger WHERE consumer = 'notify'")
            .await?
            == 45)
    })
    .await?;
    stop.notify_one();
    run.await??;

    assert_eq!(env.count("SELECT count(*) FROM notifications").await?, 80);
    let per_event = env
        .db
        .query(
            "SELECT event_id, count(*), \
                    count(*) FILTER (WHERE recipient_role = 'purchaser' AND recipient_id = 'p' || substr(order_id, 2)) \
             FROM notifications GROUP BY event_id",
            &[],
        )
        .await?;
    assert_eq!(per_event.len(), 40);
    for row in per_event {
        let (id, n, purchaser): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((n, purchaser), (2, 1), "event {id}");
    }
    let s = stats.snapshot();
    assert_eq!((s.applied, s.duplicates, s.parked), (45, 0, 0), "{s:?}");
    Ok(())
}

#[tokio::test]
async fn duplicate_past_the_dedupe_window_is_applied_once() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_millis(100)).await?;
    let (seq1, dup) = env
        .publish(Some("e1"), "outbox.Order.order-created", "{}")
        .await?;
    assert!(!dup);
    // Inside the window JetStream drops the re-send ...
    let (_, dup) = env
        .publish(Some("e1"), "outbox.Order.order-created", "{}")
        .await?;
    assert!(dup, "inside the duplicate window the stream dedupes");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // ... past it, the duplicate reaches the stream and the consumer.
    let (seq2, dup) = env
        .publish(Some("e1"), "outbox.Order.order-created", "{}")
        .await?;
    assert!(!dup && seq2 > seq1, "past the window it is stored again");
    env.publish(Some("e2"), "outbox.Order.order-created", "{}")
        .await?;

    let consumer = env.builder("svc").build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(recording_handler("svc"), signal));
    assert_eq!(env.wait_applied("svc", 2).await?, ["e1", "e2"]);
    stop.notify_one();
    run.await??;
    let s = stats.snapshot();
    assert_eq!((s.applied, s.duplicates), (2, 1), "{s:?}");
    Ok(())
}

#[tokio::test]
async fn strict_mode_applies_in_stream_order_across_retries() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let ids: Vec<String> = (0..15).map(|i| format!("e{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let subject = format!("outbox.Order{}.order-created", i % 3);
        env.publish(Some(id), &subject, "{}").await?;
    }
    let failed_once = Arc::new(AtomicBool::new(false));
    let handler = handler_fn(move |tx, ev| {
        let failed_once = Arc::clone(&failed_once);
        async move {
            if ev.id == "e05" && !failed_once.swap(true, AtomicOrdering::SeqCst) {
                return Err("transient failure".into());
            }
            record(tx, ev, "strict").await
        }
        .boxed()
    });
    let consumer = env.builder("strict").ordering(Ordering::Strict).build()?;
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(handler, signal));
    let applied = env.wait_applied("strict", ids.len()).await?;
    stop.notify_one();
    run.await??;
    assert_eq!(
        applied, ids,
        "strict mode keeps stream order even across a retry"
    );
    Ok(())
}

#[tokio::test]
async fn two_services_with_own_durables_each_apply_every_event() -> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let ids: BTreeSet<String> = (0..25).map(|i| format!("e{i}")).collect();
    for id in &ids {
        env.publish(Some(id), "outbox.Order.order-created", "{}")
            .await?;
    }
    let (stop, signal_a) = shutdown();
    let (stop_b, signal_b) = shutdown();
    let a = env.builder("svc-a").build()?;
    let b = env.builder("svc-b").parallel(3).build()?;
    let run_a = tokio::spawn(a.run(recording_handler("svc-a"), signal_a));
    let run_b = tokio::spawn(b.run(recording_handler("svc-b"), signal_b));
    let applied_a = env.wait_applied("svc-a", ids.len()).await?;
    let applied_b = env.wait_applied("svc-b", ids.len()).await?;
    stop.notify_one();
    stop_b.notify_one();
    run_a.await??;
    run_b.await??;
    for applied in [applied_a, applied_b] {
        assert_eq!(applied.len(), ids.len(), "no event applied twice");
        assert_eq!(applied.into_iter().collect::<BTreeSet<_>>(), ids);
    }
    let stream = env.js.get_stream("OUTBOX").await?;
    for durable in ["svc-a", "svc-b"] {
        wait_for(5, "every message acked", || async {
            Ok(stream
                .consumer_info(durable)
                .await?
                .ack_floor
                .stream_sequence
                == 25)
        })
        .await?;
    }
    Ok(())
}
