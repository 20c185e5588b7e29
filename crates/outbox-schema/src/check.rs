//! Checking one payload against a contract, within bounds on its size and nesting.

use serde_json::Value;

use crate::Contract;

/// Bounds a payload is checked within: a larger or deeper one is a violation that names the
/// bound, found before anything is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload checked, in bytes.
    pub max_bytes: usize,
    /// Deepest nesting of arrays and objects.
    pub max_depth: usize,
}

impl Limits {
    /// The deepest nesting a limit may allow: the JSON parser's own recursion limit.
    pub const DEPTH_CEILING: usize = 128;
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 1024 * 1024,
            max_depth: 64,
        }
    }
}

/// Longest text of one part of a violation (pointer, expected, found) in a reason.
const PART_CHARS: usize = 120;

/// Why a payload breaks its contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Larger than [`Limits::max_bytes`].
    TooLarge {
        /// The payload's size.
        bytes: usize,
        /// The bound.
        limit: usize,
    },
    /// Nested deeper than [`Limits::max_depth`].
    TooDeep {
        /// The bound.
        limit: usize,
    },
    /// Not UTF-8 JSON.
    NotJson {
        /// The parser's reason.
        reason: String,
    },
    /// A keyword refused a value.
    Keyword {
        /// JSON Pointer to the value in the payload (`""` is the whole payload).
        pointer: String,
        /// The keyword (`type`, `required`, …).
        keyword: String,
        /// The keyword's value in the schema, as JSON (cut).
        expected: String,
        /// The value found, as JSON (cut).
        found: String,
        /// The validator's sentence (cut).
        message: String,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge { bytes, limit } => write!(
                f,
                "payload of {bytes} bytes is larger than the contract limit of {limit} bytes (contracts max_bytes)"
            ),
            Self::TooDeep { limit } => write!(
                f,
                "payload nests arrays and objects deeper than the contract limit of {limit} (contracts max_depth)"
            ),
            Self::NotJson { reason } => write!(f, "payload is not JSON: {reason}"),
            Self::Keyword {
                pointer,
                keyword,
                expected,
                found,
                message,
            } => {
                let at = if pointer.is_empty() {
                    "(root)"
                } else {
                    pointer
                };
                write!(
                    f,
                    "at {at}: keyword `{keyword}` expected {expected}, found {found} ({message})"
                )
            }
        }
    }
}

impl Contract {
    /// Checks `payload` (the bytes as stored) against the contract; the payload itself is
    /// never changed.
    pub fn check(&self, payload: &[u8], limits: &Limits) -> Result<(), Violation> {
        if payload.len() > limits.max_bytes {
            return Err(Violation::TooLarge {
                bytes: payload.len(),
                limit: limits.max_bytes,
            });
        }
        if nesting_exceeds(payload, limits.max_depth.min(Limits::DEPTH_CEILING)) {
            return Err(Violation::TooDeep {
                limit: limits.max_depth,
            });
        }
        let value: Value = serde_json::from_slice(payload).map_err(|e| Violation::NotJson {
            reason: cut(&e.to_string(), PART_CHARS),
        })?;
        match self.validator.validate(&value) {
            Ok(()) => Ok(()),
            Err(error) => Err(self.violation(&error)),
        }
    }

    fn violation(&self, error: &jsonschema::ValidationError<'_>) -> Violation {
        let keyword = error.kind().keyword().to_owned();
        let expected = self
            .keyword_value(error)
            .map_or_else(|| "(see message)".to_owned(), json_text);
        Violation::Keyword {
            pointer: cut(error.instance_path().as_str(), PART_CHARS),
            keyword,
            expected,
            found: json_text(error.instance()),
            message: cut(&error.to_string(), PART_CHARS * 2),
        }
    }
}

impl Contract {
    /// The refusing keyword's value in the schema: found by its absolute location (the
    /// resource's `$id`, then a pointer) when it lies in a file a `$ref` reached.
    fn keyword_value(&self, error: &jsonschema::ValidationError<'_>) -> Option<&Value> {
        if let Some(location) = error.absolute_keyword_location()
            && let Some((resource, pointer)) = location.as_str().split_once('#')
        {
            let embedded = ["$defs", "definitions"]
                .iter()
                .filter_map(|key| self.bundled.get(key)?.as_object())
                .flat_map(|defs| defs.values());
            let found = std::iter::once(&self.bundled)
                .chain(embedded)
                .find(|r| r.get("$id").and_then(Value::as_str) == Some(resource));
            if let Some(value) = found.and_then(|r| r.pointer(pointer)) {
                return Some(value);
            }
        }
        self.bundled.pointer(error.schema_path().as_str())
    }
}

fn json_text(value: &Value) -> String {
    cut(&value.to_string(), PART_CHARS)
}

/// `text` cut to `max` characters, marked with `…` when cut.
pub(crate) fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

/// Whether arrays and objects nest deeper than `limit`, by one pass over the bytes (strings
/// skipped), before any parser recurses into them.
fn nesting_exceeds(bytes: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_counts_brackets_outside_strings() {
        assert!(!nesting_exceeds(br#"{"a":[1,{"b":2}]}"#, 3));
        assert!(nesting_exceeds(br#"{"a":[1,{"b":2}]}"#, 2));
        assert!(!nesting_exceeds(br#"{"a":"[[[[[[\"{{{{"}"#, 1));
        assert!(nesting_exceeds(&[b'['; 10_000], 64));
    }

    #[test]
    fn cut_marks_what_it_cut_on_char_boundaries() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcd", 3), "abc…");
        assert_eq!(cut("ééé", 2), "éé…");
    }
}
