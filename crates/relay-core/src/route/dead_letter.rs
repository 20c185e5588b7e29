//! Dead letters: what goes to `[relay] dead_letter_subject` instead of stopping the relay, built
//! here next to the routing that failed.

use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{Insert, Lsn, TupleValue};
use xxhash_rust::xxh3::xxh3_128;

use super::{RelationRoute, Router};
use crate::message::{
    HEADER_COMMIT_LSN, HEADER_TABLE, HEADER_TX_INDEX, HEADER_XID, OutboundMessage, TxContext,
};
use outbox_contract::HEADER_DLQ_REASON;

impl Router {
    /// The event id of an outbox Insert, when its table has the column and the value is not
    /// NULL or empty (for error reports; control characters escaped).
    pub fn event_id_of(&self, insert: &Insert) -> Option<String> {
        let Some(RelationRoute::Outbox {
            event_id: Some(index),
            ..
        }) = self.relations.get(&insert.relation_id)
        else {
            return None;
        };
        match insert.new.values.get(*index) {
            Some(TupleValue::Text(b)) if !b.is_empty() => {
                Some(String::from_utf8_lossy(b).escape_debug().to_string())
            }
            _ => None,
        }
    }

    /// The row of an outbox Insert as a JSON object (column name → text value or `null`) and
    /// its table, for a dead letter; `None` when the relation is unknown or not an outbox.
    pub fn raw_row(&self, insert: &Insert) -> Option<(Arc<str>, Bytes)> {
        let Some(RelationRoute::Outbox { relation, .. }) = self.relations.get(&insert.relation_id)
        else {
            return None;
        };
        let table: Arc<str> = format!("{}.{}", relation.namespace, relation.name).into();
        let mut row = serde_json::Map::new();
        for (i, value) in insert.new.values.iter().enumerate() {
            let name = relation
                .columns
                .get(i)
                .map_or_else(|| format!("#{i}"), |c| c.name.clone());
            let value = match value {
                TupleValue::Text(b) => serde_json::Value::String(String::from_utf8_lossy(b).into()),
                _ => serde_json::Value::Null,
            };
            row.insert(name, value);
        }
        let bytes = serde_json::to_vec(&serde_json::Value::Object(row)).unwrap_or_default();
        Some((table, Bytes::from(bytes)))
    }

    /// The dead letter for an outbox row that cannot be routed: the raw row as JSON, with why,
    /// under an id made of its table, commit LSN and index in the transaction (a re-read of the
    /// same WAL makes the same id, so the broker drops the copy). A row whose commit is not
    /// known (commit LSN `0/0`: read from the table by `outbox-relay backfill`) has no such
    /// position: its id is made of its table and a hash of the raw row instead, the same for
    /// every re-read of the row and different for every other row. `None` when the row is not
    /// an outbox row.
    pub fn dead_letter_row(
        &self,
        subject: &str,
        insert: &Insert,
        tx: &TxContext,
        tx_index: u64,
        reason: &dyn std::fmt::Display,
    ) -> Option<OutboundMessage> {
        let (table, payload) = self.raw_row(insert)?;
        // The table's name as a header value, like every other value: a table renamed to a
        // name with a line break must not break the frame (nor the id made of it).
        let table = header_value(&table);
        let event_id = if tx.commit_lsn == Lsn(0) {
            format!("dlq:{table}:row:{:032x}", xxh3_128(&payload))
        } else {
            format!("dlq:{table}:{}:{tx_index}", tx.commit_lsn)
        };
        Some(OutboundMessage {
            subject: subject.to_owned(),
            event_id,
            headers: vec![
                (HEADER_DLQ_REASON.into(), header_value(reason)),
                (HEADER_TABLE.into(), table.clone()),
                (HEADER_COMMIT_LSN.into(), tx.commit_lsn_text.clone()),
                (HEADER_XID.into(), tx.xid_text.clone()),
                (HEADER_TX_INDEX.into(), tx_index.to_string().into()),
            ],
            shared_headers: 0,
            payload,
            table,
            commit_lsn: tx.commit_lsn,
            commit_time_micros: tx.commit_time_micros,
        })
    }
}

/// The dead letter for an event whose id the broker already holds with other content: the
/// event as routed, with why.
pub fn dead_letter_collision(
    subject: &str,
    msg: &OutboundMessage,
    reason: &dyn std::fmt::Display,
) -> OutboundMessage {
    let mut headers = msg.headers.clone();
    headers.push((HEADER_DLQ_REASON.into(), header_value(reason)));
    OutboundMessage {
        subject: subject.to_owned(),
        event_id: format!("dlq:collision:{}:{}", msg.event_id, msg.commit_lsn),
        headers,
        shared_headers: msg.shared_headers,
        payload: msg.payload.clone(),
        table: msg.table.clone(),
        commit_lsn: msg.commit_lsn,
        commit_time_micros: msg.commit_time_micros,
    }
}

/// `reason` as a header value: control characters cannot be in one (error texts rarely hold
/// them, but a column value quoted in one might).
pub(super) fn header_value(reason: &dyn std::fmt::Display) -> Arc<str> {
    reason
        .to_string()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .into()
}
