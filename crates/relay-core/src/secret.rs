//! Secrets in the configuration: passwords, tokens, NKey seeds, and connection URLs that may
//! carry a password.
//!
//! A [`Secret`] prints and serializes as [`REDACTED`] and is read only through
//! [`Secret::expose`], so a settings struct holding one can derive `Debug` and `Serialize`
//! (`validate`, `config print`) without redaction code of its own. A URL's password is replaced
//! by [`redact_url`], the one function for it; settings serialize their URLs through
//! [`serialize_url`]. A secret kept in a file (`password_file`, `token_file`, ...) is read by
//! [`read_secret_file`], the one reader of them.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a secret reads as wherever it is shown.
pub const REDACTED: &str = "<redacted>";

/// A secret string: [`REDACTED`] in `Debug`, `Display` and serialization; its value only
/// through [`Secret::expose`]. Deserializes from a plain string.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that hands it to a server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}

/// `url` with the password of each URL in it replaced by [`REDACTED`], for logs, errors and
/// printed configurations: `postgres://relay:pw@db/app` → `postgres://relay:<redacted>@db/app`.
/// A comma-separated list of URLs (NATS cluster seeds) is redacted URL by URL; a comma that
/// does not start a new `scheme://` (a PostgreSQL multi-host list, a comma in a password)
/// stays inside its URL.
pub fn redact_url(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut start = 0;
    for (i, _) in url.match_indices(',') {
        if starts_url(&url[i + 1..]) {
            out.push_str(&redact_one(&url[start..i]));
            out.push(',');
            start = i + 1;
        }
    }
    out.push_str(&redact_one(&url[start..]));
    out
}

/// Whether `text` begins (after spaces) with `scheme://`.
fn starts_url(text: &str) -> bool {
    let text = text.trim_start();
    text.find("://").is_some_and(|end| {
        end > 0
            && text[..end]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    })
}

/// One URL with its password replaced.
fn redact_one(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    format!("{}{user}:{REDACTED}{}", &url[..scheme_end + 3], &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Serializes a URL setting through [`redact_url`] (`#[serde(serialize_with = ...)]`).
pub fn serialize_url<S: Serializer>(url: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&redact_url(url))
}

/// `Debug` for a settings struct through its `Serialize`: the redaction of its secrets
/// ([`Secret`]) and URLs ([`serialize_url`]) is then the same in both, and a field added
/// later cannot print in one what the other hides. Reads as `Name {"field":value,...}`.
pub fn debug_serialized<T: Serialize>(
    name: &str,
    value: &T,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let text = if f.alternate() {
        serde_json::to_string_pretty(value)
    } else {
        serde_json::to_string(value)
    };
    write!(f, "{name} {}", text.map_err(|_| fmt::Error)?)
}

/// Why a secret file gave no secret. The message names the setting and the file, never what
/// the file holds.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file cannot be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Unreadable {
        /// The setting that names the file, e.g. `postgres.password_file`.
        what: String,
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The file holds nothing but white space.
    #[error("{what} {} is empty", path.display())]
    Empty {
        /// The setting that names the file.
        what: String,
        /// The file.
        path: PathBuf,
    },
}

/// The secret in the file at `path`, which setting `what` names: its contents, trimmed (a
/// trailing newline, as editors and `echo` write, is not part of the secret).
pub fn read_secret_file(what: &str, path: &Path) -> Result<Secret, SecretFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretFileError::Unreadable {
        what: what.to_owned(),
        path: path.to_owned(),
        source,
    })?;
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(SecretFileError::Empty {
            what: what.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(Secret::from(trimmed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_file_is_read_trimmed_and_its_errors_name_the_file_not_the_contents() {
        let dir = std::env::temp_dir().join(format!("relay-core-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        std::fs::write(&file, "\n  s3cret-value \n").unwrap();
        let read = read_secret_file("postgres.password_file", &file).unwrap();
        assert_eq!(read.expose(), "s3cret-value");

        let blank = dir.join("blank");
        std::fs::write(&blank, " \n\t\n").unwrap();
        let empty = read_secret_file("nats.token_file", &blank).unwrap_err();
        assert!(matches!(empty, SecretFileError::Empty { .. }), "{empty:?}");
        assert_eq!(
            empty.to_string(),
            format!("nats.token_file {} is empty", blank.display())
        );

        let missing = dir.join("nope");
        let unreadable = read_secret_file("nats.nkey_seed_file", &missing).unwrap_err();
        let text = unreadable.to_string();
        assert!(
            text.starts_with(&format!(
                "cannot read nats.nkey_seed_file {}: ",
                missing.display()
            )),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_secret_shows_only_as_redacted() {
        let secret = Secret::from("hunter2");
        assert_eq!(secret.expose(), "hunter2");
        let shown = format!(
            "{secret} {secret:?} {secret:#?} {} {:?}",
            serde_json::to_string(&secret).expect("serializes"),
            Some(secret.clone()),
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(format!("{secret}"), REDACTED);
        let read: Secret = serde_json::from_str("\"from-json\"").expect("a string");
        assert_eq!(read.expose(), "from-json");
    }

    #[test]
    fn url_passwords_are_redacted_url_by_url() {
        for (url, shown) in [
            (
                "postgres://relay:s3cret@db.example:6543/app",
                "postgres://relay:<redacted>@db.example:6543/app",
            ),
            ("postgres://relay@db/app", "postgres://relay@db/app"),
            ("postgres://db/app", "postgres://db/app"),
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            // A password with `@` or `,` in it stays hidden.
            (
                "postgres://u:p@ss,w@h1:5432,h2:5432/db",
                "postgres://u:<redacted>@h1:5432,h2:5432/db",
            ),
            (
                "nats://a:pw1@h1:4222, nats://b:pw2@h2:4222,tls://h3",
                "nats://a:<redacted>@h1:4222, nats://b:<redacted>@h2:4222,tls://h3",
            ),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
