//! Replay: points a durable JetStream consumer at the first stream sequence of the events
//! committed from an LSN (or a time) on, found as `position` finds it, so the events are
//! delivered again through the normal path (no WAL is read). Shared by `outbox-relay replay`
//! and the `replay` signal from SQL.
//!
//! An existing consumer is moved in place where nats-server has the consumer reset API (2.14
//! and later): it keeps its configuration, name and creation time, and may be read meanwhile.
//! On older servers it is deleted and created again under the same name, with the same
//! configuration and the new start: only when asked (`recreate`) and only while nothing reads
//! from it. Either way never past a message it has not acknowledged.

use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::{self, consumer};
use outbox_position::{Limits, Target};
use relay_nats::{set_filters, skips_unacked};

use crate::config::RelayConfig;
use crate::failure::{Failure, FailureKind};
use crate::position::{Lookup, lookup, rfc3339};

/// One replay.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// From the events committed at or after this.
    pub from: Target,
    /// End of the range a dry run counts (exclusive); the consumer reads on past it.
    pub until: Option<Target>,
    /// The durable consumer to reposition, or to create.
    pub consumer: String,
    /// Subject filters of a consumer created here, of a re-created one, and of the count.
    pub subjects: Vec<String>,
    /// Say what would happen; change nothing.
    pub dry_run: bool,
    /// On nats-server before 2.14: delete and re-create an existing consumer.
    pub recreate: bool,
    /// Search the stream only, not the position map.
    pub no_map: bool,
    pub limits: Limits,
}

/// The range a replay delivers again.
#[derive(Debug)]
pub struct ReplayRange {
    pub from: Lookup,
    pub until: Option<Lookup>,
    /// Messages in the range (on the subjects, when given).
    pub count: u64,
}

impl ReplayRange {
    /// The range as `replay` prints it.
    pub fn lines(&self, subjects: &[String]) -> Vec<String> {
        let p = &self.from.position;
        let until_seq = self.until.as_ref().map(|u| u.position.sequence);
        let first = match &p.found {
            Some(f) => format!(
                "sequence {} (event {}, commit LSN {}, committed {})",
                f.seq,
                f.event_id.as_deref().unwrap_or("-"),
                f.commit_lsn,
                f.commit_time.map(rfc3339).unwrap_or_default()
            ),
            None => format!("sequence {} (the next message stored)", p.sequence),
        };
        let last = match (&self.until, until_seq) {
            (Some(u), Some(seq)) => format!(
                "sequence {} (before the first message committed at or after {})",
                seq.saturating_sub(1).max(p.sequence.saturating_sub(1)),
                u.position.target
            ),
            _ => format!("the end of the stream (now sequence {})", p.stream_last),
        };
        let on = if subjects.is_empty() {
            String::new()
        } else {
            format!(" on {}", subjects.join(", "))
        };
        vec![
            format!("replay of the events committed at or after {}", p.target),
            format!("  from {first}"),
            format!("  to {last}: {} messages{on}", self.count),
            format!("  {}", self.from.how()),
        ]
    }
}

/// What a replay did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayDone {
    Created {
        consumer: String,
        start: u64,
    },
    ResetInPlace {
        consumer: String,
        reset_seq: u64,
        was: String,
        why: String,
    },
    Recreated {
        consumer: String,
        start: u64,
        was: String,
        why: String,
    },
    /// A dry run: what it would do, and what it would refuse now.
    DryRun {
        lines: Vec<String>,
    },
}

impl std::fmt::Display for ReplayDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Created { consumer, start } => write!(
                f,
                "created durable consumer {consumer}: it delivers from sequence {start}"
            ),
            Self::ResetInPlace {
                consumer,
                reset_seq,
                was,
                why,
            } => write!(
                f,
                "reset durable consumer {consumer} in place ({why}; its configuration kept; {was}): it delivers from sequence {reset_seq}"
            ),
            Self::Recreated {
                consumer,
                start,
                was,
                why,
            } => write!(
                f,
                "deleted and re-created durable consumer {consumer} with its configuration ({why}; {was}): it delivers from sequence {start}"
            ),
            Self::DryRun { lines } => write!(f, "{}", lines.join("\n")),
        }
    }
}

fn unavailable(e: impl Into<anyhow::Error>) -> Failure {
    Failure::new(FailureKind::Unavailable, e)
}

/// Finds the range of `request` and hands it to `on_range` (before anything changes), then
/// creates or moves the consumer.
// Long: the steps in order (connect, find the range, look the consumer up, create or move it);
// each needs the previous one's result
pub async fn replay(
    config: &RelayConfig,
    request: &ReplayRequest,
    on_range: impl FnOnce(&ReplayRange),
) -> Result<ReplayDone, Failure> {
    let nats = relay_nats::connect(&config.nats)
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, e))?;
    let js = nats.jetstream().context().clone();
    let range = range(config, &js, request).await?;
    on_range(&range);
    let start = range.from.position.sequence;
    let stream = js
        .get_stream(&config.nats.stream)
        .await
        .map_err(unavailable)?;
    let existing = match stream.consumer_info(&request.consumer).await {
        Ok(info) => Some(info),
        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => None,
        Err(e) => return Err(unavailable(e)),
    };
    let name = &request.consumer;
    let Some(info) = existing else {
        if request.dry_run {
            return Ok(ReplayDone::DryRun {
                lines: vec![format!(
                    "dry run: consumer {name} does not exist; it would be created at sequence {start}"
                )],
            });
        }
        let mut created = consumer::Config {
            durable_name: Some(name.clone()),
            description: Some(format!(
                "created by outbox-relay replay from {}",
                request.from
            )),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ack_policy: consumer::AckPolicy::Explicit,
            // Like the consumer library: it counts deliveries and parks messages itself.
            max_deliver: -1,
            ..Default::default()
        };
        set_filters(&mut created, &request.subjects);
        stream.create_consumer(created).await.map_err(unavailable)?;
        return Ok(ReplayDone::Created {
            consumer: name.clone(),
            start,
        });
    };
    let was = format!(
        "it had delivered up to sequence {}, ack floor {}",
        info.delivered.stream_sequence, info.ack_floor.stream_sequence
    );
    let skips =
        skips_unacked(&info, start).map(|why| format!("not repositioning consumer {name}: {why}"));
    let way = Way::for_server(&nats.client().server_info().version);
    if request.dry_run {
        let mut lines = vec![format!(
            "consumer {name} exists ({was}); {}",
            way.would(start)
        )];
        for refusal in skips.iter().chain(&way.refusal(&info, request)) {
            lines.push(format!("it would refuse now: {refusal}"));
        }
        lines.push("dry run: nothing changed".into());
        return Ok(ReplayDone::DryRun { lines });
    }
    if let Some(why) = skips {
        return Err(Failure::new(FailureKind::DataSafety, anyhow::anyhow!(why)));
    }
    if let Some(why) = way.refusal(&info, request) {
        return Err(Failure::config(anyhow::anyhow!(why)));
    }
    match way {
        Way::InPlace { .. } => {
            let reset = relay_nats::reset_consumer(&js, &info.stream_name, name, start)
                .await
                .map_err(|e| reset_failed(e, &info, start))?;
            Ok(ReplayDone::ResetInPlace {
                consumer: name.clone(),
                reset_seq: reset.reset_seq,
                was,
                why: way.why(),
            })
        }
        Way::Recreate { .. } => {
            if !request.recreate {
                return Err(Failure::config(anyhow::anyhow!(
                    "consumer {name} on stream {} exists ({was}) and {}: run again with --yes (a signal: \"recreate\": true) to delete and re-create it",
                    info.stream_name,
                    way.why()
                )));
            }
            relay_nats::recreate_consumer(&stream, &info, start, &request.subjects)
                .await
                .map_err(unavailable)?;
            Ok(ReplayDone::Recreated {
                consumer: name.clone(),
                start,
                was,
                why: way.why(),
            })
        }
    }
}

/// Where the range starts and ends, and how many messages it holds.
async fn range(
    config: &RelayConfig,
    js: &jetstream::Context,
    request: &ReplayRequest,
) -> Result<ReplayRange, Failure> {
    let from = lookup(config, js, request.from, request.no_map, request.limits).await?;
    let until = match request.until {
        Some(target) => Some(lookup(config, js, target, request.no_map, request.limits).await?),
        None => None,
    };
    let count = outbox_position::count(
        js,
        &config.nats.stream,
        from.position.sequence,
        until.as_ref().map(|u| u.position.sequence),
        &request.subjects,
    )
    .await
    .map_err(unavailable)?;
    Ok(ReplayRange { from, until, count })
}

/// How an existing consumer is moved: reset in place where the server has the API, else deleted
/// and created again.
enum Way {
    InPlace { version: String },
    Recreate { version: String },
}

impl Way {
    fn for_server(version: &str) -> Self {
        let version = version.to_owned();
        if relay_nats::supports_consumer_reset(&version) {
            Way::InPlace { version }
        } else {
            Way::Recreate { version }
        }
    }

    /// Why this way, for the output.
    fn why(&self) -> String {
        match self {
            Way::InPlace { version } => format!("nats-server {version} has the consumer reset API"),
            Way::Recreate { version } => {
                format!("nats-server {version} has no consumer reset API (2.14 and later have it)")
            }
        }
    }

    /// What a run would do, for a dry run.
    fn would(&self, start: u64) -> String {
        match self {
            Way::InPlace { .. } => format!(
                "{}, so replay would reset it in place, keeping its configuration, to deliver from sequence {start}",
                self.why()
            ),
            Way::Recreate { .. } => format!(
                "{}, so replay would delete it and create it again with the same configuration, delivering from sequence {start} (with --yes)",
                self.why()
            ),
        }
    }

    /// Why this way cannot be taken now, if it cannot.
    fn refusal(&self, info: &consumer::Info, request: &ReplayRequest) -> Option<String> {
        let name = &info.name;
        let stream = &info.stream_name;
        match self {
            Way::InPlace { .. } => (!request.subjects.is_empty()).then(|| {
                format!(
                    "consumer {name} on stream {stream} is reset in place, which keeps its subject filters: drop --subjects, or change its filters first (nats consumer edit {stream} {name} --filter ...)"
                )
            }),
            // Deleting a consumer under a running service races it.
            Way::Recreate { .. } => (info.num_waiting > 0 || info.push_bound).then(|| {
                format!(
                    "consumer {name} on stream {stream} is being read ({} pull requests waiting{}): stop the service that reads it first (pull requests expire within their timeout, 30 s for the consumer library), then run replay again",
                    info.num_waiting,
                    if info.push_bound { ", push subscription bound" } else { "" }
                )
            }),
        }
    }
}

/// The error of a refused or failed reset: names the consumer, the stream and the fix.
fn reset_failed(e: relay_nats::ConsumerResetError, info: &consumer::Info, start: u64) -> Failure {
    let (name, stream) = (&info.name, &info.stream_name);
    match &e {
        relay_nats::ConsumerResetError::Refused { .. } => {
            let policy = serde_json::to_value(&info.config)
                .ok()
                .and_then(|v| v.get("deliver_policy").cloned())
                .map(|v| v.to_string())
                .unwrap_or_default();
            Failure::config(anyhow::Error::new(e).context(format!(
                "consumer {name} on stream {stream} cannot be reset to sequence {start} (its deliver policy is {policy}; JetStream resets a consumer delivering all messages, or one by start sequence or time to a sequence at or after its start): delete it (nats consumer rm {stream} {name}) and run replay again, which creates it at sequence {start}"
            )))
        }
        relay_nats::ConsumerResetError::Request { .. } => unavailable(anyhow::Error::new(e).context(format!(
            "consumer {name} on stream {stream} was not reset; check that nats-server answers JetStream requests and run replay again"
        ))),
    }
}
