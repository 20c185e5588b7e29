//! Test-only pgoutput encoder (the inverse of `pgoutput::decode`).
#![allow(dead_code)]

use pgoutput::{LogicalMessage, OldTuple, TupleData, TupleValue};

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn len32(n: usize) -> [u8; 4] {
    i32::try_from(n).expect("test data fits i32").to_be_bytes()
}

/// Appends a TupleData (Int16 count + values).
pub fn tuple(out: &mut Vec<u8>, t: &TupleData) {
    let n = u16::try_from(t.values.len()).expect("test data fits u16");
    out.extend_from_slice(&n.to_be_bytes());
    for v in &t.values {
        match v {
            TupleValue::Null => out.push(b'n'),
            TupleValue::UnchangedToast => out.push(b'u'),
            TupleValue::Text(b) | TupleValue::Binary(b) => {
                out.push(if matches!(v, TupleValue::Text(_)) {
                    b't'
                } else {
                    b'b'
                });
                out.extend_from_slice(&len32(b.len()));
                out.extend_from_slice(b);
            }
        }
    }
}

fn old(out: &mut Vec<u8>, o: &OldTuple) {
    match o {
        OldTuple::Key(t) => {
            out.push(b'K');
            tuple(out, t);
        }
        OldTuple::Full(t) => {
            out.push(b'O');
            tuple(out, t);
        }
    }
}

/// Encodes one message as PostgreSQL's pgoutput (proto_version 1) would.
pub fn encode(msg: &LogicalMessage) -> Vec<u8> {
    let mut out = vec![msg.tag()];
    match msg {
        LogicalMessage::Begin(m) => {
            out.extend_from_slice(&m.final_lsn.0.to_be_bytes());
            out.extend_from_slice(&m.commit_time.to_be_bytes());
            out.extend_from_slice(&m.xid.to_be_bytes());
        }
        LogicalMessage::Commit(m) => {
            out.push(m.flags);
            out.extend_from_slice(&m.commit_lsn.0.to_be_bytes());
            out.extend_from_slice(&m.end_lsn.0.to_be_bytes());
            out.extend_from_slice(&m.commit_time.to_be_bytes());
        }
        LogicalMessage::Origin(m) => {
            out.extend_from_slice(&m.commit_lsn.0.to_be_bytes());
            cstr(&mut out, &m.name);
        }
        LogicalMessage::Relation(m) => {
            out.extend_from_slice(&m.id.to_be_bytes());
            cstr(&mut out, &m.namespace);
            cstr(&mut out, &m.name);
            out.push(m.replica_identity);
            let n = u16::try_from(m.columns.len()).expect("test data fits u16");
            out.extend_from_slice(&n.to_be_bytes());
            for c in &m.columns {
                out.push(c.flags);
                cstr(&mut out, &c.name);
                out.extend_from_slice(&c.type_oid.to_be_bytes());
                out.extend_from_slice(&c.type_modifier.to_be_bytes());
            }
        }
        LogicalMessage::Type(m) => {
            out.extend_from_slice(&m.id.to_be_bytes());
            cstr(&mut out, &m.namespace);
            cstr(&mut out, &m.name);
        }
        LogicalMessage::Insert(m) => {
            out.extend_from_slice(&m.relation_id.to_be_bytes());
            out.push(b'N');
            tuple(&mut out, &m.new);
        }
        LogicalMessage::Update(m) => {
            out.extend_from_slice(&m.relation_id.to_be_bytes());
            if let Some(o) = &m.old {
                old(&mut out, o);
            }
            out.push(b'N');
            tuple(&mut out, &m.new);
        }
        LogicalMessage::Delete(m) => {
            out.extend_from_slice(&m.relation_id.to_be_bytes());
            old(&mut out, &m.old);
        }
        LogicalMessage::Truncate(m) => {
            out.extend_from_slice(&len32(m.relation_ids.len()));
            out.push(m.options);
            for id in &m.relation_ids {
                out.extend_from_slice(&id.to_be_bytes());
            }
        }
        LogicalMessage::Message(m) => {
            out.push(u8::from(m.transactional));
            out.extend_from_slice(&m.lsn.0.to_be_bytes());
            cstr(&mut out, &m.prefix);
            out.extend_from_slice(&len32(m.content.len()));
            out.extend_from_slice(&m.content);
        }
    }
    out
}
