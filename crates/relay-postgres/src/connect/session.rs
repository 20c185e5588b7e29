//! The plain sessions: one host's session ([`connect`]), the read-write server among the URL's
//! hosts ([`connect_primary`], pinning the settings to it), and sessions whose notices
//! ([`connect_with_notices`]) or notifications ([`connect_with_notifications`]) are handed over. Each runs the login probe ([`super::auth`]) first.

use super::{auth, tls};
use crate::PgError;
use crate::settings::PostgresSettings;

/// Connects a plain (non-replication) session and drives it on a background task. Runs the
/// login probe ([`auth`]) first, so no cleartext or MD5 password is sent unless allowed. With several hosts
/// in the URL (or `target_session_attrs=read-write`) the session is on the read-write server:
/// see [`connect_primary`].
pub async fn connect(settings: &PostgresSettings) -> Result<tokio_postgres::Client, PgError> {
    Ok(connect_observed(settings, Observer::default()).await?.0)
}

/// [`connect`], and the settings bound to the host it reached
/// (`PostgresSettings::candidates`): the URL's hosts are tried in order, each with its own
/// login probe, and the first that accepts a read-write session is kept. A replication session
/// started with these settings reaches the same server, so the checkpoint is read and stored
/// where the slot is streamed. For a single-host URL these are the settings given.
pub async fn connect_primary(
    settings: &PostgresSettings,
) -> Result<(tokio_postgres::Client, PostgresSettings), PgError> {
    connect_observed(settings, Observer::default()).await
}

/// The server's notices and warnings to one session, in the order it sent them.
pub(crate) type Notices = tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::error::DbError>;

/// [`connect`], and the session's notices (e.g. a warning of logical decoding) through
/// [`Notices`].
pub(crate) async fn connect_with_notices(
    settings: &PostgresSettings,
) -> Result<(tokio_postgres::Client, Notices), PgError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let observer = Observer {
        notices: Some(tx),
        notifications: None,
    };
    Ok((connect_observed(settings, observer).await?.0, rx))
}

/// The `NOTIFY`s a session receives (after its `LISTEN`), in the order it received them: for
/// one channel, the order their transactions committed.
pub type Notifications = tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>;

/// [`connect`], and the session's notifications through [`Notifications`]; the receiver ends
/// when the session does.
pub async fn connect_with_notifications(
    settings: &PostgresSettings,
) -> Result<(tokio_postgres::Client, Notifications), PgError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let observer = Observer {
        notices: None,
        notifications: Some(tx),
    };
    Ok((connect_observed(settings, observer).await?.0, rx))
}

type NoticeSender = tokio::sync::mpsc::UnboundedSender<tokio_postgres::error::DbError>;
type NotificationSender = tokio::sync::mpsc::UnboundedSender<tokio_postgres::Notification>;

/// Who is handed a session's notices and notifications (nobody: the session is only driven).
#[derive(Clone, Default)]
struct Observer {
    notices: Option<NoticeSender>,
    notifications: Option<NotificationSender>,
}

impl Observer {
    fn is_empty(&self) -> bool {
        self.notices.is_none() && self.notifications.is_none()
    }
}

async fn connect_observed(
    settings: &PostgresSettings,
    observer: Observer,
) -> Result<(tokio_postgres::Client, PostgresSettings), PgError> {
    settings.validate()?;
    let candidates = settings.candidates()?;
    if let [only] = candidates.as_slice() {
        return Ok((connect_one(only, observer).await?, only.clone()));
    }
    let mut tried = Vec::with_capacity(candidates.len());
    let mut refusals = Vec::new();
    for candidate in candidates {
        match connect_one(&candidate, observer.clone()).await {
            Ok(client) => {
                tracing::debug!(target = %candidate.display_target(), "connected to the read-write server");
                return Ok((client, candidate));
            }
            Err(error) => {
                tried.push(format!(
                    "{} {}",
                    candidate.display_target(),
                    why_not_primary(&error)
                ));
                if !error.is_transient() {
                    refusals.push(error);
                }
            }
        }
    }
    // Every host refused the login (or the TLS handshake): that needs an operator, whichever
    // host is the primary. Otherwise at least one is down or a standby: wait for a promotion.
    if refusals.len() == tried.len()
        && let Some(first) = refusals.into_iter().next()
    {
        return Err(first);
    }
    Err(PgError::NoPrimary {
        targets: settings.display_target(),
        tried: tried.join("; "),
    })
}

/// Why a host of a multi-host URL was not used, in a few words.
fn why_not_primary(error: &PgError) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::PermissionDenied
            && io.to_string().contains("does not allow writes")
        {
            return "is read-only (a standby, or default_transaction_read_only = on)".to_owned();
        }
        cause = e.source();
    }
    match error {
        PgError::Unreachable { reason, .. } => format!("is unreachable ({reason})"),
        other => {
            let mut text = other.to_string();
            let mut cause = std::error::Error::source(other);
            while let Some(e) = cause {
                text.push_str(&format!(": {e}"));
                cause = e.source();
            }
            format!("refused: {text}")
        }
    }
}

/// One session to the single host of `settings` (a single-host URL or a bound candidate).
async fn connect_one(
    settings: &PostgresSettings,
    observer: Observer,
) -> Result<tokio_postgres::Client, PgError> {
    auth::probe(settings).await?;
    let config = settings.client_config()?;
    let target = settings.display_target();
    let connect_err = |source| PgError::Connect {
        target: target.clone(),
        source,
    };
    let client = match tls::client_config(settings)? {
        Some(tls) => {
            let (client, connection) = config
                .connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
                .await
                .map_err(connect_err)?;
            spawn_driver(connection, observer);
            client
        }
        None => {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(connect_err)?;
            spawn_driver(connection, observer);
            client
        }
    };
    Ok(client)
}

/// Drives `connection` in its own task, handing notices and notifications to `observer`.
fn spawn_driver<S, T>(connection: tokio_postgres::Connection<S, T>, observer: Observer)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if observer.is_empty() {
        tokio::spawn(drive(connection));
    } else {
        tokio::spawn(drive_observed(connection, observer));
    }
}

async fn drive<F: std::future::Future<Output = Result<(), tokio_postgres::Error>>>(connection: F) {
    if let Err(error) = connection.await {
        tracing::debug!(error = %error, "postgres connection ended");
    }
}

/// Drives the connection and hands every notice and notification over to `observer`.
async fn drive_observed<S, T>(mut connection: tokio_postgres::Connection<S, T>, observer: Observer)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(tokio_postgres::AsyncMessage::Notice(notice))) => {
                if let Some(tx) = &observer.notices {
                    let _ = tx.send(notice);
                }
            }
            Some(Ok(tokio_postgres::AsyncMessage::Notification(notification))) => {
                if let Some(tx) = &observer.notifications {
                    let _ = tx.send(notification);
                }
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => {
                tracing::debug!(error = %error, "postgres connection ended");
                return;
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests;
