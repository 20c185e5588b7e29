//! Three pipelines on two PostgreSQL servers and two streams, in one process: a server killed
//! and brought back, a stream full, a row that must stop its pipeline. Each fault stays with
//! its pipeline while the others stream; every event arrives once, in commit order, and no
//! position moves past an event the broker did not acknowledge.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use async_nats::jetstream::stream::{Config, DiscardPolicy};
use nix::sys::signal::Signal;

use super::*;

/// Messages stream `FLEET_A` holds before it refuses new ones.
const LIMIT: i64 = 120;
const EVERY: Duration = Duration::from_millis(25);

fn pipeline(name: &str, url: &str, stream: &str, subject: &str) -> String {
    format!(
        r#"
[[pipeline]]
name = "{name}"
[pipeline.postgres]
url = "{url}"
slot = "fleet_{name}"
publication = "fleet_{name}"
status_interval = "1s"
[pipeline.nats]
stream = "{stream}"
stream_subjects = ["{prefix}.>"]
[[pipeline.outbox]]
table = "public.outbox"
subject = "{subject}.{{aggregatetype}}.{{type}}"
"#,
        prefix = subject.split('.').next().unwrap_or(subject)
    )
}

/// Asserts `prefix`'s count in `stream` grows within 10 s (its pipeline streams on).
async fn grows(
    js: &async_nats::jetstream::Context,
    stream: &str,
    prefix: &str,
    what: &str,
) -> Result<()> {
    let before = count_in_stream(js, stream, prefix).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while count_in_stream(js, stream, prefix).await? <= before {
        ensure!(
            Instant::now() < deadline,
            "{prefix} stayed at {before} messages {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn three_pipelines_each_ride_out_their_own_fault_while_the_others_stream() -> Result<()> {
    let env = Env::start().await?;
    let mut pg_b = relay_testkit::PostgresServer::start().await?;
    database_with_outbox(&env.pg, "app2").await?;
    database_with_outbox(&pg_b, "app").await?;
    let a = PipelineDb {
        url: env.pg.url("app"),
        slot: "fleet_a".into(),
    };
    let b = PipelineDb {
        url: env.pg.url("app2"),
        slot: "fleet_b".into(),
    };
    let c = PipelineDb {
        url: pg_b.url("app"),
        slot: "fleet_c".into(),
    };
    // FLEET_A fills up after LIMIT messages; FLEET_B is shared by b and c.
    let js = env.jetstream().await?;
    js.create_stream(Config {
        name: "FLEET_A".into(),
        subjects: vec!["fa.>".into()],
        max_messages: LIMIT,
        discard: DiscardPolicy::New,
        ..Default::default()
    })
    .await?;
    let (http, addr) = http_listen();
    let text = format!(
        r#"
[nats]
url = "{nats}"
ack_timeout = "3s"
create_stream = true
[relay]
checkpoint_interval = "100ms"
idle_checkpoint_interval = "1s"
reconnect_max = "1s"
{http}
{pa}{pb}{pc}"#,
        nats = env.nats.url(),
        pa = pipeline("a", &a.url, "FLEET_A", "fa"),
        pb = pipeline("b", &b.url, "FLEET_B", "fb.b"),
        pc = pipeline("c", &c.url, "FLEET_B", "fb.c"),
    );
    let config = env.dir.path().join("fleet.toml");
    std::fs::write(&config, text)?;
    let mut relay = Relay::start(&config)?;
    for name in ["a", "b", "c"] {
        wait_pipeline_metric(
            &addr,
            "outbox_relay_ready",
            name,
            Duration::from_secs(30),
            |v| v == 1.0,
            &relay,
        )
        .await?;
    }
    let writer_b = Writer::start(&b, "B", EVERY);
    let writer_c = Writer::start(&c, "C", EVERY);
    grows(&js, "FLEET_B", "fb.c.", "before any fault").await?;

    // 1. PostgreSQL B killed -9: c waits for it; a and b stream on.
    writer_c.pause();
    tokio::time::sleep(Duration::from_millis(200)).await;
    pg_b.kill9()?;
    wait_pipeline_metric(
        &addr,
        "outbox_relay_ready",
        "c",
        Duration::from_secs(20),
        |v| v == 0.0,
        &relay,
    )
    .await?;
    grows(&js, "FLEET_B", "fb.b.", "while PostgreSQL B was down").await?;
    let c_during = pipeline_status(&addr, "c").await?;
    ensure!(
        c_during["ready"] == false && c_during["reasons"].to_string().contains("not streaming"),
        "c says why it is not ready: {c_during}"
    );
    pg_b.start_again().await?;
    writer_c.resume();
    wait_pipeline_metric(
        &addr,
        "outbox_relay_ready",
        "c",
        Duration::from_secs(30),
        |v| v == 1.0,
        &relay,
    )
    .await?;
    grows(&js, "FLEET_B", "fb.c.", "after PostgreSQL B came back").await?;

    // 2. FLEET_A full: a holds its events; b and c stream on; a's positions stay put.
    let writer_a = Writer::start(&a, "A", EVERY);
    wait_pipeline_metric(
        &addr,
        "outbox_relay_stream_full",
        "a",
        Duration::from_secs(60),
        |v| v == 1.0,
        &relay,
    )
    .await?;
    // While full: a's positions may creep over WAL written before its first refused event, never
    // onto or past that event's commit (checked once it is published and its commit LSN known).
    let a_full = (a.checkpoint().await?, a.slot_confirmed().await?);
    grows(&js, "FLEET_B", "fb.b.", "while FLEET_A was full").await?;
    grows(&js, "FLEET_B", "fb.c.", "while FLEET_A was full").await?;
    let a_later = (a.checkpoint().await?, a.slot_confirmed().await?);
    let a_while_full = [a_full.0, a_full.1, a_later.0, a_later.1]
        .into_iter()
        .map(Option::unwrap_or_default)
        .max()
        .unwrap_or_default();
    let held = count_in_stream(&js, "FLEET_A", "fa.").await?;
    ensure!(
        held == LIMIT as usize,
        "FLEET_A held {held} of {LIMIT} while full"
    );
    let mut raised = js.get_stream("FLEET_A").await?.info().await?.config.clone();
    raised.max_messages = -1;
    js.update_stream(raised).await?;
    wait_pipeline_metric(
        &addr,
        "outbox_relay_stream_full",
        "a",
        Duration::from_secs(30),
        |v| v == 0.0,
        &relay,
    )
    .await?;

    // 3. A row b cannot route, no dead-letter subject: b stops before its transaction; a and c
    // stream on, and the process with them.
    writer_b.pause();
    let b_written = writer_b.stop().await?;
    let bad = insert_unroutable(&b.client().await?, r#"{"bad": true}"#).await?;
    let after_bad = insert_event(&b.client().await?, "B", "Held", "{}").await?;
    relay
        .wait_log(
            "pipeline stopped; the others go on",
            Duration::from_secs(30),
        )
        .await?;
    let b_status = pipeline_status(&addr, "b").await?;
    ensure!(
        b_status["state"] == "stopped" && b_status["kind"] == "data-safety",
        "b is stopped as a data-safety stop: {b_status}"
    );
    ensure!(
        b_status["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&bad)),
        "b's reason names the row: {b_status}"
    );
    grows(&js, "FLEET_A", "fa.", "after b stopped").await?;
    grows(&js, "FLEET_B", "fb.c.", "after b stopped").await?;
    ensure!(relay.try_status()?.is_none(), "the process exited with b");

    let a_written = writer_a.stop().await?;
    let c_written = writer_c.stop().await?;
    assert_delivered_once_in_order(&js, "FLEET_A", "fa.", &a_written.ids, &relay).await?;
    assert_delivered_once_in_order(&js, "FLEET_B", "fb.b.", &b_written.ids, &relay).await?;
    assert_delivered_once_in_order(&js, "FLEET_B", "fb.c.", &c_written.ids, &relay).await?;
    let first_refused = read_stream_named(&js, "FLEET_A")
        .await?
        .get(LIMIT as usize)
        .and_then(|m| parse_lsn(m.header("Outbox-Commit-Lsn")))
        .context("the commit LSN of a's first event after FLEET_A filled up")?;
    ensure!(
        a_while_full <= first_refused,
        "a confirmed {a_while_full:X} while FLEET_A was full, onto or past its first refused event's commit {first_refused:X}"
    );
    let b_ids = ids_in_stream(&js, "FLEET_B", "fb.b.").await?;
    ensure!(
        !b_ids.contains(&bad) && !b_ids.contains(&after_bad),
        "nothing of b past the row it stopped at was published"
    );

    // Positions: b's not past the stopped transaction; a's and c's at their last events.
    let log = relay.log();
    let b_commit = stopped_commit_lsn(&log, &bad)?;
    let (b_checkpoint, b_slot) = (
        b.checkpoint().await?.unwrap_or(0),
        b.slot_confirmed().await?.unwrap_or(0),
    );
    ensure!(
        b_checkpoint > 0 && b_checkpoint <= b_commit && b_slot <= b_commit,
        "b confirmed past the row it stopped at: checkpoint {b_checkpoint:X}, slot {b_slot:X}, commit {b_commit:X}"
    );
    for (name, db, written) in [("a", &a, &a_written), ("c", &c, &c_written)] {
        let last = *written.after.last().unwrap_or(&0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (checkpoint, slot) = (
                db.checkpoint().await?.unwrap_or(0),
                db.slot_confirmed().await?.unwrap_or(0),
            );
            if checkpoint >= last && slot >= last {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{name}: checkpoint {checkpoint:X} / slot {slot:X} never reached its last event's {last:X}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    eprintln!(
        "fleet faults: a {} events (FLEET_A held {LIMIT} while full), b {} before its bad row, c {} around PostgreSQL B's kill",
        a_written.ids.len(),
        b_written.ids.len(),
        c_written.ids.len()
    );

    // A clean stop: the stopped pipeline does not change the exit code.
    relay.signal(Signal::SIGTERM);
    let status = relay.wait_exit(Duration::from_secs(30)).await?;
    ensure!(status.code() == Some(0), "exit {status:?}");
    Ok(())
}

/// `--fail-fast` keeps one relay's behaviour in a fleet: the first fatal condition of any
/// pipeline ends the process with its exit code, after the others drained.
#[tokio::test(flavor = "multi_thread")]
async fn with_fail_fast_a_pipelines_fatal_stop_ends_the_process_with_its_code() -> Result<()> {
    let env = Env::start().await?;
    database_with_outbox(&env.pg, "app2").await?;
    let a = PipelineDb {
        url: env.pg.url("app"),
        slot: "fleet_a".into(),
    };
    let b = PipelineDb {
        url: env.pg.url("app2"),
        slot: "fleet_b".into(),
    };
    let (http, addr) = http_listen();
    let text = format!(
        "[nats]\nurl = \"{}\"\ncreate_stream = true\n[relay]\ncheckpoint_interval = \"100ms\"\n{http}\n{}{}",
        env.nats.url(),
        pipeline("a", &a.url, "FF_A", "ffa"),
        pipeline("b", &b.url, "FF_B", "ffb"),
    );
    let config = env.dir.path().join("fleet.toml");
    std::fs::write(&config, text)?;
    let mut relay = Relay::start_with_args(&config, &["run", "--fail-fast"])?;
    for name in ["a", "b"] {
        wait_pipeline_metric(
            &addr,
            "outbox_relay_ready",
            name,
            Duration::from_secs(30),
            |v| v == 1.0,
            &relay,
        )
        .await?;
    }
    let bad = insert_unroutable(&b.client().await?, r#"{"bad": true}"#).await?;
    let log = expect_exit(
        &mut relay,
        65,
        Duration::from_secs(30),
        &["pipeline `b`", &bad],
    )
    .await?;
    let commit = stopped_commit_lsn(&log, &bad)?;
    let checkpoint = b.checkpoint().await?.unwrap_or(0);
    ensure!(checkpoint <= commit, "b confirmed past its bad row");
    Ok(())
}
