//! Fault scenarios 20-21: the stream fills up (`discard: new`) under load, then its limit is
//! raised, with the relay running through it or killed while the stream is full. Nothing is
//! confirmed past what the stream holds, and once there is room every event arrives, in commit
//! order per aggregate.

use std::time::Duration;

use anyhow::Result;
use async_nats::jetstream::stream::{Config, DiscardPolicy};

use super::{in_mode, publish_mode, settle, started};
use crate::faults::oracle::*;
use crate::support::*;

const STREAM_FULL: &str = "outbox_relay_stream_full";
/// Messages the stream holds before it refuses new ones.
const LIMIT: i64 = 400;

/// The stream, made by the test with a `max_msgs` limit and `discard: new`.
async fn limited_stream(env: &Env) -> Result<async_nats::jetstream::Context> {
    let js = env.jetstream().await?;
    js.create_stream(stream_config(LIMIT)).await?;
    Ok(js)
}

fn stream_config(max_messages: i64) -> Config {
    Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        max_messages,
        discard: DiscardPolicy::New,
        allow_atomic_publish: publish_mode().as_deref() == Some("atomic-batch"),
        allow_batch_publish: publish_mode().as_deref() == Some("fast-batch"),
        ..Default::default()
    }
}

/// What was seen while the stream was full.
struct WhileFull {
    /// The relay's gauge said so.
    flagged: bool,
    /// The stream held exactly its limit.
    held: u64,
    /// The checkpoint and the slot did not move over 2 s while full (and rows were committed).
    frozen: bool,
}

/// Waits for the relay to report the stream full, then watches the positions for 2 s.
async fn watch_full(
    env: &Env,
    addr: &str,
    js: &async_nats::jetstream::Context,
) -> Result<WhileFull> {
    let flagged =
        wait_metric(addr, STREAM_FULL, Duration::from_secs(30), |v| v == 1.0).await == Some(1.0);
    // Acks of what was stored before it filled up land first (later on a loaded machine).
    let before = super::positions_at_rest(env).await?;
    let rows_before = committed_ids(env).await?.len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = (env.checkpoint().await?, env.slot_confirmed().await?);
    let rows_after = committed_ids(env).await?.len();
    let held = stream_count(js).await? as u64;
    Ok(WhileFull {
        flagged,
        held,
        frozen: before == after && rows_after > rows_before,
    })
}

fn require_full(v: &mut Verdict, full: &WhileFull) {
    v.require(
        full.flagged,
        "the relay reported the stream full (outbox_relay_stream_full 1)",
    );
    v.require(
        full.held == LIMIT as u64,
        format!(
            "the stream held its limit while full: {} of {LIMIT}",
            full.held
        ),
    );
    v.require(
        full.frozen,
        "checkpoint and slot did not move while the stream was full and rows were committed",
    );
}

/// 20. The stream fills up under load (`max_msgs`, `discard: new`); after a while its limit is
/// raised. The relay waits (a full stream is a definite refusal: nothing stored, nothing
/// confirmed past it), then sends on from the first event not stored, in commit order.
#[tokio::test(flavor = "multi_thread")]
async fn s20_full_stream_then_the_limit_raised() -> Result<()> {
    let env = Env::start().await?;
    let js = limited_stream(&env).await?;
    let (http, addr) = http_listen();
    let config = in_mode(env.config_full("", &http));
    let relay = started(&config, &[]).await?;
    let load = Load::start(&env, 3, 20, Duration::from_millis(20)).await?;
    let full = watch_full(&env, &addr, &js).await?;
    js.update_stream(stream_config(-1)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop().await;
    let mut v = classify(
        &env,
        "20 stream full (discard new), then raised",
        false,
        settle(),
        &format!(
            "stream-full refusals {}",
            metric_labelled(&addr, "outbox_relay_publish_errors_total", "stream_full").await
        ),
    )
    .await?;
    require_full(&mut v, &full);
    v.require(
        metric(&addr, STREAM_FULL).await.is_ok_and(|v| v == 0.0),
        "the gauge cleared once there was room",
    );
    v.assert_with_log(&relay.log());
    Ok(())
}

/// 21. As 20, with the relay killed (-9) while the stream is full, and started again after the
/// limit was raised: it resumes from its checkpoint, before everything the stream refused.
#[tokio::test(flavor = "multi_thread")]
async fn s21_relay_killed_while_the_stream_is_full() -> Result<()> {
    let env = Env::start().await?;
    let js = limited_stream(&env).await?;
    let (http, addr) = http_listen();
    let config = in_mode(env.config_full("", &http));
    let mut relay = started(&config, &[]).await?;
    let load = Load::start(&env, 3, 20, Duration::from_millis(20)).await?;
    let full = watch_full(&env, &addr, &js).await?;
    relay.kill9();
    let checkpoint_at_kill = env.checkpoint().await?;
    js.update_stream(stream_config(-1)).await?;
    let relay = started(&config, &[]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop().await;
    let mut v = classify(
        &env,
        "21 relay kill -9 while the stream is full",
        true,
        settle(),
        "dup allowed after the kill",
    )
    .await?;
    require_full(&mut v, &full);
    let checkpoint = env.checkpoint().await?;
    v.require(
        checkpoint > checkpoint_at_kill,
        format!(
            "the checkpoint moved on after the restart: {checkpoint_at_kill:?} -> {checkpoint:?}"
        ),
    );
    v.assert_with_log(&relay.log());
    Ok(())
}

/// The value of `name{kind="<kind>"}`, 0 when absent or unreadable.
async fn metric_labelled(addr: &str, name: &str, kind: &str) -> f64 {
    metric(addr, &format!("{name}{{kind=\"{kind}\"}}"))
        .await
        .unwrap_or(0.0)
}
