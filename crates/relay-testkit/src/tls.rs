//! A throw-away certificate authority for TLS-enabled test servers.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A test CA: its certificate in `ca.crt` (PEM) in a directory of the caller's choice, and a
/// key that issues server and client certificates.
pub struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    cert_path: PathBuf,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

/// A certificate and its key, written as PEM files.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// The certificate (PEM).
    pub cert_path: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key_path: PathBuf,
}

impl TestCa {
    /// Makes a new CA named `name` and writes its certificate to `dir/<name>-ca.crt`.
    pub fn new(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate().context("generating the test CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("relay-testkit {name} CA"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .context("self-signing the test CA")?;
        let cert_path = dir.join(format!("{name}-ca.crt"));
        std::fs::write(&cert_path, cert.pem()).context("writing the CA certificate")?;
        Ok(Self {
            params,
            key,
            cert_path,
        })
    }

    /// The CA certificate (PEM).
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// Issues a server certificate for `names` (DNS names or IP addresses) into
    /// `dir/<file_stem>.crt` and `.key`.
    pub fn issue_server(
        &self,
        dir: &Path,
        file_stem: &str,
        names: &[&str],
    ) -> anyhow::Result<IssuedCert> {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone())?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(dir, file_stem, params)
    }

    /// Issues a client certificate with common name `cn`.
    pub fn issue_client(
        &self,
        dir: &Path,
        file_stem: &str,
        cn: &str,
    ) -> anyhow::Result<IssuedCert> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(dir, file_stem, params)
    }

    fn issue(
        &self,
        dir: &Path,
        file_stem: &str,
        params: CertificateParams,
    ) -> anyhow::Result<IssuedCert> {
        let key = KeyPair::generate().context("generating a certificate key")?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params
            .signed_by(&key, &issuer)
            .context("signing a test certificate")?;
        let cert_path = dir.join(format!("{file_stem}.crt"));
        let key_path = dir.join(format!("{file_stem}.key"));
        std::fs::write(&cert_path, cert.pem()).context("writing a certificate")?;
        std::fs::write(&key_path, key.serialize_pem()).context("writing a key")?;
        Ok(IssuedCert {
            cert_path,
            key_path,
        })
    }
}
