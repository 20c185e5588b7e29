//! At each session start: has the stream gone back behind what the relay confirmed? The
//! position map records, with every checkpoint, a sequence the stream held the checkpoint's
//! events at or after. A stream whose last sequence is now before one of those was re-created,
//! reset, or lost its tail (a nats-server killed without `sync_interval: always` restarts
//! without an error, its sequence back, new messages reusing old numbers): events the relay
//! confirmed may be gone. It cannot be repaired from here (the slot is past them), so it is
//! said loudly, counted, and named with the `verify` that finds what is missing.

use std::sync::atomic::Ordering;

use relay_telemetry::Telemetry;

use crate::config::RelayConfig;

/// Compares the stream's last sequence with the position map; logs and counts a step back.
pub(super) async fn check_stream_sequence(
    config: &RelayConfig,
    client: &tokio_postgres::Client,
    context: &async_nats::jetstream::Context,
    telemetry: &Telemetry,
) {
    let stream = config.nats.stream.as_str();
    let last_seq = match context.get_stream(stream).await {
        Ok(found) => found.cached_info().state.last_sequence,
        Err(error) => {
            tracing::debug!(stream, error = %error, "cannot read the stream's last sequence; its step back is checked at the next session");
            return;
        }
    };
    let slot = config.postgres.slot.as_str();
    match relay_postgres::checkpoint::anchor_past_sequence(client, slot, stream, last_seq).await {
        Ok(Some(anchor)) => {
            telemetry
                .stats
                .stream_went_back
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                stream,
                last_seq,
                recorded_seq = anchor.stream_seq,
                from_lsn = %anchor.commit_lsn,
                "stream `{stream}`'s last sequence is {last_seq}, before {} where the relay's checkpoint recorded events committed from {}: the stream was re-created, reset or lost its tail, and events the relay confirmed may be gone. Find them with `outbox-relay verify --from-lsn {}` and publish them again with `outbox-relay restore` (both need the WAL [relay] replay_retention keeps)",
                anchor.stream_seq,
                anchor.commit_lsn,
                anchor.commit_lsn
            );
        }
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(slot, error = %error, "cannot read the position map; the stream's step back is checked at the next session");
        }
    }
}
