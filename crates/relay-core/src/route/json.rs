//! JSON inside a column value: a member found by a JSON Pointer and sliced from the producer's
//! text (`payload_pointer`, `headers_json_pointer`), and a JSON object expanded into NATS
//! headers (`headers_json`, and the `headers` of a `[[messages]]` envelope: one rule for both).
//!
//! Nothing is re-serialised: serde_json's `RawValue` borrows each member's text from the input,
//! so a member is the very bytes the producer (or PostgreSQL, for `jsonb`) wrote. Keys are
//! compared and values classified without building a `serde_json::Value`; the only per-row
//! allocations are the header names and values themselves.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::config::{ConfigError, OutboxTableConfig, PAYLOAD_WHOLE_ROW};

mod header_object;

pub use header_object::HeaderObjectError;
pub(super) use header_object::expand_headers;

impl OutboxTableConfig {
    /// `payload_pointer` and `headers_json_pointer`, parsed; refuses the combinations that
    /// cannot work.
    pub(super) fn pointers(
        &self,
    ) -> Result<(Option<JsonPointer>, Option<JsonPointer>), ConfigError> {
        let refuse = |reason: String| ConfigError::Json {
            table: self.table.clone(),
            reason,
        };
        if self.headers_json.as_deref().is_some_and(str::is_empty) {
            return Err(refuse("`headers_json` must name a column".into()));
        }
        if self.headers_json_pointer.is_some() && self.headers_json.is_none() {
            return Err(refuse(
                "`headers_json_pointer` needs `headers_json`, the column it points into".into(),
            ));
        }
        if self.payload_pointer.is_some() && self.payload == PAYLOAD_WHOLE_ROW {
            return Err(refuse(
                "`payload_pointer` needs a payload column, not `payload = \"*\"`".into(),
            ));
        }
        let parse = |key: &str, pointer: Option<&String>| {
            pointer
                .map(|p| JsonPointer::parse(p).map_err(|e| refuse(format!("`{key}`: {e}"))))
                .transpose()
        };
        Ok((
            parse("payload_pointer", self.payload_pointer.as_ref())?,
            parse("headers_json_pointer", self.headers_json_pointer.as_ref())?,
        ))
    }
}

/// A JSON Pointer (RFC 6901) to a member of nested objects, e.g. `/Value` or `/Headers`:
/// each `/`-separated token names an object member, `~1` stands for `/` and `~0` for `~`.
/// Arrays are not indexed (a token is always a member name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPointer {
    source: String,
    tokens: Vec<String>,
}

impl JsonPointer {
    /// Parses `pointer`; the error says what is wrong and what works.
    pub fn parse(pointer: &str) -> Result<Self, String> {
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(format!(
                "`{}` is not a JSON Pointer: it starts with `/` and names members, e.g. `/Value` or `/Content/Headers`",
                pointer.escape_debug()
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    token.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => token.push('~'),
                    Some('1') => token.push('/'),
                    _ => {
                        return Err(format!(
                            "JSON Pointer `{}`: inside a member name `~` is written `~0` and `/` is written `~1`",
                            pointer.escape_debug()
                        ));
                    }
                }
            }
            tokens.push(token);
        }
        Ok(Self {
            source: pointer.to_owned(),
            tokens,
        })
    }

    /// The member's JSON text inside `document`, a sub-slice of it (byte-exact).
    pub(super) fn resolve<'a>(&self, document: &'a str) -> Result<&'a str, MemberError> {
        self.resolve_from(0, document)
    }

    /// The members of `self` and `other` inside `document`, each as [`resolve`](Self::resolve)
    /// gives it (value or error), with one scan of each object the two pass through: CAP's
    /// `/Value` and `/Headers` of one `Content` cost one pass over it, not two.
    pub(super) fn resolve_pair<'a>(
        &self,
        other: &Self,
        document: &'a str,
    ) -> (Result<&'a str, MemberError>, Result<&'a str, MemberError>) {
        let mut current = document;
        let mut depth = 0;
        loop {
            match (self.tokens.get(depth), other.tokens.get(depth)) {
                (None, _) => return (Ok(current), other.resolve_from(depth, current)),
                (_, None) => return (self.resolve_from(depth, current), Ok(current)),
                // A shared step: its member is where both go on.
                (Some(mine), Some(theirs)) if mine == theirs => {
                    match members(current, [mine.as_str()]).and_then(|[found]| found.value()) {
                        Ok(next) => {
                            current = next;
                            depth += 1;
                        }
                        Err(failure) => {
                            return (
                                Err(self.failure(depth, &failure)),
                                Err(other.failure(depth, &failure)),
                            );
                        }
                    }
                }
                // The pointers part here: one scan of this object finds both members.
                (Some(mine), Some(theirs)) => {
                    return match members(current, [mine.as_str(), theirs.as_str()]) {
                        Ok([found_mine, found_theirs]) => (
                            self.go_on(depth, found_mine),
                            other.go_on(depth, found_theirs),
                        ),
                        Err(failure) => (
                            Err(self.failure(depth, &failure)),
                            Err(other.failure(depth, &failure)),
                        ),
                    };
                }
            }
        }
    }

    /// The member at token `depth` found (or not) by `found`, then the rest of the pointer.
    fn go_on<'a>(&self, depth: usize, found: Lookup<'a>) -> Result<&'a str, MemberError> {
        let member = found.value().map_err(|f| self.failure(depth, &f))?;
        self.resolve_from(depth + 1, member)
    }

    /// The pointer's tokens from `depth` on, inside `current` (the member its first `depth`
    /// tokens lead to).
    fn resolve_from<'a>(&self, depth: usize, current: &'a str) -> Result<&'a str, MemberError> {
        let mut current = current;
        for (depth, token) in self.tokens.iter().enumerate().skip(depth) {
            current = members(current, [token.as_str()])
                .and_then(|[found]| found.value())
                .map_err(|f| self.failure(depth, &f))?;
        }
        Ok(current)
    }

    /// `failure` of the lookup of token `depth`, named by this pointer.
    fn failure(&self, depth: usize, failure: &StepFailure) -> MemberError {
        match failure {
            StepFailure::Missing => MemberError::Missing {
                member: self.prefix(depth + 1),
            },
            StepFailure::Twice => MemberError::Twice {
                member: self.prefix(depth + 1),
            },
            StepFailure::Parse(e) if depth == 0 && !e.is_data() => {
                MemberError::NotJson(e.to_string())
            }
            StepFailure::Parse(e) => MemberError::NotObject {
                at: self.prefix(depth),
                found: e.to_string(),
            },
        }
    }

    /// The pointer's first `depth` tokens, as written (for errors).
    fn prefix(&self, depth: usize) -> String {
        self.source
            .split('/')
            .take(depth + 1)
            .collect::<Vec<_>>()
            .join("/")
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Why a JSON Pointer finds no member in a column value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    /// The column is NULL.
    #[error("the column is NULL")]
    Null,
    /// The value is not UTF-8 text.
    #[error("the value is not UTF-8 text")]
    NotUtf8,
    /// The value is not JSON.
    #[error("the value is not JSON: {0}")]
    NotJson(String),
    /// The value on the way is not an object.
    #[error("{} is not a JSON object: {found}", describe(.at))]
    NotObject {
        /// The pointer to it (empty: the whole value).
        at: String,
        /// The parser's description.
        found: String,
    },
    /// The member is not there.
    #[error("member `{member}` is missing")]
    Missing {
        /// The pointer to it.
        member: String,
    },
    /// The member appears twice (which one counts would depend on the parser).
    #[error("member `{member}` appears twice")]
    Twice {
        /// The pointer to it.
        member: String,
    },
}

fn describe(at: &str) -> String {
    if at.is_empty() {
        "the value".to_owned()
    } else {
        format!("member `{at}`")
    }
}

/// One member looked up in an object.
enum Lookup<'a> {
    Found(&'a RawValue),
    Missing,
    Twice,
}

impl<'a> Lookup<'a> {
    fn value(self) -> Result<&'a str, StepFailure> {
        match self {
            Self::Found(raw) => Ok(raw.get()),
            Self::Missing => Err(StepFailure::Missing),
            Self::Twice => Err(StepFailure::Twice),
        }
    }
}

/// Why one token of a pointer found no member, before the pointer names it.
enum StepFailure {
    Missing,
    Twice,
    /// The object is not JSON, or not an object.
    Parse(serde_json::Error),
}

/// The members `keys` of the JSON object `object`, in one scan of it to its end (so a syntax
/// error anywhere in it is found, whichever members are asked for).
fn members<'a, const N: usize>(
    object: &'a str,
    keys: [&str; N],
) -> Result<[Lookup<'a>; N], StepFailure> {
    let mut de = serde_json::Deserializer::from_str(object);
    let found = (&mut de)
        .deserialize_map(MembersVisitor(keys))
        .and_then(|found| de.end().map(|()| found))
        .map_err(StepFailure::Parse)?;
    Ok(found)
}

/// A map key compared with each of `N` names, without allocating: which ones it is.
struct KeyAmong<'k, const N: usize>(&'k [&'k str; N]);

impl<'de, const N: usize> DeserializeSeed<'de> for KeyAmong<'_, N> {
    type Value = [bool; N];
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<[bool; N], D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<const N: usize> Visitor<'_> for KeyAmong<'_, N> {
    type Value = [bool; N];
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<[bool; N], E> {
        Ok(self.0.map(|key| v == key))
    }
}

struct MembersVisitor<'k, const N: usize>([&'k str; N]);

impl<'de, const N: usize> Visitor<'de> for MembersVisitor<'_, N> {
    type Value = [Lookup<'de>; N];
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: [Option<&'de RawValue>; N] = [None; N];
        let mut twice = [false; N];
        while let Some(hits) = map.next_key_seed(KeyAmong(&self.0))? {
            if hits.contains(&true) {
                let value: &'de RawValue = map.next_value()?;
                for (i, _) in hits.iter().enumerate().filter(|(_, hit)| **hit) {
                    twice[i] |= found[i].replace(value).is_some();
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(std::array::from_fn(|i| match (found[i], twice[i]) {
            (_, true) => Lookup::Twice,
            (Some(value), false) => Lookup::Found(value),
            (None, false) => Lookup::Missing,
        }))
    }
}

/// Names of an object's members seen so far: a scan while there are few (most objects), a set
/// past that, so an object of 100,000 members costs 100,000 look-ups, not 5 billion comparisons.
pub(super) struct DistinctNames<T> {
    few: Vec<T>,
    many: std::collections::HashSet<T>,
}

impl<T> Default for DistinctNames<T> {
    fn default() -> Self {
        Self {
            few: Vec::new(),
            many: std::collections::HashSet::new(),
        }
    }
}

impl<T: std::hash::Hash + Eq + Clone> DistinctNames<T> {
    /// Members compared one by one up to this many.
    const SCAN: usize = 16;

    /// Adds `name`; false when it was there already.
    pub(super) fn insert(&mut self, name: &T) -> bool {
        if self.few.len() < Self::SCAN {
            if self.few.contains(name) {
                return false;
            }
            self.few.push(name.clone());
            return true;
        }
        if self.many.is_empty() {
            self.many.extend(self.few.iter().cloned());
        }
        self.many.insert(name.clone())
    }
}

#[cfg(test)]
mod tests;
