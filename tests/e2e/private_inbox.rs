//! `[nats] inbox_prefix`: JetStream answers the relay on a prefix of its own, which the
//! account's permissions keep private, so another client that sees the outbox subjects cannot
//! answer a publish in JetStream's place.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use relay_testkit::{NatsOptions, PgOptions};

use crate::support::*;

const PREFIX: &str = "_RELAY_INBOX";

/// The account as docs/security.md describes it: only the relay's user may subscribe to its
/// prefix, no user may publish to it; every other subject is open to the other users.
fn accounts() -> String {
    let private = format!("publish: {{ allow: [\">\"], deny: [\"{PREFIX}.>\"] }}");
    let others = format!(
        "permissions: {{ {private}, subscribe: {{ allow: [\">\"], deny: [\"{PREFIX}.>\"] }} }}"
    );
    format!(
        "authorization {{\n  users = [\n    {{ user: \"relay\", password: \"relay\", permissions: {{ {private}, subscribe: {{ allow: [\"{PREFIX}.>\"] }} }} }}\n    {{ user: \"forger\", password: \"forger\", {others} }}\n    {{ user: \"admin\", password: \"admin\", {others} }}\n  ]\n}}\n"
    )
}

/// An account where every user may publish and subscribe to everything, `_INBOX.>` included:
/// most NATS accounts, where any service answers requests.
fn open_accounts() -> String {
    "authorization {\n  users = [\n    { user: \"relay\", password: \"relay\" }\n    { user: \"forger\", password: \"forger\" }\n    { user: \"admin\", password: \"admin\" }\n  ]\n}\n".to_owned()
}

/// The servers, the admin's JetStream, a stream `OUTBOX` made by `config`, and a forger that
/// answers every reply subject it sees on the outbox subjects with a PubAck naming the relay's
/// own stream (counted in the returned counter), before JetStream can.
async fn attacked(config: stream::Config) -> Result<(Env, jetstream::Context, Arc<AtomicUsize>)> {
    attacked_on(config, accounts()).await
}

/// As [`attacked`], on an account of `accounts`.
async fn attacked_on(
    config: stream::Config,
    accounts: String,
) -> Result<(Env, jetstream::Context, Arc<AtomicUsize>)> {
    let env = Env::start_with(
        PgOptions::default(),
        NatsOptions {
            config: Some(accounts),
            ..Default::default()
        },
    )
    .await?;
    let url = env.nats.url();
    let admin = async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin".into())
        .connect(&url)
        .await?;
    let js = jetstream::new(admin);
    js.create_stream(config).await?;
    let forger =
        async_nats::ConnectOptions::with_user_and_password("forger".into(), "forger".into())
            .connect(&url)
            .await?;
    let mut seen = forger.subscribe("outbox.>").await?;
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    tokio::spawn(async move {
        while let Some(msg) = seen.next().await {
            if let Some(reply) = msg.reply {
                let forged = format!(r#"{{"stream":"{STREAM}","seq":999999}}"#);
                let _ = forger.publish(reply, forged.into()).await;
                let _ = forger.flush().await;
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Ok((env, js, answered))
}

/// The relay as the account's owner configures it: its user, its own inbox prefix.
fn relay_config(env: &Env) -> std::path::PathBuf {
    env.config_full(
        &format!("user = \"relay\"\npassword = \"relay\"\ninbox_prefix = \"{PREFIX}\""),
        "",
    )
}

/// Inserts `n` events; returns their ids and a position every record of the `limit`-th
/// one's transaction (counting from 0) comes after.
async fn insert(env: &Env, n: usize, limit: usize) -> Result<(Vec<String>, u64)> {
    let db = env.db().await?;
    let (mut ids, mut bound) = (Vec::new(), 0);
    for i in 0..n {
        if i == limit {
            bound = env.current_wal().await?;
        }
        ids.push(insert_event(&db, "Order", "Placed", &format!(r#"{{"n":{i}}}"#)).await?);
    }
    Ok((ids, bound))
}

/// Waits until the forger answered `n` publishes (the attack was made), then a little longer,
/// and asserts that neither the checkpoint nor the slot passed `bound`.
async fn assert_held(
    env: &Env,
    relay: &Relay,
    answered: &AtomicUsize,
    n: usize,
    bound: u64,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered.load(Ordering::Relaxed) < n {
        ensure!(
            Instant::now() < deadline,
            "the forger answered {} publishes; log:\n{}",
            answered.load(Ordering::Relaxed),
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (checkpoint, slot) = (env.checkpoint().await?, env.slot_confirmed().await?);
    assert!(
        checkpoint.unwrap_or(0) <= bound && slot.unwrap_or(0) <= bound,
        "confirmed past an event the stream does not hold: checkpoint {checkpoint:X?}, slot {slot:X?}, bound {bound:X}; log:\n{}",
        relay.log()
    );
    Ok(())
}

/// The stream full (`discard: new`, 10 messages): the forged answers never reach the relay,
/// which hears the stream's refusal; nothing past the first refused event is confirmed, and
/// once the limit is raised every event is there once, in commit order.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_answer_for_a_full_stream_cannot_reach_a_private_inbox() -> Result<()> {
    let mut config = stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        max_messages: 10,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    };
    let (env, js, answered) = attacked(config.clone()).await?;
    let relay = Relay::start_streaming(&relay_config(&env)).await?;
    let (ids, bound) = insert(&env, 30, 10).await?;
    assert_held(&env, &relay, &answered, 15, bound).await?;
    assert_eq!(stream_count(&js).await?, 10, "the stream stays full");
    assert!(
        relay.log().contains("publish failed (stream full)"),
        "the relay heard the stream's own answer; log:\n{}",
        relay.log()
    );
    config.max_messages = -1;
    js.update_stream(config).await?;
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(&relay)).await?;
    let stored: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(stored, ids, "every event once, in commit order");
    Ok(())
}

/// The stream deleted under the relay: the forger's answers are the only ones a publish could
/// get (its subscription also keeps the server from answering "no responders"), and none
/// reaches the relay: nothing is confirmed past the first event after the deletion, and once
/// the stream is there again every later event is stored once, in commit order.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_answer_for_a_missing_stream_cannot_reach_a_private_inbox() -> Result<()> {
    let config = stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    };
    let (env, js, answered) = attacked(config.clone()).await?;
    let relay = Relay::start_streaming(&relay_config(&env)).await?;
    let (first, _) = insert(&env, 1, 1).await?;
    wait_for_id(&js, &first[0], &relay).await?;
    // Stored past the first event before the stream goes: the events after are the window.
    env.wait_checkpoint(env.current_wal().await?, Duration::from_secs(30))
        .await?;
    let before = answered.load(Ordering::Relaxed);
    js.delete_stream(STREAM).await?;
    let (ids, bound) = insert(&env, 20, 0).await?;
    assert_held(&env, &relay, &answered, before + 1, bound).await?;
    js.create_stream(config).await?;
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(90), Some(&relay)).await?;
    let stored: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(
        stored, ids,
        "every event after the deletion once, in commit order"
    );
    Ok(())
}

/// The relay on the shared `_INBOX` prefix, where the forger can answer first.
fn shared_inbox_config(env: &Env) -> std::path::PathBuf {
    env.config_full("user = \"relay\"\npassword = \"relay\"", "")
}

/// Without a private prefix, the stream edited under the relay so that it no longer captures
/// the outbox subjects: JetStream no longer answers, the forger's answers are the only ones and
/// name sequence 999999 of a stream whose last is far before it. The check against the
/// stream's last sequence refuses them; nothing past the first unstored event is confirmed, and
/// once the subjects are back every event is there once, in commit order, with the forger still
/// answering.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_sequence_past_the_streams_last_on_the_shared_inbox_is_not_taken_as_stored()
-> Result<()> {
    let mut config = stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    };
    let (env, js, answered) = attacked_on(config.clone(), open_accounts()).await?;
    let (http, addr) = http_listen();
    let relay_config = env.config_full("user = \"relay\"\npassword = \"relay\"", &http);
    let relay = Relay::start_streaming(&relay_config).await?;
    let (first, _) = insert(&env, 1, 1).await?;
    wait_for_id(&js, &first[0], &relay).await?;
    let before = answered.load(Ordering::Relaxed);
    let mut elsewhere = config.clone();
    elsewhere.subjects = vec!["elsewhere.>".into()];
    js.update_stream(elsewhere).await?;
    let (ids, bound) = insert(&env, 20, 0).await?;
    assert_held(&env, &relay, &answered, before + 5, bound).await?;
    let refused = metric(&addr, "outbox_relay_acks_not_held_total").await?;
    ensure!(
        refused >= 1.0 && relay.log().contains("before the acknowledged 999999"),
        "the forged answers reached the relay and were refused ({refused}); log:\n{}",
        relay.log()
    );
    config.subjects = vec!["outbox.>".into()];
    js.update_stream(config).await?;
    let got = wait_for_messages(&js, ids.len() + 1, Duration::from_secs(90), Some(&relay)).await?;
    let stored: Vec<&str> = got.iter().skip(1).map(Received::id).collect();
    assert_eq!(stored, ids, "every event once, in commit order");
    let last_commit = got
        .last()
        .and_then(|m| parse_lsn(m.header("Outbox-Commit-Lsn")))
        .unwrap_or(u64::MAX);
    env.wait_checkpoint(last_commit, Duration::from_secs(60))
        .await?;
    Ok(())
}

/// Without a private prefix, the stream deleted under the relay: the forger's answers name a
/// stream that does not exist and are refused; nothing is confirmed past the first event after
/// the deletion, and once the stream is there again every later event is stored once.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_answer_on_the_shared_inbox_for_a_missing_stream_is_not_taken_as_stored()
-> Result<()> {
    let config = stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    };
    let (env, js, answered) = attacked_on(config.clone(), open_accounts()).await?;
    let relay = Relay::start_streaming(&shared_inbox_config(&env)).await?;
    let (first, _) = insert(&env, 1, 1).await?;
    wait_for_id(&js, &first[0], &relay).await?;
    // Stored past the first event before the stream goes: the events after are the window.
    env.wait_checkpoint(env.current_wal().await?, Duration::from_secs(30))
        .await?;
    let before = answered.load(Ordering::Relaxed);
    js.delete_stream(STREAM).await?;
    let (ids, bound) = insert(&env, 20, 0).await?;
    assert_held(&env, &relay, &answered, before + 1, bound).await?;
    ensure!(
        relay.log().contains("does not exist"),
        "the relay refused the answers of a missing stream; log:\n{}",
        relay.log()
    );
    js.create_stream(config).await?;
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(90), Some(&relay)).await?;
    let stored: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(
        stored, ids,
        "every event after the deletion once, in commit order"
    );
    Ok(())
}
