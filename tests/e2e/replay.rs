//! Going back in time: `outbox-relay position` maps a commit LSN or time to the first
//! stream sequence to replay from, through the position map or, pruned, a search of the stream;
//! `outbox-relay replay` points a durable consumer there. Real PostgreSQL, NATS and relay.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use async_nats::jetstream::{self, consumer};
use futures::StreamExt as _;
use outbox_contract::HEADER_EXPECTED_LAST_MSG_ID;
use serde_json::Value;

use crate::support::*;

mod in_place;

/// Runs the binary with `args` (after `--config`).
fn relay_cmd(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run outbox-relay")
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs the binary and returns its stdout; fails unless it exits 0.
fn ok(config: &Path, args: &[&str]) -> Result<String> {
    let out = relay_cmd(config, args);
    ensure!(out.status.success(), "{args:?}: {}", describe(&out));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `position … --json`.
fn position(config: &Path, args: &[&str]) -> Result<Value> {
    let mut all = vec!["position", "--json"];
    all.extend_from_slice(args);
    let text = ok(config, &all)?;
    serde_json::from_str(&text).with_context(|| format!("position output: {text}"))
}

/// One relay event as stored: sequence, commit LSN (as a number and as text), commit time, id.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ev {
    seq: u64,
    lsn: u64,
    lsn_text: String,
    time: String,
    id: String,
}

fn ev(m: &Received) -> Ev {
    Ev {
        seq: m.seq,
        lsn: parse_lsn(m.header("Outbox-Commit-Lsn")).unwrap_or_default(),
        lsn_text: m.header("Outbox-Commit-Lsn").to_owned(),
        time: m.header("Outbox-Commit-Time").to_owned(),
        id: m.id().to_owned(),
    }
}

/// Inserts `n` events, one transaction each; returns their ids.
async fn insert(db: &tokio_postgres::Client, n: usize, tag: &str) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(insert_event(db, "Order", "Created", &format!(r#"{{"{tag}": {i}}}"#)).await?);
    }
    Ok(ids)
}

/// Waits until the stream holds `n` messages and the relay's checkpoint is past the last
/// commit (so the position map covers them); returns the events in stream order.
async fn settled(env: &Env, js: &jetstream::Context, n: usize, relay: &Relay) -> Result<Vec<Ev>> {
    let stored = wait_for_messages(js, n, Duration::from_secs(60), Some(relay)).await?;
    let events: Vec<Ev> = stored.iter().map(ev).collect();
    let last = events.iter().map(|e| e.lsn).max().unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.checkpoint().await?.unwrap_or_default() <= last {
        ensure!(Instant::now() < deadline, "checkpoint never passed {last}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(events)
}

/// Pulls and acks everything durable `name` delivers until `expect` messages arrived and then
/// nothing more for a moment (or 30 s passed).
async fn drain(js: &jetstream::Context, name: &str, expect: usize) -> Result<Vec<Ev>> {
    let stream = js.get_stream(STREAM).await?;
    let consumer: consumer::PullConsumer = stream
        .get_consumer(name)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(100)
            .expires(Duration::from_millis(700))
            .messages()
            .await?;
        let mut got = 0;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| anyhow::anyhow!(e))?;
            got += 1;
            let headers = |name: &str| {
                m.headers
                    .as_ref()
                    .and_then(|h| h.get(name))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default()
            };
            out.push(Ev {
                seq: m.info().map(|i| i.stream_sequence).unwrap_or_default(),
                lsn: parse_lsn(&headers("Outbox-Commit-Lsn")).unwrap_or_default(),
                lsn_text: headers("Outbox-Commit-Lsn"),
                time: headers("Outbox-Commit-Time"),
                id: headers("Nats-Msg-Id"),
            });
            m.ack().await.map_err(|e| anyhow::anyhow!(e))?;
        }
        if got == 0 && (out.len() >= expect || Instant::now() > deadline) {
            return Ok(out);
        }
    }
}

/// Every event of `all` committed at or after `x` arrived exactly once, in commit order, and
/// nothing committed before it.
fn assert_exactly_from(got: &[Ev], all: &[Ev], x: u64, what: &str) {
    let mut want: Vec<&Ev> = all.iter().filter(|e| e.lsn >= x).collect();
    want.sort_by_key(|e| e.lsn);
    let want: Vec<&str> = want.iter().map(|e| e.id.as_str()).collect();
    let ids: Vec<&str> = got.iter().map(|e| e.id.as_str()).collect();
    assert!(
        got.first().is_some_and(|e| e.lsn >= x),
        "{what}: the first delivered event is committed before {x:X}: {got:?}"
    );
    assert_eq!(
        ids, want,
        "{what}: exactly the events from {x:X}, in commit order"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn position_finds_the_first_event_from_x_through_the_map_and_through_the_stream() -> Result<()>
{
    let env = Env::start().await?;
    // A 1 s duplicate window: a copy published later is stored a second time.
    let config = env.config_full("create_stream = true\nduplicate_window = \"1s\"", "");
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    insert(&db, 40, "n").await?;
    let js = env.jetstream().await?;
    let events = settled(&env, &js, 40, &relay).await?;
    let x = &events[17];

    // Through the position map.
    let p = position(&config, &["--lsn", &x.lsn_text])?;
    assert_eq!(p["sequence"], x.seq, "{p}");
    assert_eq!(p["method"], "position_map", "{p}");
    assert_eq!(p["found"]["event_id"], x.id.as_str(), "{p}");
    let how = p["how"].as_str().unwrap_or_default();
    assert!(how.starts_with("found via position map anchor ("), "{how}");
    assert!(how.contains("messages scanned"), "{how}");
    let t = position(&config, &["--time", &events[25].time])?;
    assert_eq!(t["sequence"], events[25].seq, "{t}");
    assert_eq!(t["method"], "position_map", "{t}");
    // The text form says the same.
    let text = ok(&config, &["position", "--lsn", &x.lsn_text])?;
    assert!(text.starts_with(&format!("sequence {}\n", x.seq)), "{text}");
    assert!(text.contains("found via position map anchor"), "{text}");

    // Second copies of events 15..20, stored at the end of the stream past the window: the
    // answer stays the first copy, and everything from x follows it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stored = read_stream(&js).await?;
    for m in &stored[15..20] {
        let mut headers = async_nats::HeaderMap::new();
        // The stored copy's commit-order condition named the event before it, which is not
        // the stream's last message now: a copy publishes without it.
        for (k, v) in m
            .headers
            .iter()
            .filter(|(k, _)| *k != HEADER_EXPECTED_LAST_MSG_ID)
        {
            headers.insert(k.as_str(), v.as_str());
        }
        let ack = js
            .publish_with_headers(m.subject.clone(), headers, m.payload.clone().into())
            .await?
            .await?;
        assert!(!ack.duplicate, "past the window: stored again");
    }
    let p = position(&config, &["--lsn", &x.lsn_text])?;
    assert_eq!(p["sequence"], x.seq, "with second copies: {p}");
    let p = position(&config, &["--lsn", &x.lsn_text, "--no-map"])?;
    assert_eq!(p["sequence"], x.seq, "with second copies, stream only: {p}");

    // The map pruned: the stream search, with a bounded number of direct gets.
    env.db()
        .await?
        .execute("DELETE FROM outbox_relay.position_map", &[])
        .await?;
    let p = position(&config, &["--lsn", &x.lsn_text])?;
    assert_eq!(p["sequence"], x.seq, "map pruned: {p}");
    assert_eq!(p["method"], "stream_bisection", "{p}");
    let gets = p["direct_gets"].as_u64().unwrap_or_default();
    assert!((1..=64).contains(&gets), "{p}");
    assert!(
        p["how"]
            .as_str()
            .unwrap_or_default()
            .contains("direct gets"),
        "{p}"
    );
    let t = position(&config, &["--time", &events[25].time])?;
    assert_eq!(t["sequence"], events[25].seq, "map pruned, by time: {t}");
    assert_eq!(t["method"], "stream_stored_time", "{t}");
    // Before everything and after everything.
    let first = position(&config, &["--lsn", "0/1"])?;
    assert_eq!(first["sequence"], events[0].seq, "{first}");
    let past = format!("{:X}/0", (events[39].lsn >> 32) + 1);
    let p = position(&config, &["--lsn", &past])?;
    let last = last_sequence(&js).await?;
    assert_eq!(p["sequence"], last + 1, "the next one stored: {p}");
    assert!(p["found"].is_null(), "{p}");

    // The relay writes anchors again after the prune, and the lookup uses them.
    insert(&db, 5, "later").await?;
    let later = settled(&env, &js, 40 + 5 + 5, &relay).await?;
    let y = later.iter().max_by_key(|e| e.lsn).context("events")?;
    let p = position(&config, &["--lsn", &y.lsn_text])?;
    assert_eq!(p["sequence"], y.seq, "{p}");
    assert_eq!(p["method"], "position_map", "{p}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_by_lsn_and_by_time_lands_exactly_the_events_from_x() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    insert(&db, 30, "n").await?;
    let js = env.jetstream().await?;
    let events = settled(&env, &js, 30, &relay).await?;

    let x = &events[11];
    let dry = ok(
        &config,
        &[
            "replay",
            "--from-lsn",
            &x.lsn_text,
            "--consumer",
            "by-lsn",
            "--dry-run",
        ],
    )?;
    assert!(dry.contains(&format!("from sequence {}", x.seq)), "{dry}");
    assert!(dry.contains(": 19 messages"), "{dry}");
    assert!(dry.contains("dry run"), "{dry}");
    let stream = js.get_stream(STREAM).await?;
    assert!(
        stream.consumer_info("by-lsn").await.is_err(),
        "a dry run creates nothing"
    );
    // --until bounds the count.
    let dry = ok(
        &config,
        &[
            "replay",
            "--from-lsn",
            &x.lsn_text,
            "--until",
            &events[20].lsn_text,
            "--consumer",
            "by-lsn",
            "--dry-run",
        ],
    )?;
    assert!(dry.contains(": 9 messages"), "{dry}");

    let out = ok(
        &config,
        &["replay", "--from-lsn", &x.lsn_text, "--consumer", "by-lsn"],
    )?;
    assert!(out.contains("created durable consumer by-lsn"), "{out}");
    let got = drain(&js, "by-lsn", 19).await?;
    assert_exactly_from(&got, &events, x.lsn, "by LSN");

    let t = &events[20];
    ok(
        &config,
        &["replay", "--since", &t.time, "--consumer", "by-time"],
    )?;
    let got = drain(&js, "by-time", 10).await?;
    assert_exactly_from(&got, &events, t.lsn, "by time");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_while_the_relay_keeps_publishing() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    insert(&db, 20, "before").await?;
    let js = env.jetstream().await?;
    let events = settled(&env, &js, 20, &relay).await?;
    let x = events[8].clone();

    // A service's durable that has read everything so far.
    let stream = js.get_stream(STREAM).await?;
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let all = drain(&js, "billing", 20).await?;
    assert_eq!(all.len(), 20);

    // Events keep coming while the replays are set up.
    let writer = {
        let db = env.db().await?;
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..25 {
                ids.push(
                    insert_event(&db, "Order", "Created", &format!(r#"{{"live": {i}}}"#)).await?,
                );
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            anyhow::Ok(ids)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A new consumer.
    ok(
        &config,
        &["replay", "--from-lsn", &x.lsn_text, "--consumer", "audit"],
    )?;
    // An existing one: a dry run says what would happen; then reset in place (nats-server
    // 2.14+), or, on older servers, refused without --yes and then deleted and re-created at x.
    let in_place = in_place::has_reset_api(&js);
    let dry = ok(
        &config,
        &[
            "replay",
            "--from-lsn",
            &x.lsn_text,
            "--consumer",
            "billing",
            "--dry-run",
        ],
    )?;
    let would = if in_place {
        "replay would reset it in place"
    } else {
        "replay would delete it and create it again"
    };
    assert!(dry.contains(would), "{dry}");
    assert!(dry.contains("dry run: nothing changed"), "{dry}");
    if !in_place {
        let refused = relay_cmd(
            &config,
            &["replay", "--from-lsn", &x.lsn_text, "--consumer", "billing"],
        );
        assert!(!refused.status.success(), "{}", describe(&refused));
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("--yes"),
            "{}",
            describe(&refused)
        );
    }
    let out = ok(
        &config,
        &[
            "replay",
            "--from-lsn",
            &x.lsn_text,
            "--consumer",
            "billing",
            "--yes",
        ],
    )?;
    let done = if in_place {
        "reset durable consumer billing in place"
    } else {
        "deleted and re-created durable consumer billing"
    };
    assert!(out.contains(done), "{out}");
    let live = writer.await??;
    let everything = settled(&env, &js, 45, &relay).await?;
    for name in ["audit", "billing"] {
        let got = drain(&js, name, 45 - 8).await?;
        assert_exactly_from(&got, &everything, x.lsn, name);
        let last: Vec<&str> = got
            .iter()
            .rev()
            .take(live.len())
            .map(|e| e.id.as_str())
            .collect();
        let mut expected: Vec<&str> = live.iter().map(String::as_str).collect();
        expected.reverse();
        assert_eq!(
            last, expected,
            "{name}: the live events follow the replayed ones"
        );
    }
    // A consumer that has not acknowledged everything before the new start is not moved past it.
    let ahead = format!(
        "{:X}/0",
        (everything.iter().map(|e| e.lsn).max().unwrap_or(0) >> 32) + 1
    );
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("slow".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let skip = relay_cmd(
        &config,
        &[
            "replay",
            "--from-lsn",
            &ahead,
            "--consumer",
            "slow",
            "--yes",
        ],
    );
    assert_eq!(skip.status.code(), Some(65), "{}", describe(&skip));
    assert!(
        String::from_utf8_lossy(&skip.stderr).contains("would skip them"),
        "{}",
        describe(&skip)
    );
    if stream.consumer_info("slow").await.is_err() {
        bail!("the refused replay must leave the consumer alone");
    }
    Ok(())
}
