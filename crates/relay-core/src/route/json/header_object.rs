//! A JSON object expanded into NATS headers (`headers_json`, and the `headers` of a
//! `[[messages]]` envelope: one rule for both), without building a `serde_json::Value`.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::DistinctNames;
use crate::route::header_size;

/// Why a JSON object cannot become NATS headers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderObjectError {
    /// The value is not UTF-8 text.
    #[error("the value is not UTF-8 text; write a JSON object (or NULL for no headers)")]
    NotUtf8,
    /// The value is not JSON.
    #[error("the value is not JSON ({0}); write a JSON object (or NULL for no headers)")]
    NotJson(String),
    /// The value is JSON but not an object.
    #[error("the value is not a JSON object ({0}); headers come from an object's members")]
    NotObject(String),
    /// A member name NATS cannot carry as a header name.
    #[error(
        "member `{0}` is not a NATS header name (printable ASCII, no spaces, no `:`); rename it where it is written"
    )]
    Name(String),
    /// A member that would set a header the relay or NATS sets itself.
    #[error(
        "member `{0}` would set a header the relay or NATS sets itself (`Nats-*`, `Outbox-Commit-Lsn`, `Outbox-Table`, …); such members are refused, never copied: rename or remove it where it is written"
    )]
    Owned(String),
    /// A member that would set a header the mapping already sets.
    #[error(
        "member `{0}` would set a header the mapping already sets (from `headers` or `[outbox.cloudevents]`); remove one of the two"
    )]
    Mapped(String),
    /// A member given twice.
    #[error("member `{0}` appears twice")]
    Twice(String),
    /// More header text than JetStream stores in one message.
    #[error(
        "member `{0}` brings the header lines past {1} bytes, more than JetStream stores with one message; move the data into the payload"
    )]
    TooLarge(String, usize),
    /// A value NATS cannot carry in a header.
    #[error(
        "the value of member `{0}` holds a control character (CR, LF, tab, …), which a header cannot carry"
    )]
    ControlCharacter(String),
    /// A string value with an escape that is not a character (a lone surrogate).
    #[error("the value of member `{0}` is not a valid JSON string: {1}")]
    BadString(String, String),
}

/// Appends the members of the JSON object `object` to `out` as headers, in order: strings as
/// their text, numbers and booleans as their JSON text, nested objects and arrays as their JSON
/// text as written, `null` skipped. Names must be printable ASCII without `:`; names in the
/// `Nats-` namespace or set by the relay are refused, as are those `mapped` says the mapping
/// sets itself. On an error `out` may hold some of the members: discard it.
pub(in crate::route) fn expand_headers(
    object: &str,
    out: &mut Vec<(Arc<str>, Arc<str>)>,
    mapped: &dyn Fn(&str) -> bool,
) -> Result<(), HeaderObjectError> {
    let mut problem = None;
    let visitor = HeaderVisitor {
        out,
        mapped,
        problem: &mut problem,
    };
    let mut de = serde_json::Deserializer::from_str(object);
    let parsed = (&mut de).deserialize_map(visitor).and_then(|()| de.end());
    match (problem, parsed) {
        (Some(problem), _) => Err(problem),
        (None, Ok(())) => Ok(()),
        (None, Err(e)) if e.is_data() => Err(HeaderObjectError::NotObject(e.to_string())),
        (None, Err(e)) => Err(HeaderObjectError::NotJson(e.to_string())),
    }
}

struct HeaderVisitor<'o, 'f, 'p> {
    out: &'o mut Vec<(Arc<str>, Arc<str>)>,
    mapped: &'f dyn Fn(&str) -> bool,
    problem: &'p mut Option<HeaderObjectError>,
}

/// A map key as a header name, allocated once.
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Arc<str>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Arc<str>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Name {
    type Value = Arc<str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Arc<str>, E> {
        Ok(v.into())
    }
}

impl<'de> Visitor<'de> for HeaderVisitor<'_, '_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut names = DistinctNames::default();
        let mut block = 0usize;
        while let Some(name) = map.next_key_seed(Name)? {
            let raw: &'de RawValue = map.next_value()?;
            let checked = check_name(&name, self.mapped).and_then(|()| {
                if !names.insert(&name) {
                    return Err(HeaderObjectError::Twice(name.to_string()));
                }
                let value = header_value(&name, raw.get())?;
                // Stop at JetStream's header limit, not after the whole object: a row of
                // 100,000 members is refused after the first few thousand.
                block += value
                    .as_ref()
                    .map_or(0, |v| header_size::line_len(&name, v));
                if block > header_size::JETSTREAM_MAX_HEADER_BYTES {
                    return Err(HeaderObjectError::TooLarge(
                        name.to_string(),
                        header_size::JETSTREAM_MAX_HEADER_BYTES,
                    ));
                }
                Ok(value)
            });
            match checked {
                Ok(Some(value)) => self.out.push((name, value.as_ref().into())),
                Ok(None) => {}
                Err(problem) => {
                    *self.problem = Some(problem);
                    // Stops the parse; the problem above is what is reported.
                    return Err(A::Error::custom("refused member"));
                }
            }
        }
        Ok(())
    }
}

fn check_name(name: &str, mapped: &dyn Fn(&str) -> bool) -> Result<(), HeaderObjectError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(HeaderObjectError::Name(name.escape_debug().to_string()));
    }
    if outbox_contract::is_reserved(name) || outbox_contract::is_relay_owned(name) {
        return Err(HeaderObjectError::Owned(name.to_owned()));
    }
    if mapped(name) {
        return Err(HeaderObjectError::Mapped(name.to_owned()));
    }
    Ok(())
}

/// A member's header value: `None` for `null`.
fn header_value<'a>(name: &str, raw: &'a str) -> Result<Option<Cow<'a, str>>, HeaderObjectError> {
    let value = match raw.as_bytes().first() {
        Some(b'n') => return Ok(None),
        Some(b'"') => match raw.get(1..raw.len() - 1) {
            Some(inner) if !inner.contains('\\') => Cow::Borrowed(inner),
            _ => Cow::Owned(
                serde_json::from_str::<String>(raw)
                    .map_err(|e| HeaderObjectError::BadString(name.to_owned(), e.to_string()))?,
            ),
        },
        // Objects and arrays: their JSON text without the layout (a pretty-printed `json`
        // column holds line breaks, which a header cannot carry).
        Some(b'{' | b'[') => compact(raw),
        // Numbers and booleans: their JSON text as written.
        _ => Cow::Borrowed(raw),
    };
    if value.chars().any(char::is_control) {
        return Err(HeaderObjectError::ControlCharacter(name.to_owned()));
    }
    Ok(Some(value))
}

/// `json` (valid JSON text) without the whitespace between its tokens; members, numbers and
/// strings byte for byte as written. Borrowed when there is none to remove.
fn compact(json: &str) -> Cow<'_, str> {
    let layout = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    if !json.as_bytes().iter().any(layout) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            // JSON strings hold no raw whitespace but the space, which is kept.
            (in_string, escaped) = (escaped || c != '"', !escaped && c == '\\');
        } else if c == '"' {
            in_string = true;
        } else if c.is_ascii_whitespace() {
            continue;
        }
        out.push(c);
    }
    Cow::Owned(out)
}
