//! The relay's NATS side as the relay and every command that publishes as it does (backfill,
//! restore) make it.

use relay_nats::{JetStreamPublisher, PublishMode};

use crate::config::RelayConfig;
use crate::failure::{Failure, nats_failure};

/// Connects to NATS and prepares the relay's stream (its checks, created when allowed, what
/// the mappings need of the broker), with a publisher of `max_in_flight` publishing in `mode`
/// where the server and the stream allow it (else per message, with one warning): the same
/// for the relay and for every command that publishes as it does (backfill, restore).
pub async fn connect_publisher(
    config: &RelayConfig,
    max_in_flight: usize,
    mode: PublishMode,
) -> Result<
    (
        relay_nats::NatsConnection,
        JetStreamPublisher,
        relay_nats::StreamReport,
    ),
    Failure,
> {
    let nats = relay_nats::connect(&config.nats)
        .await
        .map_err(nats_failure)?;
    let publisher = JetStreamPublisher::new(
        &nats,
        &config.nats.stream,
        config.nats.ack_timeout,
        max_in_flight,
    );
    let report = relay_nats::prepare_stream(
        publisher.jetstream(),
        &config.nats,
        &config.sample_subjects(),
        &config.broker_needs(),
    )
    .await
    .map_err(nats_failure)?;
    for warning in &report.warnings {
        tracing::warn!(stream = %config.nats.stream, "{warning}");
    }
    store_contracts(config, publisher.jetstream().context()).await?;
    for (table, template) in config.unsampled_subjects() {
        tracing::warn!(stream = %config.nats.stream, "{}", config.unsampled_warning(&table, &template));
    }
    let publisher =
        publisher.with_publish_mode(mode, relay_nats::StreamTakes::from(&report), max_in_flight);
    Ok((nats, publisher, report))
}

/// Stores every contract in `[nats] contracts_bucket` before anything is published under it, so
/// each `Outbox-Schema` header names a key consumers can fetch.
async fn store_contracts(
    config: &RelayConfig,
    jetstream: &async_nats::jetstream::Context,
) -> Result<(), Failure> {
    let mut documents: Vec<(String, bytes::Bytes)> = Vec::new();
    for (_, loaded) in config.contracts().map_err(Failure::config)? {
        let contract = loaded.contract();
        if !documents.iter().any(|(key, _)| key == contract.key()) {
            documents.push((
                contract.key().to_owned(),
                bytes::Bytes::copy_from_slice(contract.stored()),
            ));
        }
    }
    let bucket = &config.nats.contracts_bucket;
    let stored = relay_nats::store_contracts(jetstream, bucket, &documents)
        .await
        .map_err(nats_failure)?;
    if !documents.is_empty() {
        tracing::info!(
            bucket = %bucket,
            contracts = documents.len(),
            written = ?stored.written,
            created_bucket = stored.created_bucket,
            "event contracts stored"
        );
    }
    Ok(())
}
