//! Property tests: decode never panics on arbitrary input, and round-trips
//! through the test-only encoder.

mod common;

use bytes::Bytes;
use pgoutput::{
    Begin, Column, Commit, DecodeErrorKind, Delete, Insert, LogicalMessage, Lsn, Message, OldTuple,
    Origin, Relation, Truncate, TupleData, TupleValue, TypeInfo, Update, decode,
};
use proptest::prelude::*;

const TAGS: &[u8] = b"BCORYIUDTM";

fn name() -> impl Strategy<Value = String> {
    "\\PC{0,10}"
}

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

fn bytes() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn value() -> impl Strategy<Value = TupleValue> {
    prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        bytes().prop_map(TupleValue::Text),
        bytes().prop_map(TupleValue::Binary),
    ]
}

fn tuple() -> impl Strategy<Value = TupleData> {
    proptest::collection::vec(value(), 0..6).prop_map(|values| TupleData { values })
}

fn old() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple().prop_map(OldTuple::Key),
        tuple().prop_map(OldTuple::Full)
    ]
}

fn column() -> impl Strategy<Value = Column> {
    (any::<u8>(), name(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| Column {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    )
}

fn message() -> impl Strategy<Value = LogicalMessage> {
    prop_oneof![
        (lsn(), any::<i64>(), any::<u32>()).prop_map(|(final_lsn, commit_time, xid)| {
            LogicalMessage::Begin(Begin {
                final_lsn,
                commit_time,
                xid,
            })
        }),
        (any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(|(flags, c, e, t)| {
            LogicalMessage::Commit(Commit {
                flags,
                commit_lsn: c,
                end_lsn: e,
                commit_time: t,
            })
        }),
        (lsn(), name())
            .prop_map(|(commit_lsn, name)| LogicalMessage::Origin(Origin { commit_lsn, name })),
        (
            any::<u32>(),
            name(),
            name(),
            any::<u8>(),
            proptest::collection::vec(column(), 0..5)
        )
            .prop_map(|(id, namespace, name, replica_identity, columns)| {
                LogicalMessage::Relation(Relation {
                    id,
                    namespace,
                    name,
                    replica_identity,
                    columns,
                })
            }),
        (any::<u32>(), name(), name()).prop_map(|(id, namespace, name)| LogicalMessage::Type(
            TypeInfo {
                id,
                namespace,
                name
            }
        )),
        (any::<u32>(), tuple())
            .prop_map(|(relation_id, new)| LogicalMessage::Insert(Insert { relation_id, new })),
        (any::<u32>(), proptest::option::of(old()), tuple()).prop_map(|(relation_id, old, new)| {
            LogicalMessage::Update(Update {
                relation_id,
                old,
                new,
            })
        }),
        (any::<u32>(), old())
            .prop_map(|(relation_id, old)| LogicalMessage::Delete(Delete { relation_id, old })),
        (any::<u8>(), proptest::collection::vec(any::<u32>(), 0..5)).prop_map(
            |(options, relation_ids)| LogicalMessage::Truncate(Truncate {
                options,
                relation_ids
            })
        ),
        (any::<bool>(), lsn(), name(), bytes()).prop_map(
            |(transactional, lsn, prefix, content)| {
                LogicalMessage::Message(Message {
                    transactional,
                    lsn,
                    prefix,
                    content,
                })
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&Bytes::from(data));
    }

    #[test]
    fn arbitrary_body_after_valid_tag_never_panics(
        tag in proptest::sample::select(TAGS),
        body in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut buf = vec![tag];
        buf.extend_from_slice(&body);
        let buf = Bytes::from(buf);
        match decode(&buf) {
            Ok(m) => {
                prop_assert_eq!(m.tag(), tag);
                // Whatever decodes re-encodes to something that decodes the same.
                let again = decode(&Bytes::from(common::encode(&m)));
                prop_assert_eq!(again, Ok(m));
            }
            Err(e) => prop_assert!(e.offset <= buf.len()),
        }
    }

    #[test]
    fn encode_decode_roundtrip(msg in message()) {
        let buf = Bytes::from(common::encode(&msg));
        prop_assert_eq!(decode(&buf), Ok(msg.clone()));
        for len in 0..buf.len() {
            prop_assert!(decode(&buf.slice(..len)).is_err());
        }
        let mut longer = buf.to_vec();
        longer.push(0);
        let e = decode(&Bytes::from(longer)).expect_err("trailing byte");
        prop_assert_eq!(e.kind, DecodeErrorKind::TrailingBytes(1));
        prop_assert_eq!(e.offset, buf.len());
    }
}
