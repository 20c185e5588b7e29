use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::{Plain, PlainMessage};

fn msg(subject: &str) -> Arc<PlainMessage> {
    Arc::new(PlainMessage::new(subject, "e", Bytes::new()))
}

fn unknown() -> WireError {
    WireError::unknown("gone")
}

/// The serde-free reading of the common PubAck says what serde_json says, and leaves every
/// other shape to it.
#[test]
fn plain_pub_acks_read_as_serde_reads_them() {
    let stored = |seq, duplicate| Some(Stored { seq, duplicate });
    for (payload, want) in [
        (&br#"{"stream":"T", "seq":1}"#[..], stored(1, false)),
        (
            br#"{"stream":"OUTBOX","seq":18446744073709551615}"#,
            stored(u64::MAX, false),
        ),
        (
            br#"{"stream":"T", "seq":12,"duplicate": true}"#,
            stored(12, true),
        ),
        (
            br#"{"stream":"T", "domain":"hub", "seq":3}"#,
            stored(3, false),
        ),
        (br#" {"stream":"T", "seq":3} "#, None),
        (
            br#"{ "stream" : "T" , "seq" : 3 , "duplicate" : true }"#,
            stored(3, true),
        ),
        (br#"{"stream":"T", "seq":3,"duplicate": false}"#, None),
        (br#"{"stream":"T", "seq":18446744073709551616}"#, None),
        (br#"{"stream":"T", "seq":03}"#, None),
        (br#"{"stream":"T", "seq":-3}"#, None),
        (br#"{"stream":"T", "seq":3.5}"#, None),
        (br#"{"stream":"T\"x", "seq":3}"#, None),
        (br#"{"stream":"T", "seq":3, "batch":"b"}"#, None),
        (br#"{"stream":"T", "seq":3}x"#, None),
        (br#"{"stream":"T", "seq":}"#, None),
        (br#"{"stream":"T"}"#, None),
        (br#"{"seq":3, "stream":"T"}"#, None),
        (
            br#"{"error":{"code":503,"err_code":10077,"description":"x"}}"#,
            None,
        ),
        (b"", None),
    ] {
        let text = String::from_utf8_lossy(payload);
        let fast = plain_pub_ack(payload).map(|(stored, _, _)| stored);
        assert_eq!(fast, want, "{text}");
        if let Some(fast) = fast {
            let by_serde: PubAck = serde_json::from_slice(payload).expect("valid JSON");
            assert_eq!(
                (by_serde.stream.is_some(), by_serde.seq, by_serde.duplicate),
                (true, Some(fast.seq), fast.duplicate),
                "{text}"
            );
        }
        // Whatever the fast path leaves, the whole parser still answers as before.
        if let (None, Ok(by_serde)) = (fast, serde_json::from_slice::<PubAck>(payload))
            && let (Some(_), Some(seq), None) = (by_serde.stream, by_serde.seq, by_serde.error)
        {
            assert_eq!(
                parse_pub_ack(payload).expect("a PubAck"),
                Stored {
                    seq,
                    duplicate: by_serde.duplicate
                },
                "{text}"
            );
        }
    }
}

/// Minimal cases the property tests (parser_props.rs) found: each was taken for a stored
/// message, though none is JSON.
#[test]
fn what_is_not_json_is_never_stored() {
    for bad in [
        // Invalid UTF-8 in the stream name, or in a field serde skips unchecked.
        &b"{\"batch\":\"b\",\"stream\":\"\xff\",\"seq\":1}"[..],
        b"{\"domain\":\"\xff\",\"stream\":\"T\",\"seq\":1}",
        b"{\"stream\":\"\xff\",\"seq\":1}",
        // A control character inside a string, a form feed as whitespace.
        b"{\"stream\":\"T\x01\",\"seq\":1}",
        b"{\"stream\":\"T\",\x0c\"seq\":1}",
        // A stream that is not a string.
        br#"{"stream":1,"seq":1}"#,
    ] {
        assert_eq!(
            parse_pub_ack(bad).unwrap_err().kind,
            WireErrorKind::Unknown,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn pub_acks_parse_into_outcomes() {
    assert_eq!(
        parse_pub_ack(br#"{"stream":"OUTBOX","seq":7}"#).unwrap(),
        Stored {
            seq: 7,
            duplicate: false
        }
    );
    assert_eq!(
        parse_pub_ack(br#"{"stream":"OUTBOX","seq":7,"duplicate":true,"domain":"x"}"#).unwrap(),
        Stored {
            seq: 7,
            duplicate: true
        }
    );
    let refused = parse_pub_ack(
        br#"{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}"#,
    )
    .unwrap_err();
    assert_eq!(refused.kind, WireErrorKind::Refused { err_code: 10060 });
    assert!(
        refused
            .to_string()
            .contains("expected stream does not match")
    );
    let store = parse_pub_ack(
        br#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#,
    )
    .unwrap_err();
    assert_eq!(store.kind, WireErrorKind::Refused { err_code: 10077 });
    assert_eq!(
        parse_pub_ack(b"not json").unwrap_err().kind,
        WireErrorKind::Unknown
    );
    for not_an_ack in [&br#"{}"#[..], br#"{"stream":"OUTBOX"}"#, br#"{"seq":7}"#] {
        assert_eq!(
            parse_pub_ack(not_an_ack).unwrap_err().kind,
            WireErrorKind::Unknown,
            "{}",
            String::from_utf8_lossy(not_an_ack)
        );
    }
}

/// With `[nats] domain`, only a PubAck naming that domain is a stored message, on the fast
/// path and on serde_json's alike; a refusal names the stream and both domains.
#[test]
fn pub_acks_from_another_domain_are_refused() {
    let hub = Some("hub");
    for from_hub in [
        &br#"{"stream":"OUTBOX", "domain":"hub", "seq":3}"#[..],
        br#"{"stream":"OUTBOX", "domain":"hub", "seq":3, "extra":1}"#,
    ] {
        assert_eq!(parse_pub_ack_in(from_hub, hub).unwrap().seq, 3);
    }
    for (other, received) in [
        (
            &br#"{"stream":"OUTBOX", "domain":"leaf", "seq":3}"#[..],
            Some("leaf"),
        ),
        (
            br#"{"stream":"OUTBOX", "domain":"hubx", "seq":3}"#,
            Some("hubx"),
        ),
        (br#"{"stream":"OUTBOX", "seq":3}"#, None),
        (br#"{"stream":"OUTBOX", "domain":"", "seq":3}"#, None),
        (
            br#"{"stream":"OUTBOX","seq":3,"duplicate":true,"domain":"leaf"}"#,
            Some("leaf"),
        ),
    ] {
        let refused = parse_pub_ack_in(other, hub).unwrap_err();
        assert_eq!(
            refused.kind,
            WireErrorKind::OtherDomain {
                stream: "OUTBOX".into(),
                expected: "hub".into(),
                received: received.map(str::to_owned)
            },
            "{}",
            String::from_utf8_lossy(other)
        );
        // Without a configured domain, any domain is stored.
        assert_eq!(parse_pub_ack_in(other, None).unwrap().seq, 3);
    }
}

#[tokio::test]
async fn outcomes_reach_their_publish_in_any_order() {
    let mut pending = Pending::<Plain>::default();
    let now = Instant::now();
    let mut acks: Vec<_> = (10..15)
        .map(|n| pending.push(n, msg("outbox.a"), now))
        .collect();
    let stored = |seq: u64| Bytes::from(format!(r#"{{"stream":"S", "seq":{seq}}}"#));
    pending.resolve(12, None, &stored(3));
    pending.resolve(10, None, &stored(1));
    pending.resolve(10, None, &stored(99)); // a second answer is ignored
    pending.resolve(99, None, &stored(99)); // and one for no publish
    assert_eq!(pending.len(), 3);
    assert_eq!(acks.remove(0).await.unwrap().unwrap().seq, 1);
    assert_eq!(acks.remove(1).await.unwrap().unwrap().seq, 3);
    pending.drain(unknown);
    for ack in acks {
        assert_eq!(ack.await.unwrap().unwrap_err().kind, WireErrorKind::Unknown);
    }
    assert_eq!(pending.len(), 0);
    // After a drain, numbering goes on from anywhere.
    let ack = pending.push(100, msg("outbox.a"), now);
    pending.resolve(100, None, &stored(5));
    assert_eq!(ack.await.unwrap().unwrap().seq, 5);
}

/// A raw publish gets its answer as it came, a 503 as no responders, and a failure like
/// any other publish.
#[tokio::test]
async fn raw_publishes_get_the_answer_as_it_came() {
    let mut pending = Pending::<Plain>::default();
    let now = Instant::now();
    let commit = pending.push_raw(1, msg("outbox.a"), now);
    let plain = pending.push(2, msg("outbox.a"), now);
    let refused = pending.push_raw(3, msg("outbox.b"), now);
    let lost = pending.push_raw(4, msg("outbox.a"), now);
    let answer = Bytes::from_static(br#"{"stream":"S","seq":9,"batch":"b1","count":3}"#);
    pending.resolve(1, None, &answer);
    pending.resolve(2, Some(503), &Bytes::new());
    pending.resolve(3, Some(503), &Bytes::new());
    assert_eq!(commit.await.unwrap().unwrap(), answer);
    assert_eq!(
        plain.await.unwrap().unwrap_err().kind,
        WireErrorKind::NoResponders
    );
    let refused = refused.await.unwrap().unwrap_err();
    assert_eq!(refused.kind, WireErrorKind::NoResponders);
    assert!(refused.detail.contains("outbox.b"), "{refused:?}");
    pending.drain(unknown);
    assert_eq!(
        lost.await.unwrap().unwrap_err().kind,
        WireErrorKind::Unknown
    );
}

#[tokio::test]
async fn the_sweep_expires_only_what_is_due_and_subjects_resolve_together() {
    let mut pending = Pending::<Plain>::default();
    let start = Instant::now();
    let early = pending.push(0, msg("outbox.a"), start);
    let denied = pending.push(1, msg("outbox.denied"), start + Duration::from_secs(5));
    let late = pending.push(2, msg("outbox.a"), start + Duration::from_secs(10));
    pending.expire(start + Duration::from_secs(1), unknown);
    assert!(early.await.unwrap().is_err());
    pending.resolve_subject("outbox.denied", || {
        WireError::new(WireErrorKind::Denied, "denied")
    });
    assert_eq!(
        denied.await.unwrap().unwrap_err().kind,
        WireErrorKind::Denied
    );
    assert_eq!(pending.len(), 1);
    pending.expire(start + Duration::from_secs(9), unknown);
    assert_eq!(pending.len(), 1, "not due yet");
    pending.resolve(2, None, &Bytes::from_static(br#"{"stream":"S", "seq":1}"#));
    assert!(late.await.unwrap().is_ok());
}

#[test]
fn a_pub_ack_naming_another_stream_is_not_the_streams() {
    let ack = br#"{"stream":"FORGED", "seq":7}"#;
    let Err(error) = parse_pub_ack_from(ack, Some("OUTBOX"), None) else {
        panic!("accepted an ack of another stream");
    };
    assert_eq!(
        error.kind,
        WireErrorKind::OtherStream {
            expected: "OUTBOX".into(),
            received: "FORGED".into()
        }
    );
    // The slow path (fields in another order) too.
    let ack = br#"{"seq":7,"stream":"FORGED"}"#;
    assert!(parse_pub_ack_from(ack, Some("OUTBOX"), None).is_err());
    let ack = br#"{"stream":"OUTBOX", "seq":7}"#;
    assert_eq!(
        parse_pub_ack_from(ack, Some("OUTBOX"), None).map(|s| s.seq),
        Ok(7)
    );
    assert!(parse_pub_ack_from(br#"{"stream":"ANY", "seq":7}"#, None, None).is_ok());
}
