//! Start-up checks of the target stream.

use relay_core::check::CheckAspect as _;
use relay_core::route::BrokerNeed;
use std::time::Duration;

use async_nats::jetstream::{self, stream};

use crate::connection::JetStream;
use crate::durability::{Durability, assess_durability};
use crate::error::NatsError;
use crate::publisher::StreamTakes;
use crate::settings::{NatsSettings, PublishMode};

/// From this nats-server version on, a refused `Nats-Expected-Last-Msg-Id` fails a replicated
/// stream: every replica checks it only when it applies the message, and since 2.14 an error
/// there other than a limit is a write error that stops the stream ("critical write error:
/// last msgid mismatch": no leader, and again at every restart, as the entry is replayed).
/// `Nats-Expected-Last-Sequence` is refused before the proposal (from 2.12), storing nothing.
pub const MSG_ID_CONDITION_FAILS_REPLICAS: (u64, u64, u64) = (2, 14, 0);

/// Whether a stream of `replicas` on a server of `version` (its INFO) must have every
/// commit-order condition name a sequence (see [`StreamReport::order_by_sequence`]).
pub fn order_by_sequence(version: &str, replicas: usize) -> bool {
    replicas > 1 && crate::native::version_triple(version) >= MSG_ID_CONDITION_FAILS_REPLICAS
}

/// Below this, a slow restart's re-sends land as second copies: worth a warning.
const MIN_SAFE_DUPLICATE_WINDOW: Duration = Duration::from_secs(60);

/// What the stream looks like, and settings that can lose acknowledged events.
#[derive(Debug, Clone)]
pub struct StreamReport {
    /// Stream subjects.
    pub subjects: Vec<String>,
    /// The stream's duplicate window.
    pub duplicate_window: Duration,
    /// Whether the stream takes atomic batches (`allow_atomic`).
    pub allow_atomic: bool,
    /// Whether the stream takes fast batches (`allow_batched`).
    pub allow_batched: bool,
    /// Whether the relay created the stream just now.
    pub created: bool,
    /// Whether every commit-order condition must name a stream sequence rather than an event
    /// id: a replicated stream on nats-server [`MSG_ID_CONDITION_FAILS_REPLICAS`] or later, where
    /// a refused `Nats-Expected-Last-Msg-Id` fails the stream on every replica.
    pub order_by_sequence: bool,
    /// How durable its acknowledgements are (storage, replicas, the servers' disk sync).
    pub durability: Durability,
    /// Human-readable warnings about settings that can lose acknowledged events or store
    /// re-sends twice: the durability warnings with their hints, then the stream's limits.
    pub warnings: Vec<String>,
}

/// What the stream takes, for choosing how events go out.
impl From<&StreamReport> for StreamTakes {
    fn from(report: &StreamReport) -> Self {
        Self {
            atomic_batches: report.allow_atomic,
            fast_batches: report.allow_batched,
            order_by_sequence: report.order_by_sequence,
        }
    }
}

pub use relay_core::subject::subject_matches;

/// Ensures the stream exists (creating it only when allowed, with the settings `needs` ask
/// for) and captures every sample subject `(table, subject)`; refuses broker-native headers
/// (`needs`) the server or stream cannot honour; reports durability warnings (asking the
/// servers for their sync setting, up to 2 s).
// Long: the start-up stream checks in order (exists or created, subjects, native needs,
// durability); each refuses with its own error
pub async fn prepare_stream(
    jetstream: &JetStream,
    settings: &NatsSettings,
    samples: &[(String, String)],
    needs: &[BrokerNeed],
) -> Result<StreamReport, NatsError> {
    let context = jetstream.context();
    let version = context.client().server_info().version;
    let name = settings.stream.as_str();
    let lookup = context.get_stream(name).await;
    let (info, created) = match lookup {
        Ok(mut s) => (
            s.info()
                .await
                .map_err(|e| jetstream.stream_error(name, e))?
                .clone(),
            false,
        ),
        Err(e)
            if matches!(
                e.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(ref js)
                    if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            if !settings.create_stream {
                return Err(NatsError::StreamMissing {
                    stream: name.into(),
                    subjects: settings.stream_subjects.join(","),
                });
            }
            let (allow_message_ttl, allow_message_schedules) =
                crate::native::creation_flags(&version, needs);
            let config = stream::Config {
                name: name.into(),
                allow_message_ttl,
                allow_message_schedules,
                subjects: settings.stream_subjects.clone(),
                storage: stream::StorageType::File,
                duplicate_window: settings.duplicate_window,
                allow_atomic_publish: settings.publish_mode == PublishMode::AtomicBatch,
                // Only where the server knows the setting (2.14+).
                allow_batch_publish: settings.publish_mode == PublishMode::FastBatch
                    && crate::server_features::supports_fast_batches(&version),
                ..Default::default()
            };
            let info = context
                .create_stream(config)
                .await
                .map_err(|e| jetstream.stream_error(name, e))?;
            tracing::info!(stream = name, "created JetStream stream (file storage)");
            (info.cached_info().clone(), true)
        }
        Err(e) => {
            // Not enabled (10076), or nobody answers the JetStream API at all.
            let unavailable = match e.kind() {
                jetstream::context::GetStreamErrorKind::JetStream(ref js) => {
                    js.error_code() == jetstream::ErrorCode::JETSTREAM_NOT_ENABLED
                }
                jetstream::context::GetStreamErrorKind::Request => true,
                _ => false,
            };
            if unavailable {
                return Err(NatsError::JetStreamUnavailable {
                    url: settings.display_url(),
                    reason: e.to_string(),
                });
            }
            return Err(jetstream.stream_error(name, e));
        }
    };
    let config = &info.config;
    crate::native::check_broker_needs(&version, config, needs)?;
    for (table, subject) in samples {
        if !config.subjects.iter().any(|f| subject_matches(f, subject)) {
            return Err(NatsError::SubjectNotCaptured {
                subject: subject.clone(),
                table: table.clone(),
                stream: name.into(),
                stream_subjects: config.subjects.join(", "),
            });
        }
    }
    let durability = assess_durability(jetstream, &info).await;
    let mut warnings: Vec<String> = durability
        .warnings()
        .into_iter()
        .map(|w| {
            format!(
                "stream `{name}` {}: {} (hint: {})",
                w.aspect.name(),
                w.detail,
                w.hint.unwrap_or_default()
            )
        })
        .collect();
    let limited = config.max_messages > 0 || config.max_bytes > 0 || !config.max_age.is_zero();
    if limited && config.discard == stream::DiscardPolicy::Old {
        warnings.push(format!(
            "stream `{name}` has limits with `discard: old`: old events are evicted silently once a limit is reached"
        ));
    }
    if config.duplicate_window < MIN_SAFE_DUPLICATE_WINDOW {
        warnings.push(format!(
            "stream `{name}` has a duplicate_window of {:?}: events re-sent after a relay restart that takes longer are stored twice (consumers must dedupe by Nats-Msg-Id); 2m or more is recommended",
            config.duplicate_window
        ));
    }
    Ok(StreamReport {
        subjects: config.subjects.clone(),
        duplicate_window: config.duplicate_window,
        allow_atomic: config.allow_atomic_publish,
        allow_batched: config.allow_batch_publish,
        created,
        order_by_sequence: order_by_sequence(&version, config.num_replicas),
        durability,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::{order_by_sequence, subject_matches};

    #[test]
    fn only_replicated_streams_of_new_servers_order_by_sequence() {
        assert!(order_by_sequence("2.14.0", 3));
        assert!(order_by_sequence("2.15.1", 2));
        assert!(!order_by_sequence("2.15.1", 1));
        assert!(!order_by_sequence("2.12.15", 3));
        assert!(!order_by_sequence("2.9.10", 3));
    }

    #[test]
    fn wildcards_match_like_nats() {
        assert!(subject_matches("outbox.>", "outbox.Order.Created"));
        assert!(subject_matches("outbox.*.Created", "outbox.Order.Created"));
        assert!(!subject_matches("outbox.*", "outbox.Order.Created"));
        assert!(!subject_matches("outbox.>", "outbox"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.c"));
        assert!(!subject_matches("a.b.c", "a.b"));
    }
}
