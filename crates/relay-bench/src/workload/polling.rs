//! The polling relay baseline.

use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use async_nats::jetstream::message::PublishMessage;

use crate::measure::cpu_seconds;

use super::setup::{Env, create_stream, headers};
use super::{DB, PollRun, STREAM};

/// The polling relay: SELECT … FOR UPDATE SKIP LOCKED LIMIT batch, publish each row and wait for
/// the acks (pipelined within the batch), mark the batch published, commit.
pub(super) async fn polling(env: &Env, rows: u64, batch: i64) -> Result<PollRun> {
    create_stream(env, STREAM, "outbox.>").await?;
    let mut client = env.pg.connect(DB).await?;
    let cpu0 = cpu_seconds("self").unwrap_or(0.0);
    let started = Instant::now();
    let mut total = 0_u64;
    loop {
        let tx = client.transaction().await?;
        let batch_rows = tx
            .query(
                "SELECT id::text, aggregatetype, aggregateid, type, payload::text FROM outbox \
                 WHERE published_at IS NULL ORDER BY created_at, id LIMIT $1 FOR UPDATE SKIP LOCKED",
                &[&batch],
            )
            .await?;
        if batch_rows.is_empty() {
            tx.commit().await?;
            break;
        }
        let mut ids = Vec::with_capacity(batch_rows.len());
        let mut acks = Vec::with_capacity(batch_rows.len());
        for r in &batch_rows {
            let id: String = r.get(0);
            let agg_type: String = r.get(1);
            let agg_id: String = r.get(2);
            let kind: String = r.get(3);
            let payload: Option<String> = r.get(4);
            let mut h = headers(&id, &agg_id);
            h.insert("Outbox-Aggregate-Type", agg_type.as_str());
            h.insert("Outbox-Event-Type", kind.as_str());
            let msg = PublishMessage::build()
                .headers(h)
                .payload(payload.unwrap_or_default().into());
            let ack = env
                .js
                .send_publish(format!("outbox.{agg_type}.{kind}"), msg)
                .await
                .map_err(|e| anyhow!("poller publish: {e}"))?;
            acks.push(ack);
            ids.push(id);
        }
        for ack in acks {
            ack.await.map_err(|e| anyhow!("poller ack: {e}"))?;
        }
        tx.execute(
            "UPDATE outbox SET published_at = clock_timestamp() WHERE id = ANY($1::text[]::uuid[])",
            &[&ids],
        )
        .await?;
        tx.commit().await?;
        total += ids.len() as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds("self").unwrap_or(0.0) - cpu0;
    if total != rows {
        bail!("polling relay published {total} of {rows} rows");
    }
    let _ = env.js.delete_stream(STREAM).await;
    Ok(PollRun {
        secs,
        events_per_s: rows as f64 / secs,
        cpu_secs: cpu,
    })
}
