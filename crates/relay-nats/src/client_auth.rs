//! The credentials and TLS of both NATS clients, resolved once from `[nats]`: the async-nats
//! management connection ([`crate::connect`], through [`ClientAuth::configure`]) and the lean
//! publish connection (crate `nats-wire`, through [`crate::wire`]) authenticate and verify servers from the same files,
//! read once here, and a bad file gets one message whichever client would have read it.
//!
//! Errors name the setting and the file, never its contents, and say what was expected.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nkeys::KeyPair;
use relay_core::secret::{Secret, read_secret_file};
use rustls::pki_types::CertificateDer;

use crate::error::NatsError;
use crate::settings::NatsSettings;

/// How the relay's NATS clients authenticate and verify the server.
pub(crate) struct ClientAuth {
    /// `user` with `password` or `password_file`.
    pub(crate) user: Option<(String, Secret)>,
    /// `token` or `token_file`.
    pub(crate) token: Option<Secret>,
    /// `nkey_seed` or `nkey_seed_file`: the public key goes in `CONNECT`, the key signs the
    /// server's nonce.
    pub(crate) nkey: Option<NkeySeed>,
    /// `credentials_file`: the user JWT, and the key of the file's seed that signs the nonce.
    pub(crate) jwt: Option<(String, Arc<KeyPair>)>,
    pub(crate) tls: ClientTls,
}

/// An NKey seed and its key pair.
pub(crate) struct NkeySeed {
    /// async-nats takes the seed itself.
    seed: Secret,
    pub(crate) pair: Arc<KeyPair>,
}

/// The rustls configuration both clients verify servers with.
pub(crate) enum ClientTls {
    Ready(Arc<rustls::ClientConfig>),
    /// No `tls_ca_file`, and the platform's trust store could not be loaded: an error only
    /// once a server asks for TLS (set-up fails at once where the settings ask for it).
    NoTrustStore(String),
}

impl ClientTls {
    /// The configuration, or why there is none.
    pub(crate) fn config(&self) -> Result<&Arc<rustls::ClientConfig>, &str> {
        match self {
            Self::Ready(config) => Ok(config),
            Self::NoTrustStore(why) => Err(why),
        }
    }
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("token", &self.token.is_some())
            .field("nkey", &self.nkey.as_ref().map(|n| n.pair.public_key()))
            .field("jwt", &self.jwt.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientAuth {
    /// Reads every credential and TLS file `settings` name.
    pub(crate) fn from_settings(settings: &NatsSettings) -> Result<Self, NatsError> {
        let jwt = match &settings.credentials_file {
            Some(path) => {
                let (jwt, pair) = read_creds(path).map_err(|e| {
                    NatsError::Settings(format!(
                        "cannot use nats.credentials_file {}: {e} (expected a .creds file with a user JWT and an NKey seed, as `nsc generate creds` writes)",
                        path.display()
                    ))
                })?;
                Some((jwt, Arc::new(pair)))
            }
            None => None,
        };
        let user = match &settings.user {
            Some(user) => {
                let password = resolved_password(settings)?.ok_or_else(|| {
                    NatsError::Settings(
                        "nats.user is set without nats.password or nats.password_file".into(),
                    )
                })?;
                Some((user.clone(), password))
            }
            None => None,
        };
        let token = resolved_token(settings)?;
        let nkey = match resolved_nkey_seed(settings)? {
            Some(seed) => {
                let pair = KeyPair::from_seed(seed.expose()).map_err(|e| {
                    NatsError::Settings(format!(
                        "nats.nkey_seed (or nats.nkey_seed_file) is not an NKey seed: {e} (expected a user seed starting with SU, as `nsc` or `nk -gen user` writes)"
                    ))
                })?;
                Some(NkeySeed {
                    seed,
                    pair: Arc::new(pair),
                })
            }
            None => None,
        };
        Ok(Self {
            user,
            token,
            nkey,
            jwt,
            tls: tls_config(settings)?,
        })
    }

    /// async-nats' options with these credentials and this TLS configuration.
    pub(crate) fn configure(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> async_nats::ConnectOptions {
        if let Some((jwt, pair)) = &self.jwt {
            let pair = pair.clone();
            options = options.jwt(jwt.clone(), move |nonce| {
                let pair = pair.clone();
                async move { pair.sign(&nonce).map_err(async_nats::AuthError::new) }
            });
        }
        if let Some((user, password)) = &self.user {
            options = options.user_and_password(user.clone(), password.expose().to_owned());
        }
        if let Some(token) = &self.token {
            options = options.token(token.expose().to_owned());
        }
        if let Some(nkey) = &self.nkey {
            options = options.nkey(nkey.seed.expose().to_owned());
        }
        // Without a configuration (no trust store), async-nats tries the platform's itself and
        // fails the same way once a server asks for TLS.
        if let ClientTls::Ready(config) = &self.tls {
            options = options.tls_client_config(config.as_ref().clone());
        }
        options
    }
}

/// Reads and checks every credential and TLS file `settings` name, as [`crate::connect`] does
/// before it dials (without connecting): a file that cannot be read or used is the same error.
pub fn check_files(settings: &NatsSettings) -> Result<(), NatsError> {
    ClientAuth::from_settings(settings).map(drop)
}

/// `password_file`'s contents, else `password`.
pub(crate) fn resolved_password(settings: &NatsSettings) -> Result<Option<Secret>, NatsError> {
    resolve(
        "nats.password_file",
        &settings.password_file,
        &settings.password,
    )
}

/// `token_file`'s contents, else `token`.
pub(crate) fn resolved_token(settings: &NatsSettings) -> Result<Option<Secret>, NatsError> {
    resolve("nats.token_file", &settings.token_file, &settings.token)
}

/// `nkey_seed_file`'s contents, else `nkey_seed`.
pub(crate) fn resolved_nkey_seed(settings: &NatsSettings) -> Result<Option<Secret>, NatsError> {
    resolve(
        "nats.nkey_seed_file",
        &settings.nkey_seed_file,
        &settings.nkey_seed,
    )
}

/// Trimmed contents of `file` if set, else `value`. Errors name the file, never the contents.
fn resolve(
    what: &str,
    file: &Option<PathBuf>,
    value: &Option<Secret>,
) -> Result<Option<Secret>, NatsError> {
    let Some(path) = file else {
        return Ok(value.clone());
    };
    read_secret_file(what, path)
        .map(Some)
        .map_err(|e| NatsError::Settings(e.to_string()))
}

/// The user JWT and NKey seed of a `.creds` file.
fn read_creds(path: &Path) -> Result<(String, KeyPair), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    // Each part sits between a `-----BEGIN ...-----` line and a `------END ...------` line.
    let section = |begin: &str| -> Option<String> {
        let mut lines = text.lines().skip_while(|l| !l.contains(begin));
        lines.next()?;
        lines
            .map(str::trim)
            .find(|l| !l.is_empty())
            .filter(|l| !l.starts_with("---"))
            .map(str::to_owned)
    };
    let jwt = section("BEGIN NATS USER JWT").ok_or("cannot parse a user JWT from it")?;
    let seed = section("BEGIN USER NKEY SEED").ok_or("cannot parse an NKey seed from it")?;
    let pair = KeyPair::from_seed(&seed).map_err(|e| format!("bad NKey seed: {e}"))?;
    Ok((jwt, pair))
}

/// Whether the settings themselves ask for TLS (`tls_required`, a `tls://` URL), so that a
/// missing trust store is an error at start-up rather than at the first connection.
fn tls_asked(settings: &NatsSettings) -> bool {
    settings.tls_required
        || settings
            .url
            .split(',')
            .any(|url| url.trim().to_ascii_lowercase().starts_with("tls://"))
}

fn tls_config(settings: &NatsSettings) -> Result<ClientTls, NatsError> {
    let err = NatsError::Settings;
    // Named, not the process default: ring and aws-lc-rs are both linked in.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(format!("TLS set-up failed: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    let mut no_trust_store = None;
    match &settings.tls_ca_file {
        Some(path) => {
            for cert in load_certs("nats.tls_ca_file", path)? {
                roots
                    .add(cert)
                    .map_err(|e| err(format!("nats.tls_ca_file {}: {e}", path.display())))?;
            }
        }
        // The platform's trust store, as async-nats loads it: a CA installed system-wide must
        // work for both clients.
        None => {
            let native = rustls_native_certs::load_native_certs();
            if native.certs.is_empty() && !native.errors.is_empty() {
                let errors: Vec<String> = native.errors.iter().map(ToString::to_string).collect();
                let why = format!(
                    "cannot load the platform's CA certificates ({}): set nats.tls_ca_file",
                    errors.join("; ")
                );
                if tls_asked(settings) {
                    return Err(err(why));
                }
                no_trust_store = Some(why);
            }
            roots.add_parsable_certificates(native.certs);
        }
    }
    let builder = builder.with_root_certificates(roots);
    let config = match (&settings.tls_cert_file, &settings.tls_key_file) {
        (Some(cert), Some(key)) => {
            let chain = load_certs("nats.tls_cert_file", cert)?;
            let key = relay_tls::load_private_key("nats.tls_key_file", key)
                .map_err(|e| err(e.to_string()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| err(format!("nats.tls_cert_file/tls_key_file: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(err(
                "nats.tls_cert_file and nats.tls_key_file must be set together".into(),
            ));
        }
    };
    Ok(match no_trust_store {
        Some(why) => ClientTls::NoTrustStore(why),
        None => ClientTls::Ready(Arc::new(config)),
    })
}

fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, NatsError> {
    relay_tls::load_certs(what, path).map_err(|e| NatsError::Settings(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("relay-nats-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn settings_error(settings: &NatsSettings) -> String {
        ClientAuth::from_settings(settings).unwrap_err().to_string()
    }

    #[test]
    fn creds_files_give_the_jwt_and_the_seed() {
        let pair = KeyPair::new_user();
        let seed = pair.seed().unwrap();
        let text = format!(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAi.payload.sig\n------END NATS USER JWT------\n\n\
************************* IMPORTANT *************************\n\n\
-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        );
        let dir = temp_dir("creds");
        let path = dir.join("user.creds");
        std::fs::write(&path, text).unwrap();
        let auth = ClientAuth::from_settings(&NatsSettings {
            credentials_file: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        let (jwt, read) = auth.jwt.as_ref().expect("a JWT");
        assert_eq!(jwt, "eyJ0eXAi.payload.sig");
        assert_eq!(read.public_key(), pair.public_key());
        let garbled = NatsSettings {
            credentials_file: Some(path.clone()),
            ..Default::default()
        };
        std::fs::write(&path, "not a creds file\n").unwrap();
        let err = settings_error(&garbled);
        assert!(
            err.contains("nats.credentials_file")
                && err.contains("user.creds")
                && err.contains("cannot parse a user JWT"),
            "{err}"
        );
        assert!(!err.contains("not a creds file"), "contents leaked: {err}");
        std::fs::remove_file(&path).unwrap();
        assert!(settings_error(&garbled).contains("user.creds"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn seeds_users_and_client_certificates_are_checked_before_connecting() {
        let pair = KeyPair::new_user();
        let auth = ClientAuth::from_settings(&NatsSettings {
            nkey_seed: Some(pair.seed().unwrap().as_str().into()),
            user: Some("relay".into()),
            password: Some("pw".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            auth.nkey.as_ref().unwrap().pair.public_key(),
            pair.public_key()
        );
        assert_eq!(auth.user.as_ref().unwrap().1.expose(), "pw");
        let printed = format!("{auth:?}");
        assert!(
            !printed.contains("pw") && !printed.contains(&pair.seed().unwrap()),
            "{printed}"
        );
        let err = settings_error(&NatsSettings {
            nkey_seed: Some("SUnot-a-seed".into()),
            ..Default::default()
        });
        assert!(
            err.contains("is not an NKey seed") && !err.contains("SUnot"),
            "{err}"
        );
        let err = settings_error(&NatsSettings {
            user: Some("relay".into()),
            ..Default::default()
        });
        assert!(err.contains("without nats.password"), "{err}");
        let dir = temp_dir("tls");
        let err = settings_error(&NatsSettings {
            tls_cert_file: Some(dir.join("cert.pem")),
            ..Default::default()
        });
        assert!(err.contains("must be set together"), "{err}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = settings_error(&NatsSettings {
            tls_ca_file: Some(empty),
            ..Default::default()
        });
        assert!(
            err.contains("nats.tls_ca_file") && err.contains("holds no PEM certificate"),
            "{err}"
        );
        let err = settings_error(&NatsSettings {
            tls_ca_file: Some(dir.join("missing.pem")),
            ..Default::default()
        });
        assert!(
            err.contains("cannot read nats.tls_ca_file") && err.contains("missing.pem"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
