//! Changing a running fleet (SIGHUP): a pipeline added starts, one changed drains and starts
//! again, one removed drains, stores its checkpoint and stops with its slot kept, and a bad
//! pipeline file is refused; the pipelines not concerned never pause.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use nix::sys::signal::Signal;

use super::*;

fn pipeline_file(dir: &Path, name: &str, url: &str, table: &str, extra: &str) -> Result<()> {
    std::fs::write(
        dir.join(format!("{name}.toml")),
        format!(
            r#"[postgres]
url = "{url}"
slot = "reload_{name}"
publication = "reload_{name}"
status_interval = "1s"
[nats]
stream = "RELOAD_{upper}"
stream_subjects = ["{name}.>"]
[[outbox]]
table = "{table}"
subject = "{name}.{{aggregatetype}}.{{type}}"
{extra}"#,
            upper = name.to_uppercase()
        ),
    )?;
    Ok(())
}

/// How many sessions of `slot` started streaming, from the log.
fn sessions_of(relay: &Relay, slot: &str) -> usize {
    relay
        .log()
        .lines()
        .filter(|l| l.contains(&format!("slot={slot}")) && l.contains(" streaming"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_starts_restarts_and_stops_only_the_pipelines_that_changed() -> Result<()> {
    let env = Env::start().await?;
    env.db()
        .await?
        .batch_execute("CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)")
        .await?;
    let url = env.pg.url(DB);
    let one = PipelineDb {
        url: url.clone(),
        slot: "reload_one".into(),
    };
    let dir = env.dir.path().join("pipelines");
    std::fs::create_dir(&dir)?;
    let (http, addr) = http_listen();
    let config = env.dir.path().join("fleet.toml");
    std::fs::write(
        &config,
        format!(
            "[fleet]\npipelines_dir = \"pipelines\"\n[nats]\nurl = \"{}\"\ncreate_stream = true\n[relay]\ncheckpoint_interval = \"100ms\"\nidle_checkpoint_interval = \"1s\"\nreconnect_max = \"1s\"\n{http}",
            env.nats.url()
        ),
    )?;
    pipeline_file(&dir, "one", &url, "public.outbox", "")?;
    let mut relay = Relay::start(&config)?;
    wait_pipeline_metric(
        &addr,
        "outbox_relay_ready",
        "one",
        Duration::from_secs(30),
        |v| v == 1.0,
        &relay,
    )
    .await?;
    let writer = Writer::start(&one, "One", Duration::from_millis(25));
    let js = env.jetstream().await?;

    // Added: starts; `one` goes on in the same session.
    pipeline_file(&dir, "two", &url, "public.outbox2", "")?;
    relay.signal(Signal::SIGHUP);
    wait_pipeline_metric(
        &addr,
        "outbox_relay_ready",
        "two",
        Duration::from_secs(30),
        |v| v == 1.0,
        &relay,
    )
    .await?;
    let db = env.db().await?;
    let two_event = db
        .query_one(
            "INSERT INTO outbox2 (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Two', '1', 'Made', '{}') RETURNING id::text",
            &[],
        )
        .await?
        .get::<_, String>(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !ids_in_stream(&js, "RELOAD_TWO", "two.")
        .await?
        .contains(&two_event)
    {
        ensure!(
            std::time::Instant::now() < deadline,
            "the added pipeline did not publish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A bad file: refused by name and file; the running pipelines are not touched.
    std::fs::write(dir.join("three.toml"), "[postgres\nslot = \"x\"\n")?;
    relay.signal(Signal::SIGHUP);
    relay
        .wait_log("reload: pipeline refused", Duration::from_secs(10))
        .await?;
    let three = pipeline_status(&addr, "three").await?;
    ensure!(
        three["state"] == "refused"
            && three["reason"]
                .as_str()
                .is_some_and(|r| r.contains("three.toml")),
        "three is refused naming its file: {three}"
    );
    std::fs::remove_file(dir.join("three.toml"))?;

    // Changed: `two` drains and starts again; `one` does not.
    let (one_sessions, two_sessions) = (
        sessions_of(&relay, "reload_one"),
        sessions_of(&relay, "reload_two"),
    );
    ensure!(
        one_sessions == 1 && two_sessions == 1,
        "one session each so far: {one_sessions}, {two_sessions}"
    );
    pipeline_file(
        &dir,
        "two",
        &url,
        "public.outbox2",
        "[relay]\ndrain_timeout = \"5s\"\n",
    )?;
    relay.signal(Signal::SIGHUP);
    relay
        .wait_log(
            "reload: settings changed; draining, then starting again",
            Duration::from_secs(10),
        )
        .await?;
    wait_until("two streams again", &relay, async || {
        Ok(sessions_of(&relay, "reload_two") == 2)
    })
    .await?;
    ensure!(
        pipeline_status(&addr, "three").await.is_err(),
        "the refused pipeline left /status once its file was gone"
    );

    // Removed: `one` drains and stores its checkpoint; its slot is kept.
    let written = writer.stop().await?;
    std::fs::remove_file(dir.join("one.toml"))?;
    relay.signal(Signal::SIGHUP);
    relay
        .wait_log(
            "pipeline removed: drained, checkpoint stored",
            Duration::from_secs(30),
        )
        .await?;
    assert_delivered_once_in_order(&js, "RELOAD_ONE", "one.", &written.ids, &relay).await?;
    let last = read_stream_named(&js, "RELOAD_ONE").await?;
    let last_commit = last
        .last()
        .and_then(|m| parse_lsn(m.header("Outbox-Commit-Lsn")))
        .context("the last event's commit LSN")?;
    let checkpoint = one.checkpoint().await?.unwrap_or(0);
    ensure!(
        checkpoint >= last_commit,
        "the removed pipeline stored its checkpoint through its last event: {checkpoint:X} < {last_commit:X}"
    );
    ensure!(
        one.slot_exists().await?,
        "a removed pipeline's slot is kept"
    );
    ensure!(
        pipeline_status(&addr, "one").await.is_err(),
        "one left /status"
    );
    ensure!(
        sessions_of(&relay, "reload_one") == 1 && sessions_of(&relay, "reload_two") == 2,
        "one ran one session until removed, two two (restarted once, by its change)"
    );
    let two = pipeline_status(&addr, "two").await?;
    ensure!(two["ready"] == true, "two streams on: {two}");

    relay.signal(Signal::SIGTERM);
    let status = relay.wait_exit(Duration::from_secs(30)).await?;
    ensure!(status.code() == Some(0), "exit {status:?}");
    Ok(())
}
