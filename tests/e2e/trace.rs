//! `outbox-relay trace`: one event followed from its row to each consumer and the consumers'
//! ledger, against real servers, for each outcome it reports.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use async_nats::jetstream::consumer;
use futures::{FutureExt as _, StreamExt as _};
use outbox_consumer::{Consumer, handler_fn};
use serde_json::Value;

use crate::support::{DB, Env, Relay, STREAM, insert_event, wait_for_id};

/// Runs `outbox-relay trace <id>` with `extra` arguments; its stdout, asserting exit 0.
fn run_trace(config: &std::path::Path, id: &str, extra: &[&str]) -> Result<Vec<u8>> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "--config",
            config.to_str().context("config path")?,
            "trace",
            id,
        ])
        .args(extra)
        .output()?;
    ensure!(
        out.status.success(),
        "trace exited {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// Runs `outbox-relay trace <id> --json` and parses its answer; asserts exit 0.
fn trace(config: &std::path::Path, id: &str) -> Result<Value> {
    serde_json::from_slice(&run_trace(config, id, &["--json"])?).context("trace --json output")
}

/// Runs `outbox-relay trace <id>` (text), asserts exit 0 and that it says `needle`, and keeps
/// the answer as `target/test-artifacts/trace/<name>.txt` (docs/operations.md shows them).
fn keep_text(config: &std::path::Path, id: &str, name: &str, needle: &str) -> Result<()> {
    let text = String::from_utf8_lossy(&run_trace(config, id, &[])?).into_owned();
    ensure!(
        text.contains(needle),
        "trace {id} lacks {needle:?}:\n{text}"
    );
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts/trace");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{name}.txt")), text)?;
    Ok(())
}

/// A consumer's entry in a trace answer.
fn consumer_state<'a>(answer: &'a Value, name: &str) -> Result<&'a Value> {
    answer["consumers"]
        .as_array()
        .context("consumers")?
        .iter()
        .find(|c| c["name"] == name)
        .with_context(|| format!("no consumer {name} in {answer:#}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_follows_an_event_to_each_consumer_and_the_ledger() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config("");
    let mut relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let id = insert_event(&db, "order", "created", r#"{"n":1}"#).await?;
    wait_for_id(&js, &id, &relay).await?;
    let mut stream = js.get_stream(STREAM).await?;
    let seq = stream.info().await?.state.last_sequence;

    // `audit` never reads; `shipping` reads and does not acknowledge; `billing` (the consumer
    // library) applies it and records it in the ledger of the relay's database.
    for (name, filter) in [("audit", "outbox.order.>"), ("shipping", "outbox.>")] {
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(name.into()),
                filter_subject: filter.into(),
                ack_wait: Duration::from_secs(300),
                ..Default::default()
            })
            .await?;
    }
    let shipping: consumer::PullConsumer = stream
        .get_consumer("shipping")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut batch = shipping.fetch().max_messages(1).messages().await?;
    let held = batch
        .next()
        .await
        .context("shipping got nothing")?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(held.info().map_err(anyhow::Error::msg)?.stream_sequence == seq);
    // A consumer whose filter does not cover the subject is not listed.
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("payments".into()),
            filter_subject: "outbox.payment.>".into(),
            ..Default::default()
        })
        .await?;
    let ledger_db: tokio_postgres::Config = env.pg.url(DB).parse()?;
    let billing = Consumer::builder(js.clone(), ledger_db, "billing")
        .stream(STREAM)
        .subjects(["outbox.order.>"])
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(billing.run(
        handler_fn(|_tx, _event| async { Ok(()) }.boxed()),
        async move {
            let _ = stopped.await;
        },
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let applied: i64 = db
            .query_one(
                "SELECT count(*) FROM outbox_consumer_ledger WHERE event_id = $1",
                &[&id],
            )
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        let billing_info = stream.consumer_info("billing").await.ok();
        if applied == 1 && billing_info.is_some_and(|i| i.ack_floor.stream_sequence >= seq) {
            break;
        }
        ensure!(Instant::now() < deadline, "billing did not apply {id}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), running).await;

    // `refunds` cannot decode it and parks it on its dead-letter subject (`dlq.refunds`, in a
    // stream of its own): acknowledged by TERM, not applied.
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "DLQ".into(),
        subjects: vec!["dlq.>".into()],
        ..Default::default()
    })
    .await?;
    let refunds = Consumer::builder(
        js.clone(),
        env.pg.url(DB).parse::<tokio_postgres::Config>()?,
        "refunds",
    )
    .stream(STREAM)
    .subjects(["outbox.order.>"])
    .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(refunds.run(
        handler_fn(|_tx, _event| {
            async { Err(outbox_consumer::Permanent::new("unknown currency").into()) }.boxed()
        }),
        async move {
            let _ = stopped.await;
        },
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stream
        .consumer_info("refunds")
        .await
        .is_ok_and(|i| i.ack_floor.stream_sequence >= seq)
    {
        ensure!(Instant::now() < deadline, "refunds did not park {id}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), running).await;

    let answer = trace(&config, &id)?;
    ensure!(answer["row"]["state"] == "found", "{answer:#}");
    ensure!(answer["row"]["table"] == "public.outbox", "{answer:#}");
    ensure!(
        answer["row"]["subject"] == "outbox.order.created",
        "{answer:#}"
    );
    ensure!(answer["publish"]["state"] == "published", "{answer:#}");
    ensure!(answer["publish"]["sequence"] == seq, "{answer:#}");
    ensure!(consumer_state(&answer, "billing")?["delivery"]["state"] == "acknowledged");
    let parked = &consumer_state(&answer, "refunds")?["delivery"];
    ensure!(parked["state"] == "parked", "{answer:#}");
    ensure!(
        parked["subject"] == "dlq.refunds" && parked["stream"] == "DLQ",
        "{answer:#}"
    );
    ensure!(
        parked["reason"]
            .as_str()
            .is_some_and(|r| r.contains("unknown currency")),
        "{answer:#}"
    );
    ensure!(consumer_state(&answer, "shipping")?["delivery"]["state"] == "in_flight");
    let audit = &consumer_state(&answer, "audit")?["delivery"];
    ensure!(audit["state"] == "not_reached", "{answer:#}");
    ensure!(audit["sequences_before"] == seq - 1, "{answer:#}");
    ensure!(
        consumer_state(&answer, "payments").is_err(),
        "payments does not cover the subject"
    );
    let ledger = answer["ledger"]["Ok"].as_array().context("ledger rows")?;
    ensure!(
        ledger.len() == 1 && ledger[0]["consumer"] == "billing",
        "{answer:#}"
    );
    ensure!(ledger[0]["stream_seq"] == seq, "{answer:#}");
    keep_text(&config, &id, "published", "consumer refunds: parked")?;

    // An id no table and no message has: a clear answer, exit 0, and what was searched.
    let unknown = trace(&config, &uuid::Uuid::new_v4().to_string())?;
    ensure!(unknown["row"]["state"] == "missing", "{unknown:#}");
    ensure!(
        unknown["row"]["searched"][0] == "public.outbox",
        "{unknown:#}"
    );
    ensure!(unknown["publish"]["state"] == "not_found", "{unknown:#}");
    ensure!(
        unknown["publish"]["searched"]
            .as_str()
            .is_some_and(|s| s.contains("messages of any subject"))
    );
    keep_text(
        &config,
        unknown["event_id"].as_str().context("id")?,
        "unknown",
        "not published",
    )?;

    // Committed while the relay is stopped: in the table, not yet published, and the answer
    // says where the relay's confirmed position is and that the WAL is past it.
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    relay.wait_exit(Duration::from_secs(30)).await?;
    let later = insert_event(&db, "order", "created", r#"{"n":2}"#).await?;
    let pending = trace(&config, &later)?;
    ensure!(pending["row"]["state"] == "found", "{pending:#}");
    ensure!(pending["publish"]["state"] == "not_found", "{pending:#}");
    let checkpoint = env.checkpoint().await?.context("a stored checkpoint")?;
    ensure!(
        pending["publish"]["checkpoint"]
            .as_str()
            .and_then(crate::support::parse_lsn)
            == Some(checkpoint),
        "{pending:#}"
    );
    ensure!(
        pending["publish"]["wal_past_checkpoint_bytes"].as_u64() > Some(0),
        "{pending:#}"
    );
    ensure!(pending["consumers"].as_array().is_some_and(Vec::is_empty));
    keep_text(&config, &later, "not-yet-published", "not published")?;

    // A malformed id is refused with the fix (78).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args([
            "--config",
            config.to_str().context("config path")?,
            "trace",
            " ",
        ])
        .output()?;
    ensure!(out.status.code() == Some(78), "{out:?}");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("the event id is empty"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn trace_finds_a_dead_lettered_row_with_its_reason() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config("dead_letter_subject = \"outbox.dead.letters\"");
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    // An empty `type` cannot form a subject token.
    let bad = crate::support::insert_unroutable(&db, "{}").await?;
    let after = insert_event(&db, "order", "created", "{}").await?;
    wait_for_id(&js, &after, &relay).await?;
    let answer = trace(&config, &bad)?;
    ensure!(answer["row"]["state"] == "found", "{answer:#}");
    ensure!(answer["row"]["route_error"].is_string(), "{answer:#}");
    ensure!(answer["publish"]["state"] == "dead_lettered", "{answer:#}");
    ensure!(
        answer["publish"]["subject"] == "outbox.dead.letters",
        "{answer:#}"
    );
    ensure!(
        answer["publish"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{answer:#}"
    );
    keep_text(&config, &bad, "dead-lettered", "dead-lettered")?;
    Ok(())
}
