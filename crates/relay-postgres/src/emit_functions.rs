//! The SQL helpers of the table-free outbox, `outbox_relay.emit_event` and
//! `outbox_relay.emit_envelope` (`migrations/0005_emit_outbox_message.sql`): `setup` installs
//! them when `[[messages]]` prefixes are configured, `validate --connect` says when they are
//! missing.

use tokio_postgres::Client;

use crate::catalog;

/// The migration that creates the functions (`CREATE OR REPLACE`: installing it again is a
/// no-op).
pub(crate) const EMIT_FUNCTIONS_MIGRATION: &str =
    include_str!("../../../migrations/0005_emit_outbox_message.sql");

/// What `setup` found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitFunctions {
    /// Both were there.
    Present,
    /// They were missing and are now created.
    Created,
}

/// Creates `outbox_relay.emit_event` and `outbox_relay.emit_envelope` unless both exist.
pub async fn ensure(client: &Client) -> Result<EmitFunctions, tokio_postgres::Error> {
    if catalog::emit_functions_present(client).await? {
        return Ok(EmitFunctions::Present);
    }
    client.batch_execute(EMIT_FUNCTIONS_MIGRATION).await?;
    Ok(EmitFunctions::Created)
}
