//! The PEM files of the relay's TLS clients: PostgreSQL's `sslrootcert`, `sslcert` and `sslkey`
//! (relay-postgres), NATS' `tls_ca_file`, `tls_cert_file` and `tls_key_file` (relay-nats), read
//! here so that a bad file gets the same message whichever client reads it.
//!
//! A crate of its own because neither client crate depends on the other, and relay-core, which
//! both do, holds no TLS types (it depends on no IO crate).
//!
//! Errors name the setting and the file, never what the file holds.

// What a module exports to its siblings only is `pub(crate)`: `pub` is the crate's API.
#![warn(unreachable_pub)]

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::{self, PemObject as _};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a PEM file gave no certificate or key.
#[derive(Debug, thiserror::Error)]
pub enum PemFileError {
    /// The file cannot be read or does not parse as PEM.
    #[error("cannot read {what} {}: {source}", path.display())]
    Unreadable {
        /// The setting that names the file, e.g. `postgres.sslrootcert`.
        what: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: pem::Error,
    },
    /// The file holds no `CERTIFICATE` section.
    #[error("{what} {} holds no PEM certificate", path.display())]
    NoCertificate {
        /// The setting that names the file.
        what: String,
        /// The file.
        path: PathBuf,
    },
}

fn unreadable(what: &str, path: &Path) -> impl FnOnce(pem::Error) -> PemFileError {
    move |source| PemFileError::Unreadable {
        what: what.to_owned(),
        path: path.to_owned(),
        source,
    }
}

/// Every certificate in the PEM file at `path` (a CA bundle, or a chain leaf first), which
/// setting `what` names; a file without one is an error.
pub fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, PemFileError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(unreadable(what, path))?;
    if certs.is_empty() {
        return Err(PemFileError::NoCertificate {
            what: what.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in the PEM file at `path`, which setting
/// `what` names.
pub fn load_private_key(what: &str, path: &Path) -> Result<PrivateKeyDer<'static>, PemFileError> {
    PrivateKeyDer::from_pem_file(path).map_err(unreadable(what, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_and_keys_are_read_and_bad_files_name_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["db.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let bundle = dir.path().join("bundle.pem");
        std::fs::write(&bundle, format!("{}{}", cert.pem(), cert.pem())).unwrap();
        let key_file = dir.path().join("client.key");
        std::fs::write(&key_file, key.serialize_pem()).unwrap();

        let certs = load_certs("postgres.sslrootcert", &bundle).unwrap();
        assert_eq!(certs.len(), 2, "every certificate of a bundle");
        assert_eq!(certs[0].as_ref(), cert.der().as_ref());
        let read = load_private_key("nats.tls_key_file", &key_file).unwrap();
        assert_eq!(read.secret_der(), key.serialize_der().as_slice());

        // A key file is no certificate file, and a certificate file holds no key.
        let no_cert = load_certs("nats.tls_ca_file", &key_file).unwrap_err();
        assert!(
            matches!(no_cert, PemFileError::NoCertificate { .. }),
            "{no_cert:?}"
        );
        assert_eq!(
            no_cert.to_string(),
            format!(
                "nats.tls_ca_file {} holds no PEM certificate",
                key_file.display()
            )
        );
        let no_key = load_private_key("postgres.sslkey", &bundle).unwrap_err();
        assert!(
            no_key.to_string().starts_with(&format!(
                "cannot read postgres.sslkey {}: ",
                bundle.display()
            )),
            "{no_key}"
        );
        let missing = dir.path().join("nope.pem");
        let text = load_certs("postgres.sslcert", &missing)
            .unwrap_err()
            .to_string();
        assert!(
            text.starts_with(&format!(
                "cannot read postgres.sslcert {}: ",
                missing.display()
            )),
            "{text}"
        );
    }
}
