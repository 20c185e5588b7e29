//! `outbox-relay verify`: every event committed in a window checked against the stream by the
//! WAL itself; messages deleted behind the relay's back are found by id, a restore brings them
//! back, and a window whose WAL is gone is never reported as "no gap".

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use async_nats::jetstream::stream::Config;

use crate::support::*;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_finds_messages_deleted_behind_the_relay_and_a_restore_heals_them() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    // A short duplicate window: the heal does not wait minutes for JetStream to forget the ids.
    js.create_stream(Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        duplicate_window: Duration::from_secs(1),
        ..Default::default()
    })
    .await?;
    let config = env.config("replay_retention = \"1GB\"");
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(insert_event(&db, "Order", "Placed", &format!(r#"{{"n":{i}}}"#)).await?);
    }
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(30), Some(&relay)).await?;
    let first = got[0].header("Outbox-Commit-Lsn").to_owned();
    let last = parse_lsn(got[19].header("Outbox-Commit-Lsn")).context("commit LSN")?;
    env.wait_checkpoint(last, Duration::from_secs(20)).await?;

    let out = relay_cmd(&config, &["verify", "--from-lsn", &first]).await?;
    ensure!(
        out.status.code() == Some(0) && text(&out).contains("verified: every event"),
        "nothing deleted yet: {}",
        text(&out)
    );

    // Three messages deleted by hand.
    let stream = js.get_stream(STREAM).await?;
    let deleted: Vec<&Received> = [4usize, 9, 14].iter().map(|&i| &got[i]).collect();
    for m in &deleted {
        stream.delete_message(m.seq).await?;
    }
    let checkpoint_before = env.checkpoint().await?.unwrap_or(0);
    let out = relay_cmd(&config, &["verify", "--from-lsn", &first]).await?;
    let said = text(&out);
    ensure!(out.status.code() == Some(65), "a gap exits 65: {said}");
    let missing: Vec<&str> = said
        .lines()
        .filter_map(|l| l.strip_prefix("MISSING  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let expected: Vec<&str> = deleted.iter().map(|m| m.id()).collect();
    ensure!(
        missing == expected,
        "the deleted events, by id: {missing:?} vs {expected:?}\n{said}"
    );
    ensure!(said.contains("outbox-relay restore --from-lsn"), "{said}");
    let out = relay_cmd(&config, &["verify", "--from-lsn", &first, "--json"]).await?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(doc["missing_count"] == 3, "{doc}");

    // The restore publishes them again (once the duplicate window has passed); then no gap.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = relay_cmd(&config, &["restore", "--from-lsn", &first]).await?;
    ensure!(out.status.code() == Some(0), "restore: {}", text(&out));
    let out = relay_cmd(&config, &["verify", "--from-lsn", &first]).await?;
    ensure!(out.status.code() == Some(0), "healed: {}", text(&out));
    let now = read_stream(&js).await?;
    let mut stored: Vec<&str> = now.iter().map(Received::id).collect();
    stored.sort();
    let mut all: Vec<&str> = ids.iter().map(String::as_str).collect();
    all.sort();
    ensure!(stored == all, "every event once after the heal");
    ensure!(
        env.checkpoint().await?.unwrap_or(0) >= checkpoint_before,
        "the checkpoint never moved back"
    );

    // A window the slot keeps no WAL for: it says so, and never "verified".
    let out = relay_cmd(&config, &["verify", "--from-lsn", "0/100"]).await?;
    let said = text(&out);
    ensure!(
        out.status.code() != Some(0)
            && said.contains("cannot verify")
            && !said.contains("verified:"),
        "an unchecked window is not a clean one: {said}"
    );
    drop(relay);
    Ok(())
}

/// The stream re-created under a stopped relay (its sequence back to 0): the next start says the
/// stream went back behind events it confirmed, counts it, and names the `verify` that finds
/// them, which does.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_gone_back_behind_confirmed_events_is_said_at_the_next_start() -> Result<()> {
    let env = Env::start().await?;
    let (http, addr) = http_listen();
    let config = env.config(&format!("replay_retention = \"1GB\"\n{http}"));
    let mut relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    for i in 0..10 {
        insert_event(&db, "Order", "Placed", &format!(r#"{{"n":{i}}}"#)).await?;
    }
    let js = env.jetstream().await?;
    let got = wait_for_messages(&js, 10, Duration::from_secs(30), Some(&relay)).await?;
    let last = parse_lsn(got[9].header("Outbox-Commit-Lsn")).context("commit LSN")?;
    env.wait_checkpoint(last, Duration::from_secs(20)).await?;
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(30)).await?;

    let info = js.get_stream(STREAM).await?.cached_info().config.clone();
    js.delete_stream(STREAM).await?;
    js.create_stream(info).await?;
    let relay = Relay::start_streaming(&config).await?;
    relay
        .wait_log(
            "re-created, reset or lost its tail",
            Duration::from_secs(20),
        )
        .await?;
    ensure!(
        metric(&addr, "outbox_relay_stream_went_back_total").await? == 1.0,
        "counted once"
    );
    let log = relay.log();
    let from = log
        .split("verify --from-lsn ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .context("the log names where to verify from")?
        .to_owned();
    let out = relay_cmd(&config, &["verify", "--from-lsn", &from]).await?;
    let said = text(&out);
    ensure!(
        out.status.code() == Some(65)
            && said.lines().filter(|l| l.starts_with("MISSING")).count() == 10,
        "verify finds the 10 events the stream lost: {said}"
    );
    Ok(())
}

/// The continuous audit with `audit_heal`: messages deleted behind the relay's back are found by
/// the next audit (the metric says how many), published again from the WAL once the duplicate
/// window let go of their ids, and the next audit finds none missing; positions never go back.
#[tokio::test(flavor = "multi_thread")]
async fn the_audit_finds_deleted_messages_and_heals_them() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    js.create_stream(Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        duplicate_window: Duration::from_secs(1),
        ..Default::default()
    })
    .await?;
    let (http, addr) = http_listen();
    let config = env.config(&format!(
        "replay_retention = \"1GB\"\naudit_interval = \"1s\"\naudit_heal = true\n{http}"
    ));
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(insert_event(&db, "Order", "Placed", &format!(r#"{{"n":{i}}}"#)).await?);
    }
    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(30), Some(&relay)).await?;
    let last = parse_lsn(got[19].header("Outbox-Commit-Lsn")).context("commit LSN")?;
    env.wait_checkpoint(last, Duration::from_secs(20)).await?;
    wait_until("a clean audit", &relay, async || {
        Ok(metric(&addr, "outbox_relay_audit_runs_total").await? >= 1.0)
    })
    .await?;
    let stream = js.get_stream(STREAM).await?;
    for i in [3usize, 11] {
        stream.delete_message(got[i].seq).await?;
    }
    let checkpoint_before = env.checkpoint().await?.unwrap_or(0);
    relay
        .wait_log(
            "confirmed events are missing from stream",
            Duration::from_secs(30),
        )
        .await?;
    ensure!(
        relay.log().contains(got[3].id()),
        "the audit names the first missing event; log:\n{}",
        relay.log()
    );
    wait_until("every event back in the stream", &relay, async || {
        let now = read_stream(&js).await?;
        let mut stored: Vec<&str> = now.iter().map(Received::id).collect();
        stored.sort();
        let mut all: Vec<&str> = ids.iter().map(String::as_str).collect();
        all.sort();
        Ok(stored == all)
    })
    .await?;
    wait_until("an audit finding none missing", &relay, async || {
        Ok(
            metric(&addr, "outbox_relay_audit_missing_events").await? == 0.0
                && metric(&addr, "outbox_relay_audit_healed_events_total").await? >= 2.0,
        )
    })
    .await?;
    ensure!(
        env.checkpoint().await?.unwrap_or(0) >= checkpoint_before,
        "the checkpoint never moved back"
    );
    let out = relay_cmd(&config, &["status"]).await?;
    let said = text(&out);
    ensure!(
        said.contains("audit: ") && said.contains("0 events missing at the last"),
        "status shows the audit: {said}"
    );
    Ok(())
}
