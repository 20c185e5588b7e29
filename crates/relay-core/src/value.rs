//! Text-format column values: PostgreSQL type OIDs, `bytea` hex decoding, and the JSON form of
//! a whole row (used when a mapping has no payload column).
//!
//! The replication session asks for `bytea_output = hex`, so a `bytea` arrives as `\x` followed
//! by hex digits. Numbers that JSON can hold exactly (integers, floats) become JSON numbers;
//! `numeric` stays a string because JSON consumers parse numbers as doubles and would round it.

use bytes::Bytes;
use serde_json::{Map, Number, Value};

/// PostgreSQL type OIDs the relay treats specially (`pg_type.oid`, stable across versions).
pub mod oid {
    /// `bool`
    pub const BOOL: u32 = 16;
    /// `bytea`
    pub const BYTEA: u32 = 17;
    /// `int8`
    pub const INT8: u32 = 20;
    /// `int2`
    pub const INT2: u32 = 21;
    /// `int4`
    pub const INT4: u32 = 23;
    /// `oid`
    pub const OID: u32 = 26;
    /// `json`
    pub const JSON: u32 = 114;
    /// `float4`
    pub const FLOAT4: u32 = 700;
    /// `float8`
    pub const FLOAT8: u32 = 701;
    /// `jsonb`
    pub const JSONB: u32 = 3802;
    /// `timestamptz`
    pub const TIMESTAMPTZ: u32 = 1184;
    /// `interval`
    pub const INTERVAL: u32 = 1186;
}

/// A `bytea` text value that is not `\x` + hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bytea value is not in hex format (expected `\\x` followed by hex digits)")]
pub struct ByteaFormatError;

/// `text` as UTF-8, invalid sequences replaced (U+FFFD) as `String::from_utf8_lossy` does:
/// valid text (nearly always) is checked by `std::str::from_utf8`, whose ASCII fast path costs
/// a fraction of the lossy decoder's walk, on the path of every column the route reads.
pub fn text_lossy(text: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(text) {
        Ok(valid) => std::borrow::Cow::Borrowed(valid),
        Err(_) => String::from_utf8_lossy(text),
    }
}

/// Decodes PostgreSQL's hex `bytea` output (`\x0a1b`).
pub fn decode_bytea_hex(text: &[u8]) -> Result<Bytes, ByteaFormatError> {
    let hex = text.strip_prefix(b"\\x").ok_or(ByteaFormatError)?;
    if hex.len() % 2 != 0 {
        return Err(ByteaFormatError);
    }
    let nibble = |c: u8| -> Result<u8, ByteaFormatError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(ByteaFormatError),
        }
    };
    let mut out = Vec::with_capacity(hex.len() / 2);
    for pair in hex.chunks_exact(2) {
        if let [hi, lo] = pair {
            out.push(nibble(*hi)? << 4 | nibble(*lo)?);
        }
    }
    Ok(Bytes::from(out))
}

/// The JSON value of one text-format column value of type `type_oid` (`None` = SQL NULL).
pub fn column_to_json(type_oid: u32, text: Option<&[u8]>) -> Value {
    let Some(text) = text else {
        return Value::Null;
    };
    let s = text_lossy(text);
    match type_oid {
        oid::BOOL => Value::Bool(s == "t"),
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => s
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(s.into_owned())),
        oid::FLOAT4 | oid::FLOAT8 => s
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            // NaN and Infinity have no JSON number form.
            .unwrap_or_else(|| Value::String(s.into_owned())),
        oid::JSON | oid::JSONB => {
            serde_json::from_slice(text).unwrap_or_else(|_| Value::String(s.into_owned()))
        }
        _ => Value::String(s.into_owned()),
    }
}

/// Builds the JSON object of a row from `(name, type_oid, value)` triples.
pub fn row_to_json<'a>(columns: impl Iterator<Item = (&'a str, u32, Option<&'a [u8]>)>) -> Bytes {
    let mut map = Map::new();
    for (name, type_oid, text) in columns {
        map.insert(name.to_owned(), column_to_json(type_oid, text));
    }
    // Serializing a Value built from owned strings and numbers cannot fail.
    Bytes::from(serde_json::to_vec(&Value::Object(map)).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lossy_is_from_utf8_lossy() {
        for text in [
            &b""[..],
            b"plain ascii",
            "caf\u{e9} \u{1F600}".as_bytes(),
            b"bad \xff byte",
            b"cut \xe2\x82",
            b"\xc0\x80 overlong",
        ] {
            assert_eq!(text_lossy(text), String::from_utf8_lossy(text), "{text:?}");
        }
        assert!(matches!(
            text_lossy(b"ok"),
            std::borrow::Cow::Borrowed("ok")
        ));
    }

    #[test]
    fn bytea_hex_round_trip() {
        assert_eq!(decode_bytea_hex(b"\\x").unwrap(), Bytes::new());
        assert_eq!(
            decode_bytea_hex(b"\\x00ff10Ab").unwrap(),
            Bytes::from_static(&[0, 255, 16, 171])
        );
        assert_eq!(decode_bytea_hex(b"00ff"), Err(ByteaFormatError));
        assert_eq!(decode_bytea_hex(b"\\x0"), Err(ByteaFormatError));
        assert_eq!(decode_bytea_hex(b"\\xzz"), Err(ByteaFormatError));
    }

    #[test]
    fn row_json_keeps_types_where_json_can_hold_them() {
        let row = row_to_json(
            [
                ("id", oid::INT8, Some(&b"9007199254740993"[..])),
                ("ok", oid::BOOL, Some(&b"t"[..])),
                ("amount", 1700, Some(&b"12.3400"[..])),
                ("ratio", oid::FLOAT8, Some(&b"NaN"[..])),
                ("meta", oid::JSONB, Some(&br#"{"a": [1, 2]}"#[..])),
                ("note", 25, None),
            ]
            .into_iter(),
        );
        let v: Value = serde_json::from_slice(&row).unwrap();
        assert_eq!(v["id"], Value::from(9007199254740993_i64));
        assert_eq!(v["ok"], Value::Bool(true));
        assert_eq!(v["amount"], Value::from("12.3400"));
        assert_eq!(v["ratio"], Value::from("NaN"));
        assert_eq!(v["meta"]["a"][1], Value::from(2));
        assert_eq!(v["note"], Value::Null);
    }
}
