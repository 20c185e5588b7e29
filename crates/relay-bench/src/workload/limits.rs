//! The two limits the relay runs against: decoding (`pg_recvlogical`) and the broker (raw
//! JetStream publishes).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::message::PublishMessage;

use crate::measure::{BudgetStart, CpuBudget, children_cpu_seconds, cpu_seconds};

use super::setup::{
    Env, copy_slot, create_stream, drop_slot, headers, publish_pipelined, stream_messages,
    walsender_pid,
};
use super::{BROKER_WINDOW, DB, PUBLICATION, STREAM};

fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

fn recvlogical_bin(env: &Env) -> PathBuf {
    let own = env.pg.bin_dir().join("pg_recvlogical");
    if own.is_file() {
        return own;
    }
    for p in [
        "/usr/lib/postgresql/15/bin/pg_recvlogical",
        "/usr/bin/pg_recvlogical",
    ] {
        if Path::new(p).is_file() {
            return PathBuf::from(p);
        }
    }
    PathBuf::from("pg_recvlogical")
}

/// The decode limit run: pg_recvlogical's seconds and CPU seconds, and the machine's CPU.
pub(super) struct DecodeRun {
    pub(super) secs: f64,
    /// utime + stime of pg_recvlogical, from `getrusage` of the waited-for child.
    pub(super) cpu: f64,
    pub(super) budget: CpuBudget,
}

/// pg_recvlogical on a copy of the base slot until `end`.
pub(super) async fn decode_limit(env: &Env, end: u64) -> Result<DecodeRun> {
    let slot = "bench_recvlogical";
    copy_slot(env, slot).await?;
    let conn = format!(
        "host={} port={} user=postgres dbname={DB}",
        env.pg.host(),
        env.pg.port()
    );
    let budget = BudgetStart::now(env.nats.pid());
    let started = Instant::now();
    let cpu_before = children_cpu_seconds();
    let child = tokio::process::Command::new(recvlogical_bin(env))
        .env("PGPASSWORD", "postgres")
        .args([
            "-d",
            &conn,
            "-S",
            slot,
            "--start",
            "--no-loop",
            "-f",
            "/dev/null",
        ])
        .args(["-E", &lsn_text(end)])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={PUBLICATION}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running pg_recvlogical")?;
    let output = child.wait_with_output();
    tokio::pin!(output);
    // The walsender ends with pg_recvlogical: its CPU is sampled while it runs, so the last
    // few milliseconds (one sample interval) are not counted.
    let (mut walsender, mut walsender_cpu) = (None, None);
    let out = loop {
        tokio::select! {
            out = &mut output => break out.context("running pg_recvlogical")?,
            () = tokio::time::sleep(Duration::from_millis(10)) => {
                if walsender.is_none() {
                    walsender = walsender_pid(env, slot).await?;
                }
                if let Some(cpu) = walsender.and_then(|p| cpu_seconds(&p.to_string())) {
                    walsender_cpu = Some(cpu);
                }
            }
        }
    };
    let secs = started.elapsed().as_secs_f64();
    let cpu = children_cpu_seconds() - cpu_before;
    let budget = budget.finish(
        secs,
        &[("pg_recvlogical", Some(cpu)), ("walsender", walsender_cpu)],
    );
    drop_slot(env, slot).await;
    if !out.status.success() {
        bail!(
            "pg_recvlogical failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(DecodeRun { secs, cpu, budget })
}

/// Raw pipelined publishes of `rows` messages shaped like the relay's: seconds, and the
/// machine's CPU (the publisher is this process).
pub(super) async fn broker_limit(env: &Env, rows: u64) -> Result<(f64, CpuBudget)> {
    let row = env
        .client
        .query_one("SELECT payload::text FROM outbox LIMIT 1", &[])
        .await?;
    let payload = bytes::Bytes::from(row.get::<_, String>(0));
    create_stream(env, STREAM, "outbox.>").await?;
    let budget = BudgetStart::now(env.nats.pid());
    let publisher_before = cpu_seconds("self");
    let started = Instant::now();
    publish_pipelined(&env.js, rows, BROKER_WINDOW, |i| {
        let id = format!("00000000-0000-4000-8000-{i:012x}");
        let msg = PublishMessage::build()
            .headers(headers(&id, &i.to_string()))
            .payload(payload.clone());
        ("outbox.Order.OrderCreated", msg)
    })
    .await
    .context("broker limit run")?;
    let secs = started.elapsed().as_secs_f64();
    let publisher = cpu_seconds("self")
        .zip(publisher_before)
        .map(|(a, b)| a - b);
    let budget = budget.finish(secs, &[("publisher", publisher)]);
    let stored = stream_messages(env, STREAM).await?;
    if stored != rows {
        bail!("broker limit run stored {stored} of {rows} messages");
    }
    let _ = env.js.delete_stream(STREAM).await;
    Ok((secs, budget))
}
