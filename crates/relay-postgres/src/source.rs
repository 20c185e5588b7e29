//! The replication stream as a [`ChangeSource`].
//!
//! pgwire-replication answers keepalives itself (also while we apply back-pressure), parses
//! Begin, Commit and logical decoding messages (`M`), and hands every other pgoutput message
//! over raw; the `pgoutput` crate decodes those.
//!
//! **Logical decoding messages.** pgwire-replication (0.5) always starts replication with
//! `messages 'true'` (PostgreSQL 14+), with no way to leave it out, so the server sends every
//! `pg_logical_emit_message` of the database, whatever `[[messages]]` configures. They are
//! handed on as [`pgoutput::Message`]s; the router publishes those of a configured prefix and
//! the pipeline counts the rest as skipped (`outbox_relay_messages_skipped_total`). Without
//! `[[messages]]` that is the whole cost: the message's bytes on the wire and one counter. The position reported to the server is only ever what
//! [`ChangeSource::confirm`] was given: the worker starts from `ack_lsn` = the stored checkpoint.

use std::time::Duration;

use pgoutput::LogicalMessage;
use pgwire_replication::{PgWireError, ReplicationClient, ReplicationEvent};
use relay_core::Lsn;
use relay_core::stage::{ChangeSource, ErrorClass, SourceError, SourceEvent};

use crate::PostgresSettings;
use crate::connect::{self, replication_config, to_wire};
use crate::sqlstate::{ReplicationErrorKind, ReplicationPhase, replication_error_kind};

mod window;

pub use window::WindowSource;

/// A running replication session.
pub struct PgSource {
    client: ReplicationClient,
    slot: String,
}

impl std::fmt::Debug for PgSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSource")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

fn from_wire(lsn: pgwire_replication::Lsn) -> Lsn {
    Lsn(lsn.as_u64())
}

/// Classifies a replication error by its SQLSTATE and the phase it arrived in
/// ([`crate::sqlstate::replication_error_kind`]), naming the slot.
pub(crate) fn classify(slot: &str, error: PgWireError, phase: ReplicationPhase) -> SourceError {
    let code = crate::sqlstate::wire_sqlstate(&error)
        .map(|c| format!(" (SQLSTATE {c})"))
        .unwrap_or_default();
    let (class, message) = match replication_error_kind(&error, phase) {
        ReplicationErrorKind::SlotInvalidated => (
            ErrorClass::SlotLost,
            format!(
                "replication slot {slot} cannot be used{code}: it was invalidated (e.g. it fell behind max_slot_wal_keep_size); see docs/operations.md, \"Slot lost\""
            ),
        ),
        ReplicationErrorKind::SlotMissing => (
            ErrorClass::SlotLost,
            format!(
                "replication slot {slot} does not exist{code} (dropped while the relay ran?); see docs/operations.md, \"Slot lost\""
            ),
        ),
        ReplicationErrorKind::SlotInUse => (
            ErrorClass::SlotInUse,
            format!("replication slot {slot} is in use by another process{code}"),
        ),
        ReplicationErrorKind::PublicationMissing => (
            ErrorClass::Fatal,
            format!(
                "the publication of slot {slot} does not exist for the WAL being decoded{code} (dropped, or created after the slot): re-create it, or if it is newer than the slot, reconcile the outbox rows since the slot's position, drop the slot and its outbox_relay.checkpoint row, and run `outbox-relay setup` (publication first, then slot); see docs/bad-rows.md"
            ),
        ),
        ReplicationErrorKind::LoginRefused => (
            ErrorClass::Fatal,
            format!("cannot log in for replication on slot {slot}{code}"),
        ),
        ReplicationErrorKind::Fatal => (
            ErrorClass::Fatal,
            format!("the server refused replication on slot {slot}{code}"),
        ),
        ReplicationErrorKind::Transient => (
            ErrorClass::Transient,
            format!("replication stream of slot {slot} failed"),
        ),
    };
    SourceError::new(class, message).with_source(error)
}

impl PgSource {
    /// Starts streaming `slot` from `start`, which must be a position the relay stored (the
    /// server starts at the later of it and the slot's confirmed_flush_lsn, skipping every
    /// transaction committed before it), reporting `ack` as the confirmed position until the
    /// first [`ChangeSource::confirm`]: `start`, or a position behind it to keep that WAL
    /// (`[relay] replay_retention`; the slot never moves backwards). The settings are
    /// those a session already connected with ([`crate::connect`] validates them and probes
    /// the login, once per session).
    pub async fn start(
        settings: &PostgresSettings,
        start: Lsn,
        ack: Lsn,
    ) -> Result<Self, SourceError> {
        let config = replication_config(settings, start)
            .map_err(|e| {
                let class = if e.is_transient() {
                    ErrorClass::Transient
                } else {
                    ErrorClass::Fatal
                };
                SourceError::new(class, e.to_string())
            })?
            .with_ack_lsn(to_wire(ack.min(start)));
        let slot = settings.slot.clone();
        let mut client = connect::streaming(config)
            .await
            .map_err(|e| classify(&slot, e, ReplicationPhase::Start))?;
        match tokio::time::timeout(settings.connect_timeout, client.wait_started()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(classify(&slot, e, ReplicationPhase::Start)),
            Err(_) => {
                return Err(SourceError::new(
                    ErrorClass::Transient,
                    format!(
                        "replication on slot {slot} did not start within {:?}",
                        settings.connect_timeout
                    ),
                ));
            }
        }
        tracing::info!(slot = %slot, start = %start, ack = %ack.min(start), "replication started");
        Ok(Self { client, slot })
    }

    /// Waits (at most `max_wait`) until the last confirmed position was sent to the server,
    /// then stops the session (CopyDone) and waits for the worker. Not waiting would only cost a
    /// lagging slot: the next start resumes from the stored checkpoint either way.
    pub async fn stop(mut self, max_wait: Duration) {
        let deadline = tokio::time::Instant::now() + max_wait;
        while self.client.feedback_pending_since().is_some()
            && tokio::time::Instant::now() < deadline
            && self.client.is_running()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.client.shutdown().await;
    }
}

impl ChangeSource for PgSource {
    async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        // `recv` is an mpsc receive: cancel-safe, so this can sit inside `select!`.
        let event = match self.client.recv().await {
            Ok(Some(event)) => event,
            Ok(None) => return Ok(None),
            Err(e) => return Err(classify(&self.slot, e, ReplicationPhase::Streaming)),
        };
        let mapped = match event {
            ReplicationEvent::KeepAlive { wal_end, .. } => SourceEvent::KeepAlive {
                wal_end: from_wire(wal_end),
            },
            ReplicationEvent::Begin {
                final_lsn,
                xid,
                commit_time_micros,
            } => SourceEvent::Begin {
                xid,
                final_lsn: from_wire(final_lsn),
                commit_time_micros,
            },
            ReplicationEvent::Commit { lsn, end_lsn, .. } => SourceEvent::Commit {
                commit_lsn: from_wire(lsn),
                end_lsn: from_wire(end_lsn),
            },
            ReplicationEvent::XLogData {
                data, wal_start, ..
            } => match pgoutput::decode(&data) {
                Ok(message) => SourceEvent::Message(message),
                Err(e) => {
                    return Err(SourceError::new(
                        ErrorClass::Fatal,
                        format!(
                            "cannot decode pgoutput message at {} on slot {}",
                            from_wire(wal_start),
                            self.slot
                        ),
                    )
                    .with_source(e));
                }
            },
            // pg_logical_emit_message: the router publishes those of a `[[messages]]`
            // prefix and counts the others as skipped.
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => SourceEvent::Message(LogicalMessage::Message(pgoutput::Message {
                transactional,
                lsn: from_wire(lsn),
                prefix,
                content,
            })),
            ReplicationEvent::StoppedAt { .. } => return Ok(None),
        };
        Ok(Some(mapped))
    }

    fn confirm(&mut self, lsn: Lsn) {
        self.client.update_applied_lsn(to_wire(lsn));
    }
}
