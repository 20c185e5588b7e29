//! Per-message decode tests from hand-assembled bytes, truncation and error cases.

mod common;

use bytes::Bytes;
use pgoutput::{
    Begin, Column, Commit, DecodeError, DecodeErrorKind, Delete, Insert, LogicalMessage, Lsn,
    Message, OldTuple, Origin, Relation, Truncate, TupleData, TupleValue, TypeInfo, Update, decode,
};

fn cat(parts: &[&[u8]]) -> Bytes {
    Bytes::from(parts.concat())
}

fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn err(parts: &[&[u8]]) -> DecodeError {
    match decode(&cat(parts)) {
        Ok(m) => panic!("expected error, got {m:?}"),
        Err(e) => e,
    }
}

const LSN: [u8; 8] = 0x0000_0001_0000_00ABu64.to_be_bytes();
const TS: [u8; 8] = 771_234_567_890_123i64.to_be_bytes();

/// Hand-assembled samples (tag by tag) with their expected decoding.
fn samples() -> Vec<(Bytes, LogicalMessage)> {
    vec![
        (
            cat(&[b"B", &LSN, &TS, &[0, 0, 2, 0xDA]]),
            LogicalMessage::Begin(Begin {
                final_lsn: Lsn(0x1_0000_00AB),
                commit_time: 771_234_567_890_123,
                xid: 730,
            }),
        ),
        (
            cat(&[b"C", &[0], &LSN, &0x1_0000_00D0u64.to_be_bytes(), &TS]),
            LogicalMessage::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn(0x1_0000_00AB),
                end_lsn: Lsn(0x1_0000_00D0),
                commit_time: 771_234_567_890_123,
            }),
        ),
        (
            cat(&[b"O", &LSN, b"upstream\0"]),
            LogicalMessage::Origin(Origin {
                commit_lsn: Lsn(0x1_0000_00AB),
                name: "upstream".into(),
            }),
        ),
        (
            cat(&[
                b"R",
                &[0, 0, 0x40, 5],
                b"public\0outbox\0d",
                &[0, 2],
                &[1],
                b"id\0",
                &[0, 0, 0, 20],
                &[0xFF; 4],
                &[0],
                b"payload\0",
                &[0, 0, 0, 25],
                &[0, 0, 0, 12],
            ]),
            LogicalMessage::Relation(Relation {
                id: 0x4005,
                namespace: "public".into(),
                name: "outbox".into(),
                replica_identity: b'd',
                columns: vec![
                    Column {
                        flags: 1,
                        name: "id".into(),
                        type_oid: 20,
                        type_modifier: -1,
                    },
                    Column {
                        flags: 0,
                        name: "payload".into(),
                        type_oid: 25,
                        type_modifier: 12,
                    },
                ],
            }),
        ),
        (
            cat(&[b"Y", &[0, 0, 0x40, 1], b"public\0state\0"]),
            LogicalMessage::Type(TypeInfo {
                id: 0x4001,
                namespace: "public".into(),
                name: "state".into(),
            }),
        ),
        (
            cat(&[
                b"I",
                &[0, 0, 0x40, 5],
                b"N",
                &[0, 5],
                b"t",
                &[0, 0, 0, 1],
                b"1",
                b"n",
                b"u",
                b"b",
                &[0, 0, 0, 2],
                &[0xDE, 0xAD],
                b"t",
                &[0, 0, 0, 0],
            ]),
            LogicalMessage::Insert(Insert {
                relation_id: 0x4005,
                new: TupleData {
                    values: vec![
                        text("1"),
                        TupleValue::Null,
                        TupleValue::UnchangedToast,
                        TupleValue::Binary(Bytes::from_static(&[0xDE, 0xAD])),
                        text(""),
                    ],
                },
            }),
        ),
        (
            cat(&[
                b"U",
                &[0, 0, 0x40, 5],
                b"N",
                &[0, 1],
                b"t",
                &[0, 0, 0, 1],
                b"2",
            ]),
            LogicalMessage::Update(Update {
                relation_id: 0x4005,
                old: None,
                new: TupleData {
                    values: vec![text("2")],
                },
            }),
        ),
        (
            cat(&[
                b"U",
                &[0, 0, 0x40, 5],
                b"K",
                &[0, 2],
                b"t",
                &[0, 0, 0, 1],
                b"1",
                b"n",
                b"N",
                &[0, 2],
                b"t",
                &[0, 0, 0, 2],
                b"10",
                b"u",
            ]),
            LogicalMessage::Update(Update {
                relation_id: 0x4005,
                old: Some(OldTuple::Key(TupleData {
                    values: vec![text("1"), TupleValue::Null],
                })),
                new: TupleData {
                    values: vec![text("10"), TupleValue::UnchangedToast],
                },
            }),
        ),
        (
            cat(&[
                b"U",
                &[0, 0, 0x40, 5],
                b"O",
                &[0, 1],
                b"t",
                &[0, 0, 0, 1],
                b"a",
                b"N",
                &[0, 1],
                b"t",
                &[0, 0, 0, 1],
                b"b",
            ]),
            LogicalMessage::Update(Update {
                relation_id: 0x4005,
                old: Some(OldTuple::Full(TupleData {
                    values: vec![text("a")],
                })),
                new: TupleData {
                    values: vec![text("b")],
                },
            }),
        ),
        (
            cat(&[
                b"D",
                &[0, 0, 0x40, 5],
                b"K",
                &[0, 2],
                b"t",
                &[0, 0, 0, 2],
                b"10",
                b"n",
            ]),
            LogicalMessage::Delete(Delete {
                relation_id: 0x4005,
                old: OldTuple::Key(TupleData {
                    values: vec![text("10"), TupleValue::Null],
                }),
            }),
        ),
        (
            cat(&[b"D", &[0, 0, 0x40, 5], b"O", &[0, 0]]),
            LogicalMessage::Delete(Delete {
                relation_id: 0x4005,
                old: OldTuple::Full(TupleData::default()),
            }),
        ),
        (
            cat(&[
                b"T",
                &[0, 0, 0, 2],
                &[3],
                &[0, 0, 0x40, 5],
                &[0, 0, 0x40, 0x0D],
            ]),
            LogicalMessage::Truncate(Truncate {
                options: 3,
                relation_ids: vec![0x4005, 0x400D],
            }),
        ),
        (
            cat(&[b"M", &[1], &LSN, b"outbox-relay\0", &[0, 0, 0, 5], b"in-tx"]),
            LogicalMessage::Message(Message {
                transactional: true,
                lsn: Lsn(0x1_0000_00AB),
                prefix: "outbox-relay".into(),
                content: Bytes::from_static(b"in-tx"),
            }),
        ),
        (
            cat(&[b"M", &[0], &LSN, b"\0", &[0, 0, 0, 0]]),
            LogicalMessage::Message(Message {
                transactional: false,
                lsn: Lsn(0x1_0000_00AB),
                prefix: String::new(),
                content: Bytes::new(),
            }),
        ),
    ]
}

#[test]
fn decodes_each_message_type() {
    let samples = samples();
    let mut tags: Vec<u8> = samples.iter().map(|(_, m)| m.tag()).collect();
    tags.dedup();
    assert_eq!(tags, b"BCORYIUDTM");
    for (buf, expected) in &samples {
        assert_eq!(decode(buf).as_ref(), Ok(expected), "{buf:02x?}");
        assert_eq!(buf.first(), Some(&expected.tag()));
    }
}

#[test]
fn test_encoder_matches_hand_assembled_bytes() {
    for (buf, expected) in samples() {
        assert_eq!(common::encode(&expected), buf.to_vec(), "{expected:?}");
    }
}

#[test]
fn every_strict_prefix_is_an_error() {
    for (buf, _) in samples() {
        for len in 0..buf.len() {
            let e = decode(&buf.slice(..len)).expect_err("prefix must not decode");
            assert!(e.offset <= len, "offset {} > len {len}: {e}", e.offset);
            match e.kind {
                DecodeErrorKind::Empty => assert_eq!(len, 0),
                DecodeErrorKind::UnexpectedEnd { needed, remaining } => {
                    assert!(needed > remaining);
                    assert_eq!(e.offset + remaining, len);
                }
                DecodeErrorKind::MissingNulTerminator
                | DecodeErrorKind::CountExceedsInput { .. } => {}
                other => panic!("unexpected error kind {other:?} for prefix {len} of {buf:02x?}"),
            }
        }
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    for (buf, _) in samples() {
        let e = err(&[&buf, b"xy"]);
        assert_eq!(
            e,
            DecodeError {
                offset: buf.len(),
                kind: DecodeErrorKind::TrailingBytes(2)
            }
        );
    }
}

#[test]
fn values_are_zero_copy() {
    let buf = cat(&[
        b"I",
        &[0, 0, 0, 1],
        b"N",
        &[0, 1],
        b"t",
        &[0, 0, 0, 3],
        b"abc",
    ]);
    let Ok(LogicalMessage::Insert(ins)) = decode(&buf) else {
        panic!("not an insert")
    };
    let v = ins
        .new
        .get(0)
        .and_then(TupleValue::as_bytes)
        .expect("text value");
    assert_eq!(v.as_ptr(), buf[buf.len() - 3..].as_ptr());
    assert_eq!(ins.new.values[0].as_str(), Some("abc"));
}

fn kind(parts: &[&[u8]]) -> (usize, DecodeErrorKind) {
    let e = err(parts);
    (e.offset, e.kind)
}

#[test]
fn error_kinds_and_offsets() {
    use DecodeErrorKind as K;
    let rel: &[u8] = &[0, 0, 0, 7];
    assert_eq!(kind(&[]), (0, K::Empty));
    // Streaming (proto 2) and unknown tags.
    assert_eq!(kind(&[b"S", &[0; 8]]), (0, K::UnknownMessageTag(b'S')));
    assert_eq!(kind(&[&[0]]), (0, K::UnknownMessageTag(0)));
    // Tuple value kind.
    assert_eq!(
        kind(&[b"I", rel, b"N", &[0, 2], b"n", b"x"]),
        (9, K::UnknownTupleKind(b'x'))
    );
    // Tuple markers.
    assert_eq!(
        kind(&[b"I", rel, b"K", &[0, 0]]),
        (5, K::UnknownOldTupleKind(b'K'))
    );
    assert_eq!(
        kind(&[b"U", rel, b"X", &[0, 0]]),
        (5, K::UnknownOldTupleKind(b'X'))
    );
    assert_eq!(
        kind(&[b"U", rel, b"K", &[0, 0], b"K", &[0, 0]]),
        (8, K::UnknownOldTupleKind(b'K'))
    );
    assert_eq!(
        kind(&[b"D", rel, b"N", &[0, 0]]),
        (5, K::UnknownOldTupleKind(b'N'))
    );
    // Strings.
    assert_eq!(kind(&[b"Y", rel, b"public"]), (5, K::MissingNulTerminator));
    assert_eq!(kind(&[b"Y", rel, b"pub\0t\xFFx\0"]), (10, K::InvalidUtf8));
    assert_eq!(kind(&[b"O", &LSN, b"\xC3\0"]), (9, K::InvalidUtf8));
    // Negative lengths.
    assert_eq!(
        kind(&[b"I", rel, b"N", &[0, 1], b"t", &[0xFF; 4]]),
        (9, K::NegativeLength(-1))
    );
    assert_eq!(
        kind(&[b"M", &[0], &LSN, b"p\0", &i32::MIN.to_be_bytes()]),
        (12, K::NegativeLength(i32::MIN))
    );
    assert_eq!(
        kind(&[b"T", &[0x80, 0, 0, 0], &[0]]),
        (1, K::NegativeLength(i32::MIN))
    );
    // Counts larger than the input can hold: checked before allocating.
    assert_eq!(
        kind(&[b"I", rel, b"N", &[0xFF, 0xFF], b"nnn"]),
        (
            6,
            K::CountExceedsInput {
                count: 65535,
                remaining: 3
            }
        )
    );
    assert_eq!(
        kind(&[b"R", rel, b"s\0t\0d", &[0, 2], &[0; 10]]),
        (
            10,
            K::CountExceedsInput {
                count: 2,
                remaining: 10
            }
        )
    );
    assert_eq!(
        kind(&[b"T", &[0x7F, 0xFF, 0xFF, 0xFF], &[0], &[0; 8]]),
        (
            1,
            K::CountExceedsInput {
                count: 0x7FFF_FFFF,
                remaining: 8
            }
        )
    );
    // Truncated field.
    assert_eq!(
        kind(&[b"B", &[0; 19]]),
        (
            17,
            K::UnexpectedEnd {
                needed: 4,
                remaining: 3
            }
        )
    );
}

#[test]
fn helpers() {
    let LogicalMessage::Relation(rel) = &samples()[3].1 else {
        panic!("not a relation")
    };
    assert_eq!(rel.column_index("payload"), Some(1));
    assert_eq!(rel.column_index("nope"), None);
    assert!(rel.column("id").is_some_and(Column::is_key));
    assert!(!rel.columns[1].is_key());
    assert_eq!(samples()[3].1.relation_id(), Some(0x4005));
    assert_eq!(samples()[0].1.relation_id(), None);
    let t = Truncate {
        options: 3,
        relation_ids: vec![],
    };
    assert!(t.cascade() && t.restart_identity());
    assert!(TupleValue::Null.is_null());
    assert_eq!(TupleValue::UnchangedToast.as_bytes(), None);
    assert_eq!(TupleValue::Binary(Bytes::from_static(b"x")).as_str(), None);
    assert_eq!(pgoutput::pg_time_to_unix_micros(0), 946_684_800_000_000);
    let e = DecodeError {
        offset: 3,
        kind: DecodeErrorKind::TrailingBytes(2),
    };
    assert_eq!(
        e.to_string(),
        "pgoutput decode error at byte 3: 2 trailing bytes after a complete message"
    );
}
