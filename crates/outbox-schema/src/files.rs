//! Contract files: reading them, naming them as `file://` URIs, the check that every file a
//! contract refers to lies in the contract file's directory, and the retriever that lets a
//! `$ref` reach those files and nothing else.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use serde_json::Value;

use crate::SchemaError;
use crate::refs::{Mark, split_fragment, walk};

/// Characters escaped in a path segment of a `file://` URI.
const PATH_SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b']')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// A file that could not become a schema document (the caller adds which contract).
pub(crate) enum FileError {
    Read(std::io::Error),
    NotJson(serde_json::Error),
}

impl FileError {
    pub(crate) fn at(self, path: &str) -> SchemaError {
        match self {
            Self::Read(source) => SchemaError::Read {
                path: path.to_owned(),
                source,
            },
            Self::NotJson(source) => SchemaError::NotJson {
                path: path.to_owned(),
                source,
            },
        }
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Value, FileError> {
    let bytes = std::fs::read(path).map_err(FileError::Read)?;
    serde_json::from_slice(&bytes).map_err(FileError::NotJson)
}

/// `file:///…` for an absolute path.
pub(crate) fn file_uri(absolute: &Path) -> String {
    let mut uri = String::from("file://");
    for segment in absolute.to_string_lossy().split('/').skip(1) {
        uri.push('/');
        uri.extend(utf8_percent_encode(segment, PATH_SEGMENT));
    }
    uri
}

/// The local path a `file://` URI names, or why it names none.
fn path_of(uri: &str) -> Result<PathBuf, String> {
    let Some(rest) = uri.strip_prefix("file://") else {
        return Err(format!("`{uri}` is not a local file"));
    };
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return Err(format!("`{uri}` names a file on another host"));
    }
    let path = rest.split(['#', '?']).next().unwrap_or(rest);
    let decoded = percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| format!("`{uri}` is not a UTF-8 path"))?;
    Ok(PathBuf::from(decoded.as_ref()))
}

/// `bundle` (whose root `$id` is `root`) with every `file://` URI of its files made relative to
/// their common directory: `$id`s, `$ref`s and the keys of the embedded files.
pub(crate) fn relocate(mut bundle: Value, root: &str) -> Value {
    let embedded_keys = |bundle: &Value| -> Vec<String> {
        ["$defs", "definitions"]
            .iter()
            .filter_map(|key| bundle.get(key)?.as_object())
            .flat_map(|defs| defs.keys().filter(|k| k.starts_with("file://")).cloned())
            .collect()
    };
    let mut common = directory_of(root);
    for uri in embedded_keys(&bundle) {
        while !uri.starts_with(&common) {
            common = directory_of(common.trim_end_matches('/'));
        }
    }
    rewrite(&mut bundle, &common);
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = bundle.get_mut(key) {
            let moved: Vec<(String, Value)> = std::mem::take(defs).into_iter().collect();
            for (name, value) in moved {
                defs.insert(relative(&name, &common), value);
            }
        }
    }
    bundle
}

/// The directory part of a `file://` URI, with its trailing `/`.
fn directory_of(uri: &str) -> String {
    match uri.rfind('/') {
        Some(end) if end >= "file://".len() => uri[..=end].to_owned(),
        _ => "file:///".to_owned(),
    }
}

fn relative(uri: &str, common: &str) -> String {
    match uri.strip_prefix(common) {
        Some(rest) => format!("file:///{rest}"),
        None => uri.to_owned(),
    }
}

/// `$id` and `$ref` values under `common`, relative to it, anywhere in `value`.
fn rewrite(value: &mut Value, common: &str) {
    match value {
        Value::Object(map) => {
            for (key, member) in map.iter_mut() {
                match member {
                    Value::String(s) if key == "$id" || key == "$ref" => {
                        *s = relative(s, common);
                    }
                    other => rewrite(other, common),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rewrite(item, common)),
        _ => {}
    }
}

/// A `$ref` that names a file outside the contract's directory.
#[derive(Debug)]
pub(crate) struct Outside {
    /// The file the `$ref` is in.
    pub(crate) file: PathBuf,
    /// The `$ref` as written.
    pub(crate) written: String,
    /// The file it names, `..` and symbolic links resolved where it exists.
    pub(crate) target: PathBuf,
}

/// The directory the files of the contract in `top` (a canonical path) must lie in.
pub(crate) fn root_of(top: &Path) -> &Path {
    top.parent().unwrap_or(Path::new("/"))
}

/// Checks that every local file a `$ref` names, in `schema` (read from `top`, a canonical
/// path) or in a file such a `$ref` reaches, lies in `top`'s directory or below it once `..`
/// and symbolic links are resolved. A `$ref` to a resource the documents read hold (by its
/// `$id`) reads no file and is not checked; one that is no local file, or names a file that
/// cannot be read, is left to the compiler to refuse.
pub(crate) fn confine(top: &Path, schema: &Value) -> Result<(), Outside> {
    let root = root_of(top);
    let mut known: HashSet<String> = HashSet::new();
    let mut read: HashSet<PathBuf> = HashSet::from([top.to_path_buf()]);
    let mut queue: Vec<(PathBuf, Value)> = vec![(top.to_path_buf(), schema.clone())];
    while let Some((file, document)) = queue.pop() {
        let base = file_uri(&file);
        known.insert(base.clone());
        let mut refs: Vec<(String, String)> = Vec::new();
        walk(&document, &base, &mut |_, mark| match mark {
            Mark::Resource(uri) => {
                known.insert(uri);
            }
            Mark::Ref {
                written,
                target: Some(target),
            } => refs.push((written.to_owned(), target)),
            _ => {}
        });
        for (written, target) in refs {
            let uri = split_fragment(&target).0;
            if known.contains(uri) {
                continue;
            }
            let Ok(path) = path_of(uri).map(|p| lexical(&p)) else {
                continue;
            };
            let real = std::fs::canonicalize(&path).ok();
            if !real.as_deref().unwrap_or(&path).starts_with(root) {
                return Err(Outside {
                    file,
                    written,
                    target: real.unwrap_or(path),
                });
            }
            if let Some(real) = real
                && read.insert(real.clone())
                && let Ok(value) = read_json(&real)
            {
                queue.push((path, value));
            }
        }
    }
    Ok(())
}

/// `path` with its `.` and `..` components resolved without reading the file system.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Resolves `$ref`s to local files under `root` only.
#[derive(Debug, Clone)]
pub(crate) struct LocalFiles {
    /// The contract file's directory (canonical).
    pub(crate) root: PathBuf,
}

impl jsonschema::Retrieve for LocalFiles {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let path = path_of(uri.as_str())?;
        let real = std::fs::canonicalize(&path).unwrap_or_else(|_| lexical(&path));
        if !real.starts_with(&self.root) {
            return Err(format!(
                "{} is outside {}, the contract file's directory (a contract may refer only to files in its own directory or below it)",
                real.display(),
                self.root.display()
            )
            .into());
        }
        match read_json(&path) {
            Ok(value) => Ok(value),
            Err(FileError::Read(e)) => Err(format!("cannot read {}: {e}", path.display()).into()),
            Err(FileError::NotJson(e)) => {
                Err(format!("{} is not a JSON document: {e}", path.display()).into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_escape_and_round_trip() {
        let path = Path::new("/srv/contracts/order placed#1.json");
        let uri = file_uri(path);
        assert_eq!(uri, "file:///srv/contracts/order%20placed%231.json");
        assert_eq!(path_of(&uri).ok().as_deref(), Some(path));
        assert_eq!(
            path_of("file://localhost/a/b.json").ok(),
            Some(PathBuf::from("/a/b.json"))
        );
    }

    #[test]
    fn only_local_files_resolve() {
        for uri in [
            "https://example.com/schema.json",
            "http://json-schema.org/x",
            "file://other-host/a.json",
            "urn:example:thing",
        ] {
            assert!(path_of(uri).is_err(), "{uri} resolved");
        }
    }
}
