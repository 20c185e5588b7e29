//! Counters and latency buckets the binary turns into logs and metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::message::OutboundMessage;
use crate::stage::{PubReceipt, PublishErrorKind};

/// Counters the binary turns into logs and metrics.
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Outbox rows routed to messages.
    pub events_received: AtomicU64,
    /// Messages acknowledged by JetStream.
    pub events_published: AtomicU64,
    /// Acks that JetStream flagged as duplicates (already stored under that `Nats-Msg-Id`).
    pub duplicates: AtomicU64,
    /// Re-publishes after an unknown outcome.
    pub publish_retries: AtomicU64,
    /// Checkpoints refused because the stream could not hold what had been acknowledged (a
    /// forged PubAck; a stream deleted, reset or gone back).
    pub acks_not_held: AtomicU64,
    /// Session starts that found the stream's last sequence before one the relay's own
    /// checkpoints recorded (the stream re-created, reset, or its tail lost).
    pub stream_went_back: AtomicU64,
    /// Events not re-published because the stream already held them (see
    /// [`Pipeline::skip_published`]).
    pub already_published: AtomicU64,
    /// Changes that are not outbox inserts (updates, deletes, truncates, other tables).
    pub changes_skipped: AtomicU64,
    /// Logical decoding messages (`pg_logical_emit_message`) whose prefix no `[[messages]]`
    /// entry configures: someone else's, skipped.
    pub messages_skipped: AtomicU64,
    /// Last stored and confirmed LSN.
    pub confirmed_lsn: AtomicU64,
    /// Last position confirmed to the slot: the stored checkpoint, or behind it with
    /// `[relay] replay_retention` (0 until the first checkpoint of the process).
    pub slot_confirmed_lsn: AtomicU64,
    /// Events awaiting an ack now.
    pub in_flight: AtomicU64,
    /// Failed publish attempts whose outcome was unknown (timeout, connection lost).
    pub publish_errors_unknown: AtomicU64,
    /// Failed publish attempts that no stream answered (no responders).
    pub publish_errors_no_stream: AtomicU64,
    /// Publishes JetStream refused for good.
    pub publish_errors_rejected: AtomicU64,
    /// Publishes the stream refused for lack of room (a limit with `discard: new`, storage):
    /// re-sent in commit order once there is room.
    pub publish_errors_stream_full: AtomicU64,
    /// Publishes the stream refused because their predecessor in commit order was not its
    /// last message (another writer, or a fault): re-sent in commit order.
    pub publish_errors_out_of_turn: AtomicU64,
    /// 1 while the oldest unacknowledged event waits for room in a full stream, else 0.
    pub stream_full: AtomicU64,
    /// Commit-to-ack latency: acks per bucket of [`PipelineStats::COMMIT_TO_ACK_BOUNDS`] (not
    /// cumulative); the last bucket counts everything above the largest bound.
    pub commit_to_ack_buckets: [AtomicU64; 14],
    /// Sum of all commit-to-ack latencies, microseconds.
    pub commit_to_ack_sum_micros: AtomicU64,
    /// Commit time (µs since the Unix epoch) of the transaction of the newest acknowledged event.
    pub last_acked_commit_unix_micros: AtomicU64,
    /// Stream sequence of the newest acknowledged message.
    pub last_stream_seq: AtomicU64,
    /// Rows that could not be routed and were published to the dead-letter subject.
    pub dead_lettered: AtomicU64,
}

impl PipelineStats {
    /// Upper bounds (seconds) of the commit-to-ack latency buckets, then +Inf.
    pub const COMMIT_TO_ACK_BOUNDS: [f64; 13] = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];

    /// Records one acknowledged message: its commit-to-ack latency and stream sequence.
    pub(super) fn observe_ack(&self, msg: &OutboundMessage, receipt: &PubReceipt) {
        self.last_stream_seq
            .fetch_max(receipt.stream_seq, Ordering::Relaxed);
        // Per ack, so no header parsing: the commit time travels with the message.
        let committed = crate::message::pg_time_to_system(msg.commit_time_micros);
        let now = std::time::SystemTime::now();
        let latency = now.duration_since(committed).unwrap_or_default();
        let unix = committed
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as u64;
        self.last_acked_commit_unix_micros
            .fetch_max(unix, Ordering::Relaxed);
        let secs = latency.as_secs_f64();
        let bucket = Self::COMMIT_TO_ACK_BOUNDS
            .iter()
            .position(|bound| secs <= *bound)
            .unwrap_or(Self::COMMIT_TO_ACK_BOUNDS.len());
        self.commit_to_ack_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.commit_to_ack_sum_micros
            .fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
    }

    /// Counts one failed publish attempt by kind.
    pub(super) fn count_publish_error(&self, kind: PublishErrorKind) {
        let counter = match kind {
            PublishErrorKind::Unknown => &self.publish_errors_unknown,
            PublishErrorKind::NoStream => &self.publish_errors_no_stream,
            PublishErrorKind::Rejected | PublishErrorKind::Collision => {
                &self.publish_errors_rejected
            }
            PublishErrorKind::StreamFull => &self.publish_errors_stream_full,
            PublishErrorKind::OutOfTurn => &self.publish_errors_out_of_turn,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
