//! Property tests of [`pending::parse_pub_ack`], the reader of every PubAck: against arbitrary
//! bytes and against valid PubAcks with a byte changed, dropped or added, cut, wrapped in junk or
//! answering an error, compared with what `serde_json::Value` makes of the same bytes. It must
//! never say "stored" where that reading does not, nor another sequence.

use proptest::prelude::*;

use crate::parser_props::config;
use crate::pending::{self, Stored};

/// What a PubAck means according to `serde_json::Value`: an object without an error, a string
/// `stream`, an unsigned `seq`, and `duplicate` absent or a bool.
fn reference_ack(payload: &[u8]) -> Option<Stored> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let object = value.as_object()?;
    if object.get("error").is_some_and(|e| !e.is_null()) {
        return None;
    }
    object.get("stream")?.as_str()?;
    let seq = object.get("seq")?.as_u64()?;
    let duplicate = match object.get("duplicate") {
        None => false,
        Some(d) => d.as_bool()?,
    };
    Some(Stored { seq, duplicate })
}

/// The reader says "stored" only where the reference does, and then the same sequence.
fn check_ack(payload: &[u8]) -> Result<(), TestCaseError> {
    let ours = pending::parse_pub_ack(payload).ok();
    if ours.is_some() {
        prop_assert_eq!(
            ours,
            reference_ack(payload),
            "{}",
            String::from_utf8_lossy(payload)
        );
    }
    Ok(())
}

/// JSON whitespace (never a form feed).
fn json_ws() -> impl Strategy<Value = String> {
    "[ \t\r\n]{0,2}"
}

/// A PubAck as a server could write it, and what it means.
fn valid_ack() -> impl Strategy<Value = (Vec<u8>, Stored)> {
    (
        prop_oneof![
            "[A-Za-z0-9_-]{1,16}",
            Just(r"OUT\u0042OX".to_owned()),
            Just("Ü".to_owned())
        ],
        any::<u64>(),
        proptest::option::of("[a-z]{1,8}"),
        prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(json_ws(), 12),
    )
        .prop_map(|(stream, seq, domain, duplicate, reorder, extra, ws)| {
            let mut entries = vec![
                format!(r#""stream"{}:{}"{stream}""#, ws[0], ws[1]),
                format!(r#""seq"{}:{}{seq}"#, ws[2], ws[3]),
            ];
            if let Some(domain) = domain {
                entries.insert(1, format!(r#""domain"{}:{}"{domain}""#, ws[4], ws[5]));
            }
            if let Some(duplicate) = duplicate {
                entries.push(format!(r#""duplicate"{}:{}{duplicate}"#, ws[6], ws[7]));
            }
            if extra {
                entries.push(r#""batch":"b-1","count":3"#.to_owned());
            }
            if reorder {
                entries.reverse();
            }
            let json = format!(
                "{{{}{}{}}}",
                ws[8],
                entries.join(&format!("{},{}", ws[9], ws[10])),
                ws[11]
            );
            (
                json.into_bytes(),
                Stored {
                    seq,
                    duplicate: duplicate == Some(true),
                },
            )
        })
}

proptest! {
    #![proptest_config(config(512))]

    /// Arbitrary bytes: no panic, and "stored" only where the reference says so.
    #[test]
    fn arbitrary_payloads_are_stored_only_when_the_reference_agrees(
        payload in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        check_ack(&payload)?;
    }

    /// Valid PubAcks read as what they say; every cut of one, every changed, dropped or
    /// added byte is stored only where the reference reads it so.
    #[test]
    fn pub_acks_and_their_mutations((payload, stored) in valid_ack(), at in any::<usize>(), byte in any::<u8>()) {
        prop_assert_eq!(pending::parse_pub_ack(&payload).ok(), Some(stored), "{}", String::from_utf8_lossy(&payload));
        prop_assert_eq!(reference_ack(&payload), Some(stored));
        for cut in 0..payload.len() {
            // A cut JSON object is never valid JSON.
            prop_assert!(pending::parse_pub_ack(&payload[..cut]).is_err(), "cut at {}", cut);
        }
        let at = at % payload.len();
        let mut changed = payload.clone();
        changed[at] = byte;
        check_ack(&changed)?;
        let mut dropped = payload.clone();
        dropped.remove(at);
        check_ack(&dropped)?;
        let mut added = payload.clone();
        added.insert(at, byte);
        check_ack(&added)?;
    }

    /// Broken JSON around a valid PubAck, and error answers, are never "stored".
    #[test]
    fn invalid_json_and_errors_are_never_stored(
        (payload, _) in valid_ack(),
        wrap in prop_oneof![
            Just(("", "x")),
            Just(("", ",")),
            Just(("", "}")),
            Just(("[", "]")),
            Just(("x", "")),
            Just(("\u{000c}", "")),
            Just(("", "/* */")),
        ],
        code in any::<u64>(),
        description in "[ -!#-\\[\\]-~]{0,30}",
    ) {
        let text = String::from_utf8(payload).expect("generated as text");
        let wrapped = format!("{}{text}{}", wrap.0, wrap.1);
        prop_assert!(pending::parse_pub_ack(wrapped.as_bytes()).is_err(), "{}", wrapped);
        let single_quotes = text.replace('"', "'");
        prop_assert!(pending::parse_pub_ack(single_quotes.as_bytes()).is_err(), "{}", single_quotes);
        let refused = format!(
            r#"{{"error":{{"code":400,"err_code":{code},"description":"{description}"}},{}"#,
            &text[1..]
        );
        let error = pending::parse_pub_ack(refused.as_bytes());
        prop_assert!(error.is_err(), "{}", refused);
    }
}
