//! Authentication: before a session logs in, the probe finds out how the server wants the
//! password, so the relay never sends a cleartext or MD5 password unless allowed.
//!
//! tokio-postgres and pgwire-replication both answer `AuthenticationCleartextPassword` with the
//! password as it is, whatever the TLS state. The probe opens its own connection (TLS as the
//! settings say), sends a StartupMessage, reads the first answer and hangs up without answering
//! it. It also turns the usual refusals (no pg_hba entry without TLS, TLS failures, unknown
//! role or database) into fast, specific errors.

use bytes::{Buf as _, BytesMut};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::hosts::ConnectionParts;
use super::tls;
use crate::PgError;
use crate::settings::{PostgresSettings, SslMode};

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// How the server asked for the password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthMethod {
    /// No password needed (trust, or certificate authentication).
    None,
    /// `AuthenticationCleartextPassword` (pg_hba `password`, or `ldap`/`pam`/`radius`).
    Cleartext,
    /// `AuthenticationMD5Password` (pg_hba `md5` with an MD5-hashed password).
    Md5,
    /// SASL (SCRAM-SHA-256).
    Sasl,
    /// Something else (GSSAPI, SSPI).
    Other(i32),
}

/// Runs the probe; `Ok` when logging in may go ahead.
pub(crate) async fn probe(settings: &PostgresSettings) -> Result<AuthMethod, PgError> {
    let parts = settings.parts()?;
    if parts.host.starts_with('/') {
        // Unix socket: nothing crosses a network.
        return Ok(AuthMethod::None);
    }
    let target = settings.display_target();
    let timeout = settings.connect_timeout;
    let method = tokio::time::timeout(timeout, run(settings, &parts, &target))
        .await
        .map_err(|_| PgError::Unreachable {
            target: target.clone(),
            reason: format!("no answer within {timeout:?}"),
        })??;
    if matches!(method, AuthMethod::Cleartext | AuthMethod::Md5)
        && !settings.allow_insecure_password
    {
        return Err(PgError::InsecurePassword {
            target,
            method: if method == AuthMethod::Md5 {
                "an MD5 password (pg_hba method md5 with an MD5-hashed password)"
            } else {
                "a cleartext password (pg_hba method password, or ldap/pam/radius)"
            },
        });
    }
    Ok(method)
}

/// The probe's connection to the server: TLS as the sslmode says (and whether it is on).
async fn open(
    settings: &PostgresSettings,
    parts: &ConnectionParts,
    target: &str,
) -> Result<(Box<dyn Stream>, bool), PgError> {
    let unreachable = |e: std::io::Error| PgError::Unreachable {
        target: target.to_owned(),
        reason: e.to_string(),
    };
    let mode = settings.ssl_mode()?;
    let mut tcp = TcpStream::connect((parts.host.as_str(), parts.port))
        .await
        .map_err(unreachable)?;
    if mode == SslMode::Disable {
        return Ok((Box::new(tcp), false));
    }
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    tcp.write_all(&buf).await.map_err(unreachable)?;
    buf.clear();
    let answer = tcp.read_u8().await.map_err(unreachable)?;
    match answer {
        b'S' => {
            let config = tls::client_config(settings)?.ok_or_else(|| {
                PgError::Settings("TLS requested without a TLS configuration".into())
            })?;
            let name = rustls::pki_types::ServerName::try_from(parts.host.clone())
                .map_err(|e| PgError::Settings(format!("host {}: {e}", parts.host)))?;
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            let tls = connector.connect(name, tcp).await.map_err(|e| {
                tls_failure(settings, target, &e).unwrap_or_else(|| PgError::Tls {
                    target: target.to_owned(),
                    reason: e.to_string(),
                })
            })?;
            Ok((Box::new(tls), true))
        }
        b'N' if mode.requires_tls() => Err(PgError::Tls {
            target: target.to_owned(),
            reason: format!(
                "the server does not accept TLS (ssl = off), but postgres.sslmode = {}",
                mode.as_str()
            ),
        }),
        b'N' => Ok((Box::new(tcp), false)),
        other => Err(PgError::Unreachable {
            target: target.to_owned(),
            reason: format!("unexpected answer {other:#x} to SSLRequest: not PostgreSQL?"),
        }),
    }
}

/// Sends the StartupMessage on a connection of its own and reads how the server answers it.
async fn run(
    settings: &PostgresSettings,
    parts: &ConnectionParts,
    target: &str,
) -> Result<AuthMethod, PgError> {
    let unreachable = |e: std::io::Error| PgError::Unreachable {
        target: target.to_owned(),
        reason: e.to_string(),
    };
    let (mut stream, tls_on) = open(settings, parts, target).await?;
    let mut buf = BytesMut::new();
    let params = [
        ("user", parts.user.as_str()),
        ("database", parts.database.as_str()),
        ("application_name", "outbox-relay-probe"),
    ];
    frontend::startup_message(params, &mut buf).map_err(unreachable)?;
    // With TLS 1.3 the server checks the client certificate after the client finished the
    // handshake: a rejection arrives as an alert on the first read.
    let io_err = |e: std::io::Error| {
        let refused = if tls_on {
            tls_failure(settings, target, &e)
        } else {
            None
        };
        refused.unwrap_or_else(|| unreachable(e))
    };
    stream.write_all(&buf).await.map_err(io_err)?;
    stream.flush().await.map_err(io_err)?;
    let tag = stream.read_u8().await.map_err(io_err)?;
    let len = stream.read_i32().await.map_err(io_err)?;
    if !(4..=65_536).contains(&len) {
        return Err(PgError::Unreachable {
            target: target.to_owned(),
            reason: format!("malformed answer to the startup message (length {len})"),
        });
    }
    let mut body = vec![0; len as usize - 4];
    stream.read_exact(&mut body).await.map_err(io_err)?;
    let mut body = &body[..];
    match tag {
        b'R' if body.len() >= 4 => Ok(match body.get_i32() {
            0 => AuthMethod::None,
            3 => AuthMethod::Cleartext,
            5 => AuthMethod::Md5,
            10 => AuthMethod::Sasl,
            other => AuthMethod::Other(other),
        }),
        b'E' => {
            let (code, message) = error_fields(body);
            // 28xxx: no pg_hba entry, unknown role; 3D000: unknown database. Others (too many
            // connections, starting up) may clear by themselves.
            if code.starts_with("28") || code == "3D000" {
                Err(PgError::Auth {
                    target: target.to_owned(),
                    message: format!(
                        "{message} (SQLSTATE {code}){}",
                        cert_hint(settings, &message)
                    ),
                })
            } else {
                Err(PgError::Unreachable {
                    target: target.to_owned(),
                    reason: format!("{message} (SQLSTATE {code})"),
                })
            }
        }
        other => Err(PgError::Unreachable {
            target: target.to_owned(),
            reason: format!(
                "unexpected message {:?} after the startup message",
                other as char
            ),
        }),
    }
}

/// The server's TLS alert about the client certificate inside `error`, if that is what it is:
/// a refusal naming `sslcert` (an operator must act), instead of an unreachable server.
fn tls_failure(
    settings: &PostgresSettings,
    target: &str,
    error: &std::io::Error,
) -> Option<PgError> {
    use rustls::AlertDescription as A;
    let alert = match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(
            alert @ (A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::AccessDenied
            | A::CertificateRequired),
        ) => alert,
        _ => return None,
    };
    let message = match &settings.sslcert {
        Some(cert) => format!(
            "the server rejected the client certificate postgres.sslcert {} (TLS alert {alert:?}): it must be signed by a CA in the server's ssl_ca_file and be valid now",
            cert.display()
        ),
        None => format!(
            "the server ended the TLS session (TLS alert {alert:?}); if it requires a client certificate, set postgres.sslcert and postgres.sslkey"
        ),
    };
    Some(PgError::Auth {
        target: target.to_owned(),
        message,
    })
}

/// The fix for a refusal about the client certificate (pg_hba `cert` or `clientcert=`).
fn cert_hint(settings: &PostgresSettings, message: &str) -> String {
    if !message.contains("certificate") {
        return String::new();
    }
    match &settings.sslcert {
        None => "; set postgres.sslcert and postgres.sslkey to a client certificate signed by a CA in the server's ssl_ca_file, whose CN is the role".into(),
        Some(cert) => format!(
            "; the CN of postgres.sslcert {} must be the role in postgres.url (or mapped to it in pg_ident.conf)",
            cert.display()
        ),
    }
}

/// SQLSTATE and message of an ErrorResponse body.
fn error_fields(body: &[u8]) -> (String, String) {
    let (mut code, mut message) = (String::new(), String::new());
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]).into_owned();
        match kind {
            b'C' => code = value,
            b'M' => message = value,
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or_default();
    }
    (code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_response_fields_are_read() {
        let body = b"SFATAL\0C28000\0Mno pg_hba.conf entry\0\0";
        assert_eq!(
            error_fields(body),
            ("28000".to_owned(), "no pg_hba.conf entry".to_owned())
        );
    }
}
