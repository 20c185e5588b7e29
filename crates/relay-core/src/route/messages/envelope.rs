//! The envelope of a `[[messages]]` logical message: its fields in order (a key given twice is
//! refused), its `id`, the subject its template makes, and the checks of literal subjects and
//! subject filters.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::subject::{Segment, SubjectTemplate, push_escaped_token, push_levels};

/// An event id for an error text: cut when long.
pub(super) fn short(id: &str) -> String {
    let id = id.escape_debug().to_string();
    match id.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &id[..cut]),
        None => id,
    }
}

/// The envelope's `id`: a non-empty string without control characters, or an integer.
pub(super) fn envelope_id(raw: &RawValue) -> Result<String, String> {
    match serde_json::from_str::<serde_json::Value>(raw.get()) {
        Ok(serde_json::Value::String(s)) if s.is_empty() => Err("`id` is empty".into()),
        Ok(serde_json::Value::String(s)) if s.chars().any(char::is_control) => {
            Err(format!("`id` {} holds a control character", short(&s)))
        }
        Ok(serde_json::Value::String(s)) => Ok(s),
        Ok(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        _ => Err(format!(
            "`id` must be a non-empty string or an integer, not {}",
            short(raw.get())
        )),
    }
}

/// The subject from the template, each placeholder filled from the envelope field of that
/// name under the token rule.
pub(super) fn fill_template(
    template: &SubjectTemplate,
    fields: &Fields<'_>,
) -> Result<String, String> {
    let mut subject = String::with_capacity(64);
    for segment in template.segments() {
        match segment {
            Segment::Literal(l) => subject.push_str(l),
            Segment::Column(name) | Segment::Levels(name) => {
                let raw = fields.get(name).ok_or_else(|| {
                    format!("the envelope has no field `{name}` for the subject template")
                })?;
                let value = match serde_json::from_str::<serde_json::Value>(raw.get()) {
                    Ok(serde_json::Value::String(s)) if !s.is_empty() => s,
                    Ok(serde_json::Value::Number(n)) => n.to_string(),
                    _ => {
                        return Err(format!(
                            "field `{name}` of the subject template is not a non-empty string or a number"
                        ));
                    }
                };
                if matches!(segment, Segment::Column(_)) {
                    push_escaped_token(&mut subject, &value);
                } else {
                    push_levels(&mut subject, &value).map_err(|e| {
                        format!("field `{name}` ({{levels:{name}}} in the subject template) cannot be subject levels: {e}")
                    })?;
                }
            }
        }
    }
    Ok(subject)
}

/// A literal subject: non-empty tokens of printable ASCII, no wildcards, no `$` prefix.
pub(super) fn check_subject(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("is empty");
    }
    if subject.starts_with('$') {
        return Err("starts with `$`, which NATS reserves for system subjects");
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err("has an empty token");
        }
        if token.contains(['*', '>']) {
            return Err("holds a wildcard (`*` or `>`)");
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("holds whitespace, a control character or non-ASCII text");
        }
    }
    Ok(())
}

/// A subject filter: as a subject, but `*` and a final `>` may be whole tokens.
pub(super) fn check_filter(filter: &str) -> Result<(), ()> {
    if filter.is_empty() || filter.starts_with('$') {
        return Err(());
    }
    let tokens: Vec<&str> = filter.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        match *token {
            "*" => {}
            ">" if i + 1 == tokens.len() => {}
            t if !t.is_empty()
                && !t.contains(['*', '>'])
                && t.bytes().all(|b| b.is_ascii_graphic()) => {}
            _ => return Err(()),
        }
    }
    Ok(())
}

/// The fields of a JSON object, values unparsed, in order; a key given twice is refused (which
/// of two `id`s counts would otherwise depend on the parser).
pub(super) struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'a> Fields<'a> {
    pub(super) fn parse(content: &'a [u8]) -> Result<Self, String> {
        serde_json::from_slice(content).map_err(|e| {
            if std::str::from_utf8(content).is_err() {
                "the content is not UTF-8 JSON".to_owned()
            } else {
                format!("the content is not a JSON object: {e}")
            }
        })
    }

    pub(super) fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ObjectVisitor<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields: Vec<(String, &'a RawValue)> = Vec::new();
                let mut names = crate::route::json::DistinctNames::default();
                while let Some(key) = map.next_key::<String>()? {
                    if !names.insert(&key) {
                        return Err(A::Error::custom(format!("key `{key}` appears twice")));
                    }
                    let value: &'a RawValue = map.next_value()?;
                    fields.push((key, value));
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(ObjectVisitor(PhantomData))
    }
}
