//! `/metrics`: [`Telemetry`] encoded at scrape time in the Prometheus text format.
//!
//! Every metric family is one entry of [`FAMILIES`]: its name, its help text and how to read
//! its value from one [`Scrape`]. Adding a metric is adding an entry (and its line in
//! docs/operations.md, which a test holds the table to).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::*;

/// Encodes [`Telemetry`] at scrape time: one relay's as it always was, or a fleet's, every
/// sample labelled with its pipeline (`pipeline="<name>"`), each family described once.
#[derive(Debug)]
pub struct MetricsCollector {
    pipelines: Vec<(Option<String>, Arc<Telemetry>)>,
}

impl MetricsCollector {
    /// One relay's metrics, without a `pipeline` label.
    pub fn one(telemetry: Arc<Telemetry>) -> Self {
        Self {
            pipelines: vec![(None, telemetry)],
        }
    }

    /// A fleet's: every sample labelled with its pipeline's name.
    pub fn fleet(pipelines: impl IntoIterator<Item = (String, Arc<Telemetry>)>) -> Self {
        Self {
            pipelines: pipelines.into_iter().map(|(n, t)| (Some(n), t)).collect(),
        }
    }
}

/// One metric family of `/metrics`.
struct Family {
    /// The name, without the `_total` / `_info` suffix the encoder adds.
    name: &'static str,
    help: &'static str,
    read: fn(&Scrape<'_>) -> Reading,
}

/// What one scrape reads: the atomics, and each sample taken once under its lock.
struct Scrape<'a> {
    telemetry: &'a Telemetry,
    stats: &'a PipelineStats,
    slot: Option<SlotInfo>,
    retention: Option<RetentionWindow>,
    stream: StreamSample,
    tables: BTreeMap<String, TableStats>,
}

/// One sample's value.
#[derive(Debug, Clone, Copy)]
enum Value {
    Counter(u64),
    Gauge(i64),
    Float(f64),
}

/// A family's value at this scrape.
#[derive(Debug)]
enum Reading {
    /// Not known now (not sampled, or not applicable): the family is left out.
    Absent,
    One(Value),
    /// One sample per value of the label; the family is left out when there is none.
    Labelled(&'static str, Vec<(String, Value)>),
    /// Cumulative counts per upper bound, the last bound `f64::MAX`.
    Histogram {
        sum: f64,
        buckets: Vec<(f64, u64)>,
    },
    Info([(&'static str, &'static str); 2]),
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn counter(a: &AtomicU64) -> Reading {
    Reading::One(Value::Counter(load(a)))
}

fn gauge(v: i64) -> Reading {
    Reading::One(Value::Gauge(v))
}

/// `reading` while the audit runs; absent while it is off.
fn audited(s: &Scrape<'_>, reading: Reading) -> Reading {
    if s.telemetry.audit.enabled.load(Ordering::Relaxed) {
        reading
    } else {
        Reading::Absent
    }
}

fn float(v: f64) -> Reading {
    Reading::One(Value::Float(v))
}

/// A value that may not be known: absent then.
fn maybe(v: Option<Value>) -> Reading {
    v.map_or(Reading::Absent, Reading::One)
}

fn by_table(s: &Scrape<'_>, value: impl Fn(&TableStats) -> Option<Value>) -> Reading {
    let values = s
        .tables
        .iter()
        .filter_map(|(name, t)| value(t).map(|v| (name.clone(), v)))
        .collect();
    Reading::Labelled("table", values)
}

/// Per table with cleanup on.
fn by_cleaned_table(s: &Scrape<'_>, value: impl Fn(&TableStats) -> Value) -> Reading {
    by_table(s, |t| t.cleanup_mode.is_some().then(|| value(t)))
}

/// One sample per label value, each always known.
fn labelled<const N: usize>(label: &'static str, values: [(&str, Value); N]) -> Reading {
    Reading::Labelled(label, values.map(|(l, v)| (l.to_owned(), v)).into())
}

/// One sample per contract.
fn by_contract(s: &Scrape<'_>, value: impl Fn(&LoadedContract) -> u64) -> Reading {
    let values = s
        .telemetry
        .contracts()
        .iter()
        .map(|c| (c.contract().key().to_owned(), Value::Counter(value(c))))
        .collect();
    Reading::Labelled("contract", values)
}

/// Every metric family, in the order `/metrics` shows them.
const FAMILIES: &[Family] = &[
    Family {
        name: BUILD,
        help: "Build information",
        read: |s| {
            let BuildInfo { version, commit } = s.telemetry.build;
            Reading::Info([("version", version), ("commit", commit)])
        },
    },
    Family {
        name: EVENTS_RECEIVED,
        help: "Outbox rows routed to messages",
        read: |s| counter(&s.stats.events_received),
    },
    Family {
        name: EVENTS_PUBLISHED,
        help: "Messages acknowledged by JetStream",
        read: |s| counter(&s.stats.events_published),
    },
    Family {
        name: CHANGES_SKIPPED,
        help: "Changes that were not outbox inserts",
        read: |s| counter(&s.stats.changes_skipped),
    },
    Family {
        name: MESSAGES_SKIPPED,
        help: "Logical decoding messages with a prefix no [[messages]] entry configures",
        read: |s| counter(&s.stats.messages_skipped),
    },
    Family {
        name: DUPLICATES,
        help: "Acks JetStream flagged as duplicates of a stored Nats-Msg-Id",
        read: |s| counter(&s.stats.duplicates),
    },
    Family {
        name: ALREADY_PUBLISHED,
        help: "Events not re-published because the stream already held them",
        read: |s| counter(&s.stats.already_published),
    },
    Family {
        name: DEAD_LETTERED,
        help: "Rows that could not be routed and were published to the dead-letter subject",
        read: |s| counter(&s.stats.dead_lettered),
    },
    Family {
        name: CONTRACT_CHECKED,
        help: "Events checked against the contract before publishing",
        read: |s| by_contract(s, LoadedContract::checked),
    },
    Family {
        name: CONTRACT_REFUSED,
        help: "Events the contract refused (dead-lettered, or the relay stopped)",
        read: |s| by_contract(s, LoadedContract::refused),
    },
    Family {
        name: PUBLISH_RETRIES,
        help: "Re-publishes after a failed publish, in commit order",
        read: |s| counter(&s.stats.publish_retries),
    },
    Family {
        name: ACKS_NOT_HELD,
        help: "Checkpoints refused because the stream could not hold what it had acknowledged",
        read: |s| counter(&s.stats.acks_not_held),
    },
    Family {
        name: STREAM_WENT_BACK,
        help: "Session starts that found the stream's last sequence before one the relay's checkpoints recorded",
        read: |s| counter(&s.stats.stream_went_back),
    },
    Family {
        name: AUDIT_RUNS,
        help: "Audits of the confirmed events against the stream, by the WAL ([relay] audit_interval)",
        read: |s| audited(s, counter(&s.telemetry.audit.runs)),
    },
    Family {
        name: AUDIT_MISSING,
        help: "Events the last audit found missing from the stream",
        read: |s| audited(s, gauge(load(&s.telemetry.audit.missing) as i64)),
    },
    Family {
        name: AUDIT_HEALED,
        help: "Events the audit published again ([relay] audit_heal)",
        read: |s| audited(s, counter(&s.telemetry.audit.healed)),
    },
    Family {
        name: AUDIT_FAILED,
        help: "Audits that could not check their window",
        read: |s| audited(s, counter(&s.telemetry.audit.failed)),
    },
    Family {
        name: PUBLISH_ERRORS,
        help: "Failed publish attempts by kind",
        read: |s| {
            let kinds = [
                ("unknown", &s.stats.publish_errors_unknown),
                ("no_stream", &s.stats.publish_errors_no_stream),
                ("rejected", &s.stats.publish_errors_rejected),
                ("stream_full", &s.stats.publish_errors_stream_full),
                ("out_of_turn", &s.stats.publish_errors_out_of_turn),
            ];
            labelled("kind", kinds.map(|(k, a)| (k, Value::Counter(load(a)))))
        },
    },
    Family {
        name: OUTSTANDING_ACKS,
        help: "Events published and awaiting their ack",
        read: |s| gauge(load(&s.stats.in_flight) as i64),
    },
    Family {
        name: STREAM_FULL,
        help: "1 while the oldest unacknowledged event waits for room in a full stream",
        read: |s| gauge(load(&s.stats.stream_full) as i64),
    },
    Family {
        name: COMMIT_TO_ACK,
        help: "PostgreSQL commit to JetStream ack, seconds",
        read: |s| {
            let mut buckets: Vec<(f64, u64)> = PipelineStats::COMMIT_TO_ACK_BOUNDS
                .iter()
                .copied()
                .chain([f64::MAX])
                .zip(s.stats.commit_to_ack_buckets.iter().map(load))
                .collect();
            buckets.truncate(PipelineStats::COMMIT_TO_ACK_BOUNDS.len() + 1);
            Reading::Histogram {
                sum: load(&s.stats.commit_to_ack_sum_micros) as f64 / 1e6,
                buckets,
            }
        },
    },
    Family {
        name: CHECKPOINT_LSN,
        help: "Stored and confirmed LSN as a number",
        read: |s| gauge(load(&s.stats.confirmed_lsn) as i64),
    },
    Family {
        name: REPLAY_WINDOW_BYTES,
        help: "Bytes between the stored checkpoint and the position confirmed to the slot ([relay] replay_retention)",
        // 0 until the first confirmation, and without a replay retention.
        read: |s| {
            let slot_confirmed = load(&s.stats.slot_confirmed_lsn);
            gauge(if slot_confirmed == 0 {
                0
            } else {
                load(&s.stats.confirmed_lsn).saturating_sub(slot_confirmed) as i64
            })
        },
    },
    Family {
        name: LAST_ACKED_COMMIT_AGE,
        help: "Seconds since the commit of the newest acknowledged event",
        read: |s| float(age_seconds(load(&s.stats.last_acked_commit_unix_micros))),
    },
    Family {
        name: SLOT_LAG_BYTES,
        help: "WAL between the server's position and the slot's confirmed_flush_lsn",
        read: |s| maybe(s.slot.as_ref().and_then(|x| x.lag_bytes).map(Value::Gauge)),
    },
    Family {
        name: SLOT_RETAINED_WAL_BYTES,
        help: "WAL the slot keeps on disk",
        read: |s| {
            maybe(
                s.slot
                    .as_ref()
                    .and_then(|x| x.retained_bytes)
                    .map(Value::Gauge),
            )
        },
    },
    Family {
        name: SLOT_SAFE_WAL_SIZE_BYTES,
        help: "WAL that can be written before the slot is invalidated",
        read: |s| {
            maybe(
                s.slot
                    .as_ref()
                    .and_then(|x| x.safe_wal_size)
                    .map(Value::Gauge),
            )
        },
    },
    Family {
        name: MAX_SLOT_WAL_KEEP_SIZE_BYTES,
        help: "max_slot_wal_keep_size: WAL a slot may hold back before it is invalidated",
        read: |s| {
            let limit = s.retention.as_ref().and_then(RetentionWindow::limit);
            maybe(limit.map(|l| Value::Gauge(i64::try_from(l).unwrap_or(i64::MAX))))
        },
    },
    Family {
        name: WAL_RATE,
        help: "WAL the server writes per second (moving rate)",
        read: |s| {
            let rate = s.retention.as_ref().and_then(|w| w.wal_rate);
            maybe(rate.map(|r| Value::Float(r.bytes_per_second)))
        },
    },
    Family {
        name: SLOT_RETENTION,
        help: "Estimated seconds until the slot is invalidated if the relay stops now",
        read: |s| {
            maybe(
                s.retention
                    .as_ref()
                    .and_then(RetentionWindow::seconds)
                    .map(Value::Float),
            )
        },
    },
    Family {
        name: TAKEOVER_BUDGET,
        help: "[relay] takeover_budget: the longest relay outage planned for, seconds",
        read: |s| {
            let budget = s.retention.as_ref().map(|w| w.policy.budget.as_secs_f64());
            maybe(budget.map(Value::Float))
        },
    },
    Family {
        name: TABLE_ROWS,
        help: "Rows of the outbox table, estimated from pg_class.reltuples",
        read: |s| by_table(s, |t| t.rows_estimate.map(Value::Float)),
    },
    Family {
        name: TABLE_SIZE,
        help: "Bytes of the outbox table with indexes and TOAST",
        read: |s| by_table(s, |t| t.size_bytes.map(|b| Value::Float(b as f64))),
    },
    Family {
        name: TABLE_OLDEST_UNCONFIRMED,
        help: "Seconds since the oldest row not yet confirmed was created (0: none)",
        read: |s| by_table(s, |t| t.oldest_unconfirmed_age.map(Value::Float)),
    },
    Family {
        name: CLEANUP_ROWS,
        help: "Rows deleted or marked by [outbox.cleanup]",
        read: |s| by_cleaned_table(s, |t| Value::Counter(t.cleaned_rows)),
    },
    Family {
        name: CLEANUP_PARTITIONS,
        help: "Partitions dropped by [outbox.cleanup]",
        read: |s| by_cleaned_table(s, |t| Value::Counter(t.dropped_partitions)),
    },
    Family {
        name: CLEANUP_ERRORS,
        help: "Cleanup rounds that failed",
        read: |s| by_cleaned_table(s, |t| Value::Counter(t.cleanup_errors)),
    },
    Family {
        name: CLEANUP_WAITING,
        help: "Rows or partitions cleanup selected that wait for the checkpoint",
        read: |s| by_cleaned_table(s, |t| Value::Gauge(t.waiting as i64)),
    },
    Family {
        name: SLOT_WAL_STATUS,
        help: "1 for the slot's wal_status",
        read: |s| {
            let current = s
                .slot
                .as_ref()
                .map_or("missing", |x| x.wal_status.as_deref().unwrap_or("unknown"));
            let statuses = ["reserved", "extended", "unreserved", "lost", "missing"];
            labelled(
                "status",
                statuses.map(|st| (st, Value::Gauge(i64::from(st == current)))),
            )
        },
    },
    Family {
        name: STREAM_LAST_SEQUENCE,
        help: "The stream's last sequence",
        read: |s| gauge(s.stream.last_seq as i64),
    },
    Family {
        name: CONNECTED,
        help: "1 when connected (postgres: streaming; stream: it exists)",
        read: |s| {
            let t = s.telemetry;
            let up = |connected: bool| Value::Gauge(i64::from(connected));
            labelled(
                "dependency",
                [
                    ("postgres", up(t.streaming.load(Ordering::Relaxed))),
                    ("nats", up(t.nats_connected())),
                    ("stream", up(s.stream.present)),
                ],
            )
        },
    },
    Family {
        name: RECONNECTS,
        help: "Reconnects after a lost connection",
        read: |s| {
            let t = s.telemetry;
            labelled(
                "dependency",
                [
                    ("postgres", Value::Counter(load(&t.pg_reconnects))),
                    ("nats", Value::Counter(t.nats_reconnects())),
                ],
            )
        },
    },
    Family {
        name: READY,
        help: "1 when /readyz answers 200",
        read: |s| gauge(i64::from(s.telemetry.readiness().0)),
    },
];

impl Value {
    fn metric_type(self) -> MetricType {
        match self {
            Value::Counter(_) => MetricType::Counter,
            Value::Gauge(_) | Value::Float(_) => MetricType::Gauge,
        }
    }

    fn encode(self, enc: MetricEncoder<'_>) -> std::fmt::Result {
        match self {
            Value::Counter(v) => ConstCounter::new(v).encode(enc),
            Value::Gauge(v) => ConstGauge::new(v).encode(enc),
            Value::Float(v) => ConstGauge::new(v).encode(enc),
        }
    }
}

impl Reading {
    fn is_absent(&self) -> bool {
        match self {
            Reading::Absent => true,
            Reading::Labelled(_, values) => values.is_empty(),
            _ => false,
        }
    }

    fn metric_type(&self) -> MetricType {
        match self {
            Reading::One(v) => v.metric_type(),
            Reading::Labelled(_, values) => values
                .first()
                .map_or(MetricType::Gauge, |(_, v)| v.metric_type()),
            Reading::Histogram { .. } => MetricType::Histogram,
            Reading::Info(_) | Reading::Absent => MetricType::Info,
        }
    }
}

impl Family {
    /// One relay's reading, as it always was: no `pipeline` label.
    fn encode(&self, reading: Reading, enc: &mut DescriptorEncoder) -> std::fmt::Result {
        if reading.is_absent() {
            return Ok(());
        }
        let metric = enc.encode_descriptor(self.name, self.help, None, reading.metric_type())?;
        match reading {
            Reading::Absent => Ok(()),
            Reading::One(v) => v.encode(metric),
            Reading::Labelled(label, values) => {
                let mut metric = metric;
                for (value, v) in values {
                    v.encode(metric.encode_family(&[(label, value.as_str())])?)?;
                }
                Ok(())
            }
            Reading::Histogram { sum, buckets } => encode_histogram(metric, sum, &buckets),
            Reading::Info(labels) => {
                let mut metric = metric;
                metric.encode_info(&labels)
            }
        }
    }

    /// Each pipeline's reading under one descriptor, labelled `pipeline="<name>"`.
    fn encode_labelled(
        &self,
        readings: Vec<(&str, Reading)>,
        enc: &mut DescriptorEncoder,
    ) -> std::fmt::Result {
        let readings: Vec<(&str, Reading)> = readings
            .into_iter()
            .filter(|(_, r)| !r.is_absent())
            .collect();
        let Some(kind) = readings.first().map(|(_, r)| r.metric_type()) else {
            return Ok(());
        };
        let mut metric = enc.encode_descriptor(self.name, self.help, None, kind)?;
        for (pipeline, reading) in readings {
            let own = [("pipeline", pipeline)];
            match reading {
                Reading::Absent => {}
                Reading::One(v) => v.encode(metric.encode_family(&own)?)?,
                Reading::Labelled(label, values) => {
                    for (value, v) in values {
                        v.encode(
                            metric.encode_family(&[
                                ("pipeline", pipeline),
                                (label, value.as_str()),
                            ])?,
                        )?;
                    }
                }
                Reading::Histogram { sum, buckets } => {
                    encode_histogram(metric.encode_family(&own)?, sum, &buckets)?;
                }
                Reading::Info([a, b]) => metric.encode_info(&[("pipeline", pipeline), a, b])?,
            }
        }
        Ok(())
    }
}

fn encode_histogram(
    mut metric: MetricEncoder<'_>,
    sum: f64,
    buckets: &[(f64, u64)],
) -> std::fmt::Result {
    let count = buckets.iter().map(|(_, n)| n).sum();
    metric.encode_histogram::<Vec<(String, String)>>(sum, count, buckets, None)
}

impl<'a> Scrape<'a> {
    fn of(t: &'a Telemetry) -> Self {
        let SlotSample { slot, retention } = lock(&t.slot_sample).clone();
        Self {
            telemetry: t,
            stats: &t.stats,
            slot,
            retention,
            stream: lock(&t.stream_sample).clone(),
            tables: t.tables(),
        }
    }
}

impl Collector for MetricsCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        match self.pipelines.as_slice() {
            [(None, telemetry)] => {
                let scrape = Scrape::of(telemetry);
                for family in FAMILIES {
                    family.encode((family.read)(&scrape), &mut enc)?;
                }
            }
            pipelines => {
                let scrapes: Vec<(&str, Scrape<'_>)> = pipelines
                    .iter()
                    .map(|(name, t)| (name.as_deref().unwrap_or_default(), Scrape::of(t)))
                    .collect();
                for family in FAMILIES {
                    let readings = scrapes
                        .iter()
                        .map(|(name, scrape)| (*name, (family.read)(scrape)))
                        .collect();
                    family.encode_labelled(readings, &mut enc)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
