//! The replication session: pgwire-replication's configuration for the slot and publication,
//! on the host (and with the TLS) the plain sessions use.

use std::time::Duration;

use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig};
use relay_core::Lsn;

use super::tls;
use crate::PgError;
use crate::settings::PostgresSettings;

/// Session settings that make text output deterministic: hex bytea, ISO dates, UTC, and the
/// `postgres` interval form (what `ttl_column` parses).
const SESSION_OPTIONS: &str = "-c bytea_output=hex -c DateStyle=ISO -c TimeZone=UTC \
     -c IntervalStyle=postgres -c extra_float_digits=3";

/// `lsn` as pgwire-replication writes it.
pub(crate) fn to_wire(lsn: Lsn) -> pgwire_replication::Lsn {
    pgwire_replication::Lsn::from_u64(lsn.as_u64())
}

/// The replication session's configuration for `settings`' slot and publication, starting
/// (and reporting) at `start`. No validation or login probe here: the session validated the
/// settings and probed the login once, in [`super::connect`], moments before (a logical
/// replication connection matches the same pg_hba.conf lines as a plain one).
pub(crate) fn replication_config(
    settings: &PostgresSettings,
    start: Lsn,
) -> Result<ReplicationConfig, PgError> {
    let parts = settings.parts()?;
    let tls = tls::replication_tls(settings, &parts.host)?;
    Ok(ReplicationConfig::new(
        parts.host,
        parts.user,
        parts.password,
        parts.database,
        settings.slot.clone(),
        settings.publication.clone(),
    )
    .with_port(parts.port)
    .with_tls(tls)
    .with_start_lsn(to_wire(start))
    .with_ack_lsn(to_wire(start))
    .with_status_interval(settings.status_interval)
    .with_wakeup_interval(Duration::from_secs(1))
    .with_options(SESSION_OPTIONS)
    .with_application_name("outbox-relay")
    // Observing feedback makes `feedback_pending_since` report unsent confirmations, so a
    // clean stop can wait until the final position reached the server.
    .with_feedback_observer(pgwire_replication::FeedbackObserver::new(|_| {})))
}

/// A replication session that starts streaming as soon as it is connected (the source).
pub(crate) async fn streaming(config: ReplicationConfig) -> Result<ReplicationClient, PgWireError> {
    ReplicationClient::connect(config).await
}

/// A replication session that runs commands (`CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT`)
/// before anything streams.
pub(crate) async fn gated(config: ReplicationConfig) -> Result<ReplicationClient, PgWireError> {
    ReplicationClient::connect_gated(config).await
}
