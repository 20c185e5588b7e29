//! `/metrics`: [`Telemetry`] encoded at scrape time in the Prometheus text format.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::*;

/// Encodes [`Telemetry`] at scrape time.
#[derive(Debug)]
pub struct MetricsCollector(pub Arc<Telemetry>);

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn float_gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn labelled<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: Vec<(&str, M)>,
) -> std::fmt::Result {
    let Some(kind) = values.first().map(|(_, m)| m.metric_type()) else {
        return Ok(());
    };
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (value, m) in values {
        let labels = [(label, value)];
        m.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for MetricsCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let t = &self.0;
        let s = &t.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        enc.encode_descriptor(BUILD, "Build information", None, MetricType::Info)?
            .encode_info(&[("version", VERSION), ("commit", COMMIT)])?;
        counter(
            &mut enc,
            EVENTS_RECEIVED,
            "Outbox rows routed to messages",
            load(&s.events_received),
        )?;
        counter(
            &mut enc,
            EVENTS_PUBLISHED,
            "Messages acknowledged by JetStream",
            load(&s.events_published),
        )?;
        counter(
            &mut enc,
            CHANGES_SKIPPED,
            "Changes that were not outbox inserts",
            load(&s.changes_skipped),
        )?;
        counter(
            &mut enc,
            MESSAGES_SKIPPED,
            "Logical decoding messages with a prefix no [[messages]] entry configures",
            load(&s.messages_skipped),
        )?;
        counter(
            &mut enc,
            DUPLICATES,
            "Acks JetStream flagged as duplicates of a stored Nats-Msg-Id",
            load(&s.duplicates),
        )?;
        counter(
            &mut enc,
            ALREADY_PUBLISHED,
            "Events not re-published because the stream already held them",
            load(&s.already_published),
        )?;
        counter(
            &mut enc,
            DEAD_LETTERED,
            "Rows that could not be routed and were published to the dead-letter subject",
            load(&s.dead_lettered),
        )?;
        counter(
            &mut enc,
            PUBLISH_RETRIES,
            "Re-publishes after an unknown outcome",
            load(&s.publish_retries),
        )?;
        labelled(
            &mut enc,
            PUBLISH_ERRORS,
            "Failed publish attempts by kind",
            "kind",
            vec![
                (
                    "unknown",
                    ConstCounter::new(load(&s.publish_errors_unknown)),
                ),
                (
                    "no_stream",
                    ConstCounter::new(load(&s.publish_errors_no_stream)),
                ),
                (
                    "rejected",
                    ConstCounter::new(load(&s.publish_errors_rejected)),
                ),
            ],
        )?;
        gauge(
            &mut enc,
            OUTSTANDING_ACKS,
            "Events published and awaiting their ack",
            load(&s.in_flight) as i64,
        )?;
        let mut buckets: Vec<(f64, u64)> = PipelineStats::COMMIT_TO_ACK_BOUNDS
            .iter()
            .copied()
            .chain([f64::MAX])
            .zip(s.commit_to_ack_buckets.iter().map(load))
            .collect();
        buckets.truncate(PipelineStats::COMMIT_TO_ACK_BOUNDS.len() + 1);
        let count = buckets.iter().map(|(_, n)| n).sum();
        enc.encode_descriptor(
            COMMIT_TO_ACK,
            "PostgreSQL commit to JetStream ack, seconds",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<Vec<(String, String)>>(
            load(&s.commit_to_ack_sum_micros) as f64 / 1e6,
            count,
            &buckets,
            None,
        )?;
        gauge(
            &mut enc,
            CHECKPOINT_LSN,
            "Stored and confirmed LSN as a number",
            load(&s.confirmed_lsn) as i64,
        )?;
        // 0 until the first confirmation, and without a replay retention.
        let slot_confirmed = load(&s.slot_confirmed_lsn);
        gauge(
            &mut enc,
            REPLAY_WINDOW_BYTES,
            "Bytes between the stored checkpoint and the position confirmed to the slot ([relay] replay_retention)",
            if slot_confirmed == 0 {
                0
            } else {
                load(&s.confirmed_lsn).saturating_sub(slot_confirmed) as i64
            },
        )?;
        let age = age_seconds(load(&s.last_acked_commit_unix_micros));
        let g = ConstGauge::new(age);
        g.encode(enc.encode_descriptor(
            LAST_ACKED_COMMIT_AGE,
            "Seconds since the commit of the newest acknowledged event",
            None,
            g.metric_type(),
        )?)?;

        let SlotSample { slot, retention } = lock(&t.slot_sample).clone();
        if let Some(slot) = &slot {
            if let Some(lag) = slot.lag_bytes {
                gauge(
                    &mut enc,
                    SLOT_LAG_BYTES,
                    "WAL between the server's position and the slot's confirmed_flush_lsn",
                    lag,
                )?;
            }
            if let Some(retained) = slot.retained_bytes {
                gauge(
                    &mut enc,
                    SLOT_RETAINED_WAL_BYTES,
                    "WAL the slot keeps on disk",
                    retained,
                )?;
            }
            if let Some(safe) = slot.safe_wal_size {
                gauge(
                    &mut enc,
                    SLOT_SAFE_WAL_SIZE_BYTES,
                    "WAL that can be written before the slot is invalidated",
                    safe,
                )?;
            }
        }
        if let Some(window) = retention {
            if let Some(limit) = window.limit() {
                gauge(
                    &mut enc,
                    MAX_SLOT_WAL_KEEP_SIZE_BYTES,
                    "max_slot_wal_keep_size: WAL a slot may hold back before it is invalidated",
                    i64::try_from(limit).unwrap_or(i64::MAX),
                )?;
            }
            if let Some(rate) = window.wal_rate {
                float_gauge(
                    &mut enc,
                    WAL_RATE,
                    "WAL the server writes per second (moving rate)",
                    rate.bytes_per_second,
                )?;
            }
            if let Some(seconds) = window.seconds() {
                float_gauge(
                    &mut enc,
                    SLOT_RETENTION,
                    "Estimated seconds until the slot is invalidated if the relay stops now",
                    seconds,
                )?;
            }
            float_gauge(
                &mut enc,
                TAKEOVER_BUDGET,
                "[relay] takeover_budget: the longest relay outage planned for, seconds",
                window.policy.budget.as_secs_f64(),
            )?;
        }
        let tables = t.tables();
        let per_table =
            |value: &dyn Fn(&TableStats) -> Option<f64>| -> Vec<(&str, ConstGauge<f64>)> {
                tables
                    .iter()
                    .filter_map(|(name, s)| value(s).map(|v| (name.as_str(), ConstGauge::new(v))))
                    .collect()
            };
        labelled(
            &mut enc,
            TABLE_ROWS,
            "Rows of the outbox table, estimated from pg_class.reltuples",
            "table",
            per_table(&|s| s.rows_estimate),
        )?;
        labelled(
            &mut enc,
            TABLE_SIZE,
            "Bytes of the outbox table with indexes and TOAST",
            "table",
            per_table(&|s| s.size_bytes.map(|b| b as f64)),
        )?;
        labelled(
            &mut enc,
            TABLE_OLDEST_UNCONFIRMED,
            "Seconds since the oldest row not yet confirmed was created (0: none)",
            "table",
            per_table(&|s| s.oldest_unconfirmed_age),
        )?;
        let cleaned = |value: &dyn Fn(&TableStats) -> u64| -> Vec<(&str, ConstCounter)> {
            tables
                .iter()
                .filter(|(_, s)| s.cleanup_mode.is_some())
                .map(|(name, s)| (name.as_str(), ConstCounter::new(value(s))))
                .collect()
        };
        labelled(
            &mut enc,
            CLEANUP_ROWS,
            "Rows deleted or marked by [outbox.cleanup]",
            "table",
            cleaned(&|s| s.cleaned_rows),
        )?;
        labelled(
            &mut enc,
            CLEANUP_PARTITIONS,
            "Partitions dropped by [outbox.cleanup]",
            "table",
            cleaned(&|s| s.dropped_partitions),
        )?;
        labelled(
            &mut enc,
            CLEANUP_ERRORS,
            "Cleanup rounds that failed",
            "table",
            cleaned(&|s| s.cleanup_errors),
        )?;
        labelled(
            &mut enc,
            CLEANUP_WAITING,
            "Rows or partitions cleanup selected that wait for the checkpoint",
            "table",
            tables
                .iter()
                .filter(|(_, s)| s.cleanup_mode.is_some())
                .map(|(name, s)| (name.as_str(), ConstGauge::new(s.waiting as i64)))
                .collect(),
        )?;
        let current = slot
            .as_ref()
            .map_or("missing", |s| s.wal_status.as_deref().unwrap_or("unknown"));
        labelled(
            &mut enc,
            SLOT_WAL_STATUS,
            "1 for the slot's wal_status",
            "status",
            ["reserved", "extended", "unreserved", "lost", "missing"]
                .into_iter()
                .map(|st| (st, ConstGauge::new(i64::from(st == current))))
                .collect(),
        )?;
        let stream = lock(&t.stream_sample).clone();
        gauge(
            &mut enc,
            STREAM_LAST_SEQUENCE,
            "The stream's last sequence",
            stream.last_seq as i64,
        )?;
        labelled(
            &mut enc,
            CONNECTED,
            "1 when connected (postgres: streaming; stream: it exists)",
            "dependency",
            vec![
                (
                    "postgres",
                    ConstGauge::new(i64::from(t.streaming.load(Ordering::Relaxed))),
                ),
                ("nats", ConstGauge::new(i64::from(t.nats_connected()))),
                ("stream", ConstGauge::new(i64::from(stream.present))),
            ],
        )?;
        labelled(
            &mut enc,
            RECONNECTS,
            "Reconnects after a lost connection",
            "dependency",
            vec![
                ("postgres", ConstCounter::new(load(&t.pg_reconnects))),
                ("nats", ConstCounter::new(t.nats_reconnects())),
            ],
        )?;
        gauge(
            &mut enc,
            READY,
            "1 when /readyz answers 200",
            i64::from(t.readiness().0),
        )?;
        Ok(())
    }
}
