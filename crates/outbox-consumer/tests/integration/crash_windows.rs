//! The consumer dies between the handler and COMMIT, or between COMMIT and the ack.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use futures::FutureExt as _;
use outbox_consumer::hooks::{Hook, Point};

use crate::common::{Env, recording_handler, shutdown};

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
    // Crash: the task and with it the PostgreSQL connection and the NATS subscription go.
    run.abort();
    assert!(run.await.is_err_and(|e| e.is_cancelled()));

    let second = env.builder("svc").build()?;
    let stats = second.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(second.run(recording_handler("svc"), signal));
    let applied = env.wait_applied("svc", ids.len()).await?;
    stop.notify_one();
    run.await??;
    assert_eq!(applied, ids, "every event applied exactly once, in order");
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
