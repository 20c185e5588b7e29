//! The `$ref`s of a schema and the base URI each resolves against (`$id`s followed as JSON
//! Schema follows them), for the two readers that need them outside the validator: the check
//! that every file a contract refers to lies in its directory ([`crate::files::confine`]), and
//! [`document_refs`], which rewrites a bundle's `$ref`s for documents that embed it.

use std::collections::HashMap;

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use serde_json::Value;

/// The base URI of a schema that has no `$id` of its own (as the validator's).
pub(crate) const DEFAULT_BASE: &str = "json-schema:///";

/// Characters escaped in a JSON Pointer written as a URI fragment: all but RFC 3986's
/// `unreserved`, `sub-delims`, `:`, `@`, `/` and `?`.
const FRAGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Keywords whose values are instances, not schemas: a `$ref` or `$id` inside one is data.
const INSTANCE_KEYWORDS: [&str; 4] = ["const", "default", "enum", "examples"];

/// What [`walk`] finds at a location of a schema.
#[derive(Debug)]
pub(crate) enum Mark<'a> {
    /// A schema resource: the absolute URI (without fragment) its `$id` gives it.
    Resource(String),
    /// A plain-name fragment (`$anchor`, `$dynamicAnchor`, a draft 7 `$id` of `#name`): the
    /// absolute URI with that fragment.
    Anchor(String),
    /// A `$ref` as written and the absolute URI it resolves to (`None` when it is no URI
    /// reference).
    Ref {
        /// The `$ref` value.
        written: &'a str,
        /// What it names.
        target: Option<String>,
    },
}

/// `reference` resolved against the absolute URI `base`.
pub(crate) fn resolve(base: &str, reference: &str) -> Option<String> {
    let base = jsonschema::uri::from_str(base).ok()?;
    let target = jsonschema::uri::resolve_against(&base.borrow(), reference).ok()?;
    Some(target.as_str().to_owned())
}

/// `uri` without its fragment, and the fragment (empty when it has none).
pub(crate) fn split_fragment(uri: &str) -> (&str, &str) {
    uri.split_once('#').unwrap_or((uri, ""))
}

/// Calls `visit` with the JSON Pointer tokens of each location of `schema` that has a `$id`,
/// an anchor or a `$ref`, `base` being the URI the schema was read from.
pub(crate) fn walk<'a>(schema: &'a Value, base: &str, visit: &mut impl FnMut(&[String], Mark<'a>)) {
    walk_at(schema, base, &mut Vec::new(), visit);
}

fn walk_at<'a>(
    value: &'a Value,
    base: &str,
    at: &mut Vec<String>,
    visit: &mut impl FnMut(&[String], Mark<'a>),
) {
    match value {
        Value::Object(map) => {
            let mut base = base.to_owned();
            if let Some(Value::String(id)) = map.get("$id") {
                if let Some(name) = id.strip_prefix('#') {
                    visit(
                        at,
                        Mark::Anchor(format!("{}#{name}", split_fragment(&base).0)),
                    );
                } else if let Some(uri) = resolve(&base, id) {
                    base = split_fragment(&uri).0.to_owned();
                    visit(at, Mark::Resource(base.clone()));
                }
            }
            for keyword in ["$anchor", "$dynamicAnchor"] {
                if let Some(Value::String(name)) = map.get(keyword) {
                    visit(at, Mark::Anchor(format!("{base}#{name}")));
                }
            }
            if let Some(Value::String(written)) = map.get("$ref") {
                let target = resolve(&base, written);
                visit(at, Mark::Ref { written, target });
            }
            for (key, member) in map {
                if member.is_object() || member.is_array() {
                    if INSTANCE_KEYWORDS.contains(&key.as_str()) {
                        continue;
                    }
                    at.push(key.clone());
                    walk_at(member, &base, at, visit);
                    at.pop();
                }
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                at.push(index.to_string());
                walk_at(item, base, at, visit);
                at.pop();
            }
        }
        _ => {}
    }
}

/// The tokens of a JSON Pointer written as a URI fragment (`/a~1b/c%20d`), or `None` when it
/// is not one.
fn fragment_tokens(fragment: &str) -> Option<Vec<String>> {
    pointer_tokens(&percent_decode_str(fragment).decode_utf8().ok()?)
}

/// The tokens of a JSON Pointer (`/a~1b/c`), or `None` when it is not one.
fn pointer_tokens(pointer: &str) -> Option<Vec<String>> {
    if pointer.is_empty() {
        return Some(Vec::new());
    }
    let rest = pointer.strip_prefix('/')?;
    Some(
        rest.split('/')
            .map(|token| token.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

/// `tokens` as a URI fragment: `#/a~1b/c%20d`.
fn fragment_of(tokens: &[String]) -> String {
    let mut fragment = String::from("#");
    for token in tokens {
        fragment.push('/');
        let escaped = token.replace('~', "~0").replace('/', "~1");
        fragment.extend(utf8_percent_encode(&escaped, FRAGMENT));
    }
    fragment
}

/// `schema` (a bundled contract) with each `$ref` it resolves within itself rewritten as a
/// JSON Pointer from the root of a document that holds it at JSON Pointer `at`.
///
/// A bundle resolves its `$ref`s through the `$id`s of the files embedded in it, as JSON Schema
/// does; an AsyncAPI document's tools resolve a `$ref` as a JSON Reference to the document or
/// to a file, and would look for `shared/money.json` on disk. After this they find it where
/// the bundle embeds it: `#<at>/$defs/file:~1~1~1shared~1money.json`. A `$ref` whose target
/// the schema does not hold is left as it is.
pub fn document_refs(schema: &Value, at: &str) -> Value {
    let prefix: Vec<String> = pointer_tokens(at).unwrap_or_default();
    let mut resources: HashMap<String, Vec<String>> = HashMap::new();
    let mut anchors: HashMap<String, Vec<String>> = HashMap::new();
    let mut refs: Vec<(Vec<String>, String)> = Vec::new();
    walk(schema, DEFAULT_BASE, &mut |location, mark| match mark {
        Mark::Resource(uri) => {
            resources.entry(uri).or_insert_with(|| location.to_vec());
        }
        Mark::Anchor(uri) => {
            anchors.entry(uri).or_insert_with(|| location.to_vec());
        }
        Mark::Ref {
            target: Some(target),
            ..
        } => refs.push((location.to_vec(), target)),
        Mark::Ref { target: None, .. } => {}
    });
    let mut rewritten = schema.clone();
    for (location, target) in refs {
        let (resource, fragment) = split_fragment(&target);
        let found = match fragment_tokens(fragment) {
            Some(tokens) => resources
                .get(resource)
                .map(|r| [r.clone(), tokens].concat()),
            None => anchors.get(&target).cloned(),
        };
        let Some(tokens) = found.filter(|t| schema.pointer(&pointer_of(t)).is_some()) else {
            continue;
        };
        if let Some(Value::Object(map)) = rewritten.pointer_mut(&pointer_of(&location)) {
            let reference = fragment_of(&[prefix.as_slice(), &tokens].concat());
            map.insert("$ref".into(), Value::String(reference));
        }
    }
    rewritten
}

/// `tokens` as a JSON Pointer (not percent-encoded), for [`Value::pointer`].
fn pointer_of(tokens: &[String]) -> String {
    tokens
        .iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pointers_round_trip_through_fragments() {
        let tokens = vec!["$defs".to_owned(), "file:///a b/~x.json".to_owned()];
        let fragment = fragment_of(&tokens);
        assert_eq!(fragment, "#/$defs/file:~1~1~1a%20b~1~0x.json");
        assert_eq!(fragment_tokens(&fragment[1..]), Some(tokens));
        assert_eq!(fragment_tokens(""), Some(Vec::new()));
        assert_eq!(fragment_tokens("name"), None);
    }

    #[test]
    fn refs_to_embedded_files_pointers_and_anchors_become_document_pointers() {
        let bundle = json!({
            "$id": "file:///order.json",
            "$defs": {
                "file:///shared/money.json": {
                    "$id": "file:///shared/money.json",
                    "properties": {
                        "cents": {"$ref": "#/$defs/count"},
                        "rate": {"$ref": "../rate.json#/$defs/r"},
                    },
                    "$defs": {"count": {"type": "integer"}},
                },
                "file:///rate.json": {
                    "$id": "file:///rate.json",
                    "$defs": {"r": {"$anchor": "r", "type": "number"}},
                },
                "local": {"type": "string"},
            },
            "properties": {
                "total": {"$ref": "shared/money.json"},
                "name": {"$ref": "#/$defs/local"},
                "ratio": {"$ref": "rate.json#r"},
                "self": {"$ref": "#"},
                "remote": {"$ref": "https://example.com/x.json"},
                "gone": {"$ref": "#/$defs/missing"},
            },
            "const": {"$ref": "data"},
        });
        let at = "/components/messages/m/payload/schema";
        let out = document_refs(&bundle, at);
        let prefix = "#/components/messages/m/payload/schema";
        let money = format!("{prefix}/$defs/file:~1~1~1shared~1money.json");
        let rate = format!("{prefix}/$defs/file:~1~1~1rate.json");
        let props = &out["properties"];
        assert_eq!(props["total"]["$ref"], money.as_str());
        assert_eq!(props["name"]["$ref"], format!("{prefix}/$defs/local"));
        assert_eq!(props["ratio"]["$ref"], format!("{rate}/$defs/r"));
        assert_eq!(props["self"]["$ref"], prefix);
        assert_eq!(props["remote"]["$ref"], "https://example.com/x.json");
        assert_eq!(props["gone"]["$ref"], "#/$defs/missing");
        assert_eq!(out["const"]["$ref"], "data");
        let embedded = &out["$defs"]["file:///shared/money.json"]["properties"];
        assert_eq!(embedded["cents"]["$ref"], format!("{money}/$defs/count"));
        assert_eq!(embedded["rate"]["$ref"], format!("{rate}/$defs/r"));
        // Nothing but the `$ref`s changes.
        let mut back = out.clone();
        back["properties"] = bundle["properties"].clone();
        back["$defs"]["file:///shared/money.json"]["properties"] =
            bundle["$defs"]["file:///shared/money.json"]["properties"].clone();
        assert_eq!(back, bundle);
    }
}
