//! Event contracts: a JSON Schema (draft 2020-12, or 7) per event type, read from local files.
//!
//! The relay checks each payload against its contract before publishing it, puts every contract
//! into a NATS KV bucket, and names it on each event in the `Outbox-Schema` header, whose value
//! is the contract's KV key (`<name>.<version>`). A consumer fetches that key, compiles the
//! stored document with [`Contract::from_stored`], and checks what it receives with the same
//! code the relay ran.
//!
//! The stored document is the schema *bundled*: every local file a `$ref` reaches is embedded
//! (under `$defs`, or `definitions` for draft 7) with a `file:///` URI relative to the
//! files' common directory as `$id` (the root file is `file:///<its name>`), so a validator in
//! any language resolves it without reading files, and the same files give the same document
//! wherever they are installed. The version is the first 12 hex digits of
//! the SHA-256 of the stored bytes: a changed schema, or a changed file it refers to, is a new
//! version, and a consumer can check the bytes it fetched against the version it was told.
//!
//! A `$ref` may reach only files in the contract file's directory or below it (once `..` and
//! symbolic links are resolved): what it reaches is embedded in a document every consumer
//! reads, so a file elsewhere on the host is refused ([`SchemaError::Outside`]).
//! [`document_refs`] rewrites a bundle's `$ref`s as JSON Pointers for a document that embeds
//! it (the AsyncAPI document), whose tools resolve `$ref`s without the `$id`s.
//!
//! `format` is an annotation here (not checked), as in draft 2020-12 and in the Python and
//! TypeScript consumers: a constraint that must hold is written as `pattern`.

use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

mod check;
mod files;
mod refs;

pub use check::{Limits, Violation};
pub use refs::document_refs;

/// The drafts a contract may declare with `$schema`.
const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";
const DRAFT_7: &str = "http://json-schema.org/draft-07/schema";

/// Hex digits of the document digest that form a contract's version.
const VERSION_DIGITS: usize = 12;

/// One compiled contract.
#[derive(Debug)]
pub struct Contract {
    name: String,
    version: String,
    key: String,
    stored: Vec<u8>,
    bundled: Value,
    source: String,
    validator: jsonschema::Validator,
}

/// Why a contract cannot be used. Each names the file (or KV key) and, where there is one, the
/// keyword at fault.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The file cannot be read.
    #[error("contract {path}: cannot read the file: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("contract {path}: not a JSON document: {source}")]
    NotJson {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// `$schema` names a draft other than 2020-12 or 7.
    #[error(
        "contract {path}: keyword `$schema` is `{found}`; contracts are JSON Schema draft 2020-12 (`{DRAFT_2020_12}`, the default) or draft 7 (`{DRAFT_7}#`)"
    )]
    Draft {
        /// The file.
        path: String,
        /// The `$schema` value.
        found: String,
    },
    /// A `$ref` that is not a local file, or a local file that cannot be read.
    #[error(
        "contract {path}: keyword `$ref`: {reason}. A contract may refer only to local files (relative paths or file:// URIs); nothing is fetched over the network"
    )]
    Reference {
        /// The file.
        path: String,
        /// What could not be resolved.
        reason: String,
    },
    /// A `$ref` that names a file outside the contract file's directory.
    #[error(
        "contract {path}: keyword `$ref` `{reference}` in {file} names {target}, outside {root}, the contract file's directory (after `..` and symbolic links are resolved). A contract may refer only to files in its own directory or below it: copy the file under {root} and refer to it by a path relative to the file that refers to it"
    )]
    Outside {
        /// The contract file.
        path: String,
        /// The file the `$ref` is in (the contract file, or a file it refers to).
        file: String,
        /// The `$ref` as written.
        reference: String,
        /// The file it names.
        target: String,
        /// The contract file's directory.
        root: String,
    },
    /// The schema does not compile: a keyword with a value its draft does not allow.
    #[error("contract {path}: keyword `{keyword}` at {location}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// The keyword.
        keyword: String,
        /// Where in the schema (a JSON Pointer).
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// A contract name that cannot be a KV key part.
    #[error(
        "contract name `{0}` must be 1 to 64 characters of A-Z, a-z, 0-9, `_` and `-` (it is part of the NATS KV key)"
    )]
    Name(String),
    /// A stored contract whose bytes do not hash to the version its key names.
    #[error(
        "contract {key}: the stored document hashes to version {actual}, not to the version its key names"
    )]
    VersionMismatch {
        /// The KV key.
        key: String,
        /// The digest of the bytes read.
        actual: String,
    },
}

impl Contract {
    /// Reads and compiles the contract in `path` under `name` (its file stem when `None`).
    pub fn load(path: &Path, name: Option<&str>) -> Result<Self, SchemaError> {
        let shown = path.display().to_string();
        let name = match name {
            Some(name) => name.to_owned(),
            None => path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        check_name(&name)?;
        let absolute = std::fs::canonicalize(path).map_err(|source| SchemaError::Read {
            path: shown.clone(),
            source,
        })?;
        let schema = files::read_json(&absolute).map_err(|e| e.at(&shown))?;
        let draft = draft_of(&schema, &shown)?;
        let base = files::file_uri(&absolute);
        let root = files::root_of(&absolute).to_path_buf();
        files::confine(&absolute, &schema).map_err(|outside| SchemaError::Outside {
            path: shown.clone(),
            file: if outside.file == absolute {
                shown.clone()
            } else {
                outside.file.display().to_string()
            },
            reference: outside.written,
            target: outside.target.display().to_string(),
            root: root.display().to_string(),
        })?;
        let mut rooted = schema;
        if let Value::Object(map) = &mut rooted
            && !map.contains_key("$id")
        {
            // The bundle's embedded files are found by their URIs relative to this one.
            map.insert("$id".into(), Value::String(base.clone()));
        }
        let options = || {
            jsonschema::options()
                .with_draft(draft)
                .with_base_uri(base.clone())
                .with_retriever(files::LocalFiles { root: root.clone() })
                .should_validate_formats(false)
        };
        options()
            .build(&rooted)
            .map_err(|e| compile_error(&shown, &e))?;
        let bundled = options()
            .bundle(&rooted)
            .map_err(|e| reference_error(&shown, &e))?;
        let bundled = files::relocate(bundled, &base);
        // Compiled from the stored document alone, as consumers compile it: it must not need
        // the files any more.
        let validator = jsonschema::options()
            .with_draft(draft)
            .should_validate_formats(false)
            .build(&bundled)
            .map_err(|e| compile_error(&shown, &e))?;
        let stored = serde_json::to_vec(&bundled).unwrap_or_default();
        let version = version_of(&stored);
        Ok(Self {
            key: format!("{name}.{version}"),
            name,
            version,
            stored,
            bundled,
            source: shown,
            validator,
        })
    }

    /// Compiles a stored contract (the value under KV key `key`), checking that its bytes are
    /// the version the key names.
    pub fn from_stored(key: &str, stored: &[u8]) -> Result<Self, SchemaError> {
        let (name, version) = key.rsplit_once('.').unwrap_or((key, ""));
        let actual = version_of(stored);
        if actual != version {
            return Err(SchemaError::VersionMismatch {
                key: key.to_owned(),
                actual,
            });
        }
        let bundled: Value =
            serde_json::from_slice(stored).map_err(|source| SchemaError::NotJson {
                path: key.to_owned(),
                source,
            })?;
        let draft = draft_of(&bundled, key)?;
        let validator = jsonschema::options()
            .with_draft(draft)
            .should_validate_formats(false)
            .build(&bundled)
            .map_err(|e| compile_error(key, &e))?;
        Ok(Self {
            name: name.to_owned(),
            version: actual,
            key: key.to_owned(),
            stored: stored.to_vec(),
            bundled,
            source: key.to_owned(),
            validator,
        })
    }

    /// The contract's name (the KV key's first part).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version: the first 12 hex digits of the SHA-256 of [`Self::stored`].
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `<name>.<version>`: the KV key and the `Outbox-Schema` header's value.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The bytes stored under [`Self::key`]: the bundled schema.
    pub fn stored(&self) -> &[u8] {
        &self.stored
    }

    /// The bundled schema.
    pub fn schema(&self) -> &Value {
        &self.bundled
    }

    /// Where it was read from (a file, or a KV key).
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// `name` as a KV key part.
pub fn check_name(name: &str) -> Result<(), SchemaError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SchemaError::Name(name.to_owned()))
    }
}

fn version_of(stored: &[u8]) -> String {
    let digest = Sha256::digest(stored);
    let mut hex = String::with_capacity(VERSION_DIGITS);
    for byte in digest.iter().take(VERSION_DIGITS / 2) {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

fn draft_of(schema: &Value, path: &str) -> Result<jsonschema::Draft, SchemaError> {
    match schema.get("$schema") {
        None => Ok(jsonschema::Draft::Draft202012),
        Some(Value::String(s)) if s.trim_end_matches('#') == DRAFT_2020_12 => {
            Ok(jsonschema::Draft::Draft202012)
        }
        Some(Value::String(s)) if s.trim_end_matches('#') == DRAFT_7 => {
            Ok(jsonschema::Draft::Draft7)
        }
        Some(other) => Err(SchemaError::Draft {
            path: path.to_owned(),
            found: match other {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        }),
    }
}

fn reference_error(path: &str, error: &dyn std::error::Error) -> SchemaError {
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        reason.push_str(": ");
        reason.push_str(&inner.to_string());
        source = inner.source();
    }
    SchemaError::Reference {
        path: path.to_owned(),
        reason,
    }
}

fn compile_error(path: &str, error: &jsonschema::ValidationError<'_>) -> SchemaError {
    if let jsonschema::error::ValidationErrorKind::Referencing(e) = error.kind() {
        return reference_error(path, e);
    }
    // The error is the schema failing its draft's meta-schema: the instance is the schema.
    let location = error.instance_path().as_str();
    let keyword = location
        .rsplit('/')
        .find(|part| !part.is_empty() && part.parse::<usize>().is_err())
        .unwrap_or(error.kind().keyword());
    SchemaError::Invalid {
        path: path.to_owned(),
        keyword: keyword.replace("~1", "/").replace("~0", "~"),
        location: if location.is_empty() {
            "the root".to_owned()
        } else {
            location.to_owned()
        },
        reason: check::cut(&error.to_string(), 240),
    }
}

#[cfg(test)]
mod tests;
