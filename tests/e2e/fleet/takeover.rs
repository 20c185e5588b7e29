//! Two processes with one fleet configuration, as on two hosts: each pipeline streams in one
//! of them, the pipelines spread over both, and when one is killed -9 under load the other
//! takes its pipelines within 10 s with the default settings, losing nothing.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};

use super::*;

const PIPELINES: [&str; 4] = ["t1", "t2", "t3", "t4"];

/// The pipelines the process serving `addr` streams now (its `outbox_relay_ready` is 1).
async fn streaming_at(addr: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    for name in PIPELINES {
        if pipeline_metric(addr, "outbox_relay_ready", name).await == Some(1.0) {
            out.push(name);
        }
    }
    out
}

async fn wait_for(
    what: &str,
    within: Duration,
    mut cond: impl AsyncFnMut() -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    while !cond().await {
        ensure!(
            started.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_spread_the_fleet_and_one_takes_over_the_others_pipelines_within_10s()
-> Result<()> {
    let env = Env::start().await?;
    let mut dbs = Vec::new();
    let mut pipelines = String::new();
    for name in PIPELINES {
        database_with_outbox(&env.pg, name).await?;
        let db = PipelineDb {
            url: env.pg.url(name),
            slot: format!("fleet_{name}"),
        };
        pipelines.push_str(&format!(
            r#"
[[pipeline]]
name = "{name}"
[pipeline.postgres]
url = "{url}"
slot = "fleet_{name}"
publication = "fleet_{name}"
[pipeline.nats]
stream = "TK_{upper}"
stream_subjects = ["{name}.>"]
[[pipeline.outbox]]
table = "public.outbox"
subject = "{name}.{{aggregatetype}}.{{type}}"
"#,
            url = db.url,
            upper = name.to_uppercase()
        ));
        dbs.push(db);
    }
    // Defaults for the fleet's timing: only the checkpoint is quicker, for the test's reads.
    let config = env.dir.path().join("fleet.toml");
    std::fs::write(
        &config,
        format!(
            "[fleet]\nname = \"takeover\"\n[nats]\nurl = \"{}\"\ncreate_stream = true\n[relay]\ncheckpoint_interval = \"100ms\"\n{pipelines}",
            env.nats.url()
        ),
    )?;
    let (addr_a, addr_b) = (http_listen().1, http_listen().1);
    let mut a = Relay::start_with_env(&config, &["run"], &[("RELAY_HTTP__LISTEN", &addr_a)])?;
    wait_for(
        "process A streams all four",
        Duration::from_secs(40),
        async || streaming_at(&addr_a).await.len() == 4,
    )
    .await?;
    let b = Relay::start_with_env(&config, &["run"], &[("RELAY_HTTP__LISTEN", &addr_b)])?;
    let spread = wait_for(
        "the pipelines spread two and two",
        Duration::from_secs(30),
        async || streaming_at(&addr_a).await.len() == 2 && streaming_at(&addr_b).await.len() == 2,
    )
    .await?;
    let on_b = streaming_at(&addr_b).await;
    eprintln!(
        "fleet takeover: spread 2 + 2 {:.1} s after the second process started ({on_b:?} moved)",
        spread.as_secs_f64()
    );
    // Each pipeline streams in exactly one process.
    let mut on_a = streaming_at(&addr_a).await;
    on_a.extend(on_b.iter().copied());
    on_a.sort();
    ensure!(on_a == PIPELINES, "each pipeline in one process: {on_a:?}");

    let writers: Vec<Writer> = dbs
        .iter()
        .map(|db| Writer::start(db, "Load", Duration::from_millis(20)))
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.kill9();
    let took = wait_for(
        "process B streams all four",
        Duration::from_secs(10),
        async || streaming_at(&addr_b).await.len() == 4,
    )
    .await?;
    eprintln!(
        "fleet takeover: all four streaming in B {:.1} s after A was killed",
        took.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let js = env.jetstream().await?;
    for ((name, db), writer) in PIPELINES.iter().zip(&dbs).zip(writers) {
        let written = writer.stop().await?;
        let stream = format!("TK_{}", name.to_uppercase());
        assert_delivered_once_in_order(&js, &stream, &format!("{name}."), &written.ids, &b).await?;
        let last_commit = read_stream_named(&js, &stream)
            .await?
            .last()
            .and_then(|m| parse_lsn(m.header("Outbox-Commit-Lsn")))
            .unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(20);
        while db.checkpoint().await?.unwrap_or(0) < last_commit {
            ensure!(
                Instant::now() < deadline,
                "{name}: the checkpoint never reached its last event"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
