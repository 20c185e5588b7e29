//! TLS: for the plain sessions (tokio-postgres through tokio-postgres-rustls), the
//! authentication probe (tokio-rustls), and the replication session (pgwire-replication's own
//! rustls, configured from the same settings).
//!
//! Certificate checks follow libpq's `sslmode`: `prefer` and `require` encrypt without
//! verifying, `verify-ca` verifies the chain against `sslrootcert`, `verify-full` also checks the
//! host name (or IP address) in the URL against the certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::PgError;
use crate::settings::{PostgresSettings, SslMode};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // Both ring and aws-lc-rs are linked into the binary (async-nats brings the latter), so the
    // provider is named instead of relying on a process default.
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(message: String) -> PgError {
    PgError::Settings(message)
}

fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, PgError> {
    relay_tls::load_certs(what, path).map_err(|e| tls_err(e.to_string()))
}

impl PostgresSettings {
    /// Reads and checks every file these settings name (`password_file`, and `sslrootcert`,
    /// `sslcert` and `sslkey` where `sslmode` uses them), as a connection does before it dials,
    /// without connecting.
    pub fn check_files(&self) -> Result<(), PgError> {
        self.client_config()?;
        client_config(self).map(drop)
    }
}

/// The rustls client configuration for `settings`' sslmode, or `None` for `disable`.
pub(crate) fn client_config(
    settings: &PostgresSettings,
) -> Result<Option<rustls::ClientConfig>, PgError> {
    let mode = settings.ssl_mode()?;
    if mode == SslMode::Disable {
        return Ok(None);
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(format!("TLS set-up failed: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(server_verifier(settings, mode)?);
    let config = match (&settings.sslcert, &settings.sslkey) {
        (Some(cert), Some(key)) => {
            let chain = load_certs("postgres.sslcert", cert)?;
            let key = relay_tls::load_private_key("postgres.sslkey", key)
                .map_err(|e| tls_err(e.to_string()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_err(format!("postgres.sslcert/sslkey: {e}")))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Some(config))
}

/// How the server's certificate is checked in `mode` (not `disable`): the WebPKI verifier
/// over `sslrootcert` for `verify-full`, [`BelowVerifyFull`] for the modes below it.
fn server_verifier(
    settings: &PostgresSettings,
    mode: SslMode,
) -> Result<Arc<dyn ServerCertVerifier>, PgError> {
    if !matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
        return Ok(Arc::new(BelowVerifyFull::new(None)));
    }
    let path = settings.sslrootcert.as_deref().ok_or_else(|| {
        tls_err(format!(
            "postgres.sslmode = {} needs postgres.sslrootcert",
            mode.as_str()
        ))
    })?;
    let mut roots = RootCertStore::empty();
    for cert in load_certs("postgres.sslrootcert", path)? {
        roots
            .add(cert)
            .map_err(|e| tls_err(format!("postgres.sslrootcert {}: {e}", path.display())))?;
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| tls_err(format!("TLS set-up failed: {e}")))?;
    Ok(if mode == SslMode::VerifyFull {
        webpki
    } else {
        Arc::new(BelowVerifyFull::new(Some(webpki)))
    })
}

/// pgwire-replication's TLS settings for the replication session.
pub(crate) fn replication_tls(
    settings: &PostgresSettings,
    host: &str,
) -> Result<pgwire_replication::TlsConfig, PgError> {
    use pgwire_replication::SslMode as Wire;
    let mode = settings.ssl_mode()?;
    let mut tls = pgwire_replication::TlsConfig {
        mode: match mode {
            SslMode::Disable => Wire::Disable,
            SslMode::Prefer => Wire::Prefer,
            SslMode::Require => Wire::Require,
            SslMode::VerifyCa => Wire::VerifyCa,
            SslMode::VerifyFull => Wire::VerifyFull,
        },
        ca_pem_path: settings.sslrootcert.clone(),
        ..Default::default()
    };
    if mode == SslMode::VerifyFull {
        // pgwire-replication refuses verify-full with an IP literal unless the name to check is
        // given explicitly; rustls then checks the certificate's IP address SAN.
        tls.sni_hostname = Some(host.to_owned());
    }
    if let (Some(cert), Some(key)) = (&settings.sslcert, &settings.sslkey) {
        tls.client_cert_pem_path = Some(cert.clone());
        tls.client_key_pem_path = Some(key.clone());
    }
    Ok(tls)
}

/// The server check of the sslmodes below `verify-full`, as libpq: `prefer` and `require`
/// (`chain: None`) encrypt without authenticating the server; `verify-ca` (`chain` the CA's
/// verifier) needs a chain to the CA but accepts any name. Both still check the handshake's
/// signatures, with the provider's algorithms (what the WebPKI verifier itself uses).
#[derive(Debug)]
struct BelowVerifyFull {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl BelowVerifyFull {
    fn new(chain: Option<Arc<WebPkiServerVerifier>>) -> Self {
        Self {
            chain,
            algorithms: provider().signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for BelowVerifyFull {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
