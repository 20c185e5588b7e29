//! The consumer dies between the handler and COMMIT, or between COMMIT and the ack.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use futures::FutureExt as _;
use outbox_consumer::hooks::{Hook, Point};

use async_nats::jetstream::consumer;

use crate::common::{Env, STREAM, recording_handler, shutdown, wait_for};

/// The durable `svc`'s state on the server.
async fn durable(env: &Env) -> anyhow::Result<consumer::Info> {
    Ok(env
        .js
        .get_stream(STREAM)
        .await?
        .consumer_info("svc")
        .await?)
}

/// A hook that hangs forever the first time `point` is reached for event `id`, after
/// signalling `reached`.
fn hang_once(point: Point, id: &'static str, reached: Arc<tokio::sync::Notify>) -> Hook {
    let fired = Arc::new(AtomicBool::new(false));
    Arc::new(move |p, ev| {
        if p == point && ev.id == id && !fired.swap(true, AtomicOrdering::SeqCst) {
            reached.notify_one();
            futures::future::pending::<()>().boxed()
        } else {
            futures::future::ready(()).boxed()
        }
    })
}

/// Runs a consumer that "crashes" (its task is aborted, dropping its connections) at `point`
/// while handling `e3`; then restarts it and checks that every event is applied once.
async fn crash_and_restart(point: Point) -> anyhow::Result<(Env, u64)> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let ids = ["e1", "e2", "e3", "e4", "e5"];
    for id in ids {
        env.publish(Some(id), "outbox.Order.order-created", "{}")
            .await?;
    }
    let reached = Arc::new(tokio::sync::Notify::new());
    let first = env
        .builder("svc")
        .test_hook(hang_once(point, "e3", Arc::clone(&reached)))
        .build()?;
    let (_never, signal) = shutdown();
    let run = tokio::spawn(first.run(recording_handler("svc"), signal));
    tokio::time::timeout(Duration::from_secs(20), reached.notified()).await?;
    let committed = env.applied("svc").await?;
    match point {
        Point::BeforeAck => assert_eq!(committed, ["e1", "e2", "e3"], "e3 committed"),
        Point::BeforeCommit => assert_eq!(committed, ["e1", "e2"], "e3 not committed"),
    }
    // The crash lands before the ack: the server has e1 and e2 acked and still waits for e3's.
    let info = durable(&env).await?;
    assert_eq!(
        (
            info.num_ack_pending,
            info.ack_floor.stream_sequence,
            info.delivered.stream_sequence
        ),
        (1, 2, 3),
        "e3 delivered and not acked: {info:?}"
    );
    // Crash: the task and with it the PostgreSQL connection and the NATS subscription go.
    run.abort();
    assert!(run.await.is_err_and(|e| e.is_cancelled()));

    let second = env.builder("svc").build()?;
    let stats = second.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(second.run(recording_handler("svc"), signal));
    let applied = env.wait_applied("svc", ids.len()).await?;
    wait_for(20, "the ack floor at e5", || async {
        let info = durable(&env).await?;
        Ok((info.ack_floor.stream_sequence, info.num_ack_pending) == (5, 0))
    })
    .await?;
    stop.notify_one();
    run.await??;
    assert_eq!(applied, ids, "every event applied exactly once, in order");
    // e3 was delivered again, to the restarted consumer, which acked it.
    let info = durable(&env).await?;
    assert!(info.delivered.consumer_sequence >= 6, "{info:?}");
    let e3_first_delivery = env
        .count("SELECT count(*) FROM applied WHERE event_id = 'e3' AND delivered = 1")
        .await?;
    match point {
        Point::BeforeAck => assert_eq!(e3_first_delivery, 1, "e3's handler ran once, first"),
        Point::BeforeCommit => assert_eq!(e3_first_delivery, 0, "e3's first run rolled back"),
    }
    assert_eq!(
        env.count("SELECT count(*) FROM outbox_consumer_ledger")
            .await?,
        5
    );
    Ok((env, stats.snapshot().duplicates))
}

#[tokio::test]
async fn crash_between_commit_and_ack_redelivery_is_absorbed_by_the_ledger() -> anyhow::Result<()> {
    let (_env, duplicates) = crash_and_restart(Point::BeforeAck).await?;
    assert_eq!(duplicates, 1, "the redelivered e3 found its ledger row");
    Ok(())
}

#[tokio::test]
async fn crash_between_handler_and_commit_rolls_back_and_applies_on_redelivery()
-> anyhow::Result<()> {
    let (_env, duplicates) = crash_and_restart(Point::BeforeCommit).await?;
    assert_eq!(
        duplicates, 0,
        "nothing of e3 was committed before the crash"
    );
    Ok(())
}
