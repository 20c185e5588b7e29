//! The two limits the relay runs against: decoding (`pg_recvlogical`) and the broker (raw
//! JetStream publishes).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::message::PublishMessage;

use crate::measure::children_cpu_seconds;

use super::setup::{
    Env, copy_slot, create_stream, drop_slot, headers, publish_pipelined, stream_messages,
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

/// pg_recvlogical on a copy of the base slot until `end`: seconds, and its CPU seconds
/// (utime + stime, from `getrusage` of the waited-for child).
pub(super) async fn decode_limit(env: &Env, end: u64) -> Result<(f64, f64)> {
    let slot = "bench_recvlogical";
    copy_slot(env, slot).await?;
    let conn = format!(
        "host={} port={} user=postgres dbname={DB}",
        env.pg.host(),
        env.pg.port()
    );
    let started = Instant::now();
    let cpu_before = children_cpu_seconds();
    let out = tokio::process::Command::new(recvlogical_bin(env))
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
        .output()
        .await
        .context("running pg_recvlogical")?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = children_cpu_seconds() - cpu_before;
    drop_slot(env, slot).await;
    if !out.status.success() {
        bail!(
            "pg_recvlogical failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((secs, cpu))
}

/// Raw pipelined publishes of `rows` messages shaped like the relay's: seconds.
pub(super) async fn broker_limit(env: &Env, rows: u64) -> Result<f64> {
    let row = env
        .client
        .query_one("SELECT payload::text FROM outbox LIMIT 1", &[])
        .await?;
    let payload = bytes::Bytes::from(row.get::<_, String>(0));
    create_stream(env, STREAM, "outbox.>").await?;
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
    let stored = stream_messages(env, STREAM).await?;
    if stored != rows {
        bail!("broker limit run stored {stored} of {rows} messages");
    }
    let _ = env.js.delete_stream(STREAM).await;
    Ok(secs)
}
