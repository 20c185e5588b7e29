//! Building one message from one row with a compiled route.

use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{Insert, TupleValue};

use super::json::expand_headers;
use super::{
    CompiledRoute, ContractPlan, HeaderObjectError, HeaderObjectPlan, JsonPointer, MemberError,
    PayloadPlan, RouteError, SubjectPart, TypeSource,
};
use crate::message::{
    HEADER_COMMIT_LSN, HEADER_COMMIT_TIME, HEADER_TABLE, HEADER_TX_INDEX, HEADER_XID,
    OutboundMessage, TxContext,
};
use crate::subject::{push_escaped_token, push_levels};
use crate::value::{self, oid};
use outbox_contract::CE_PREFIX;

/// Text bytes of a value, `None` for NULL; other kinds are unusable in an INSERT.
fn text_of(value: &TupleValue) -> Result<Option<&Bytes>, &'static str> {
    match value {
        TupleValue::Null => Ok(None),
        TupleValue::Text(b) => Ok(Some(b)),
        TupleValue::UnchangedToast => Err("unchanged TOAST value in an insert"),
        TupleValue::Binary(_) => Err("binary-format value (binary mode is not requested)"),
    }
}

impl CompiledRoute {
    /// `(column, role, type oid)` of every mapped column.
    pub(super) fn mapped_types(&self) -> Vec<(String, &'static str, u32)> {
        let mut out = Vec::new();
        let mut push = |index: usize, role: &'static str| {
            if let Some(c) = self.relation.columns.get(index)
                && !out.iter().any(|(n, _, _): &(String, _, _)| *n == c.name)
            {
                out.push((c.name.clone(), role, c.type_oid));
            }
        };
        push(self.event_id, "event_id");
        for i in self.subject.iter().filter_map(SubjectPart::column) {
            push(i, "subject");
        }
        if let PayloadPlan::Column { index, .. } = &self.payload {
            push(*index, "payload");
        }
        for (_, i) in &self.headers {
            push(*i, "header");
        }
        if let Some(plan) = &self.header_object {
            push(plan.index, "headers_json");
        }
        for (i, role) in self.native.iter().flat_map(|n| n.columns()) {
            push(i, role);
        }
        out
    }

    pub(super) fn invalid_payload(
        &self,
        event_id: &str,
        index: usize,
        reason: String,
    ) -> RouteError {
        RouteError::InvalidPayload {
            table: self.table.to_string(),
            event_id: event_id.to_owned(),
            column: self.column_name(index),
            reason,
        }
    }

    pub(super) fn column_name(&self, index: usize) -> String {
        self.relation
            .columns
            .get(index)
            .map_or_else(|| format!("#{index}"), |c| c.name.clone())
    }

    // Long: the per-row hot path (docs/benchmarks.md counts its instructions): each value is read
    // once into the message, no intermediate is built
    pub(super) fn build(
        &self,
        insert: &Insert,
        tx: &TxContext,
        tx_index: u64,
    ) -> Result<OutboundMessage, RouteError> {
        let values = &insert.new.values;
        if values.len() != self.relation.columns.len() {
            return Err(RouteError::ColumnCount {
                table: self.table.to_string(),
                got: values.len(),
                expected: self.relation.columns.len(),
            });
        }
        let unusable = |event_id: &str, index: usize, reason| RouteError::UnusableValue {
            table: self.table.to_string(),
            event_id: event_id.to_owned(),
            column: self.column_name(index),
            reason,
        };
        // Every index below was resolved against this relation, and the length is checked
        // above, so `get` only fails on a bug; treat that like a NULL.
        let text = |index: usize, event_id: &str| -> Result<Option<&[u8]>, RouteError> {
            match values.get(index) {
                None => Ok(None),
                Some(v) => text_of(v)
                    .map(|b| b.map(|b| &b[..]))
                    .map_err(|reason| unusable(event_id, index, reason)),
            }
        };

        let event_id = match text(self.event_id, "?")? {
            Some(b) if !b.is_empty() => value::text_lossy(b).into_owned(),
            _ => {
                return Err(RouteError::MissingEventId {
                    table: self.table.to_string(),
                    column: self.column_name(self.event_id),
                });
            }
        };
        if event_id.chars().any(char::is_control) {
            return Err(RouteError::InvalidHeaderValue {
                table: self.table.to_string(),
                event_id: event_id.escape_debug().to_string(),
                column: self.column_name(self.event_id),
                header: crate::message::HEADER_MSG_ID.to_owned(),
            });
        }

        let mut subject = String::with_capacity(64);
        for part in &self.subject {
            match part {
                SubjectPart::Literal(l) => subject.push_str(l),
                SubjectPart::Column(index) | SubjectPart::Levels(index) => {
                    let Some(b) = text(*index, &event_id)?.filter(|b| !b.is_empty()) else {
                        return Err(RouteError::EmptySubjectValue {
                            table: self.table.to_string(),
                            event_id,
                            column: self.column_name(*index),
                        });
                    };
                    let value = value::text_lossy(b);
                    if matches!(part, SubjectPart::Column(_)) {
                        push_escaped_token(&mut subject, &value);
                    } else if let Err(reason) = push_levels(&mut subject, &value) {
                        return Err(RouteError::InvalidSubjectLevels {
                            table: self.table.to_string(),
                            event_id,
                            column: self.column_name(*index),
                            reason,
                        });
                    }
                }
            }
        }

        // The header object when it was found in one pass with the payload (CAP's envelope).
        let mut envelope_headers = None;
        let payload = match &self.payload {
            PayloadPlan::WholeRow => {
                let mut cols = Vec::with_capacity(values.len());
                for (i, c) in self.relation.columns.iter().enumerate() {
                    cols.push((c.name.as_str(), c.type_oid, text(i, &event_id)?));
                }
                value::row_to_json(cols.into_iter())
            }
            PayloadPlan::Column {
                index,
                type_oid,
                json,
                pointer,
            } => {
                let missing = |reason| {
                    self.missing_member(&event_id, *index, "payload_pointer", pointer, reason)
                };
                let body = match values.get(*index) {
                    Some(TupleValue::Text(b)) if *type_oid == oid::BYTEA => {
                        value::decode_bytea_hex(b)
                            .map_err(|_| unusable(&event_id, *index, "bytea not in hex format"))?
                    }
                    Some(TupleValue::Text(b)) => b.clone(),
                    Some(TupleValue::Null) | None if pointer.is_some() => {
                        return Err(missing(MemberError::Null));
                    }
                    Some(TupleValue::Null) | None if *json => {
                        return Err(self.invalid_payload(&event_id, *index, "NULL".into()));
                    }
                    Some(TupleValue::Null) | None => Bytes::new(),
                    Some(other) => {
                        return Err(unusable(
                            &event_id,
                            *index,
                            text_of(other).err().unwrap_or("unexpected value"),
                        ));
                    }
                };
                if let Some(pointer) = pointer {
                    let member = match self.header_object.as_deref() {
                        Some(HeaderObjectPlan {
                            pointer: Some(headers_pointer),
                            in_payload_envelope: true,
                            ..
                        }) => {
                            // `headers_json` refuses bytea: the column's text is the body.
                            let column = text(*index, &event_id)?.unwrap_or_default();
                            let column = std::str::from_utf8(column)
                                .map_err(|_| missing(MemberError::NotUtf8))?;
                            let (member, object) = pointer.resolve_pair(headers_pointer, column);
                            envelope_headers = Some(object);
                            member.map_err(missing)?
                        }
                        _ => {
                            let text = std::str::from_utf8(&body)
                                .map_err(|_| missing(MemberError::NotUtf8))?;
                            pointer.resolve(text).map_err(missing)?
                        }
                    };
                    if member == "null" {
                        // A JSON null member is no payload: an empty body, as a NULL payload
                        // column gives and as CAP's transports publish a null Value.
                        Bytes::new()
                    } else {
                        slice_of(&body, member)
                    }
                } else {
                    if *json {
                        let text = std::str::from_utf8(&body).map_err(|e| {
                            self.invalid_payload(
                                &event_id,
                                *index,
                                format!("not valid UTF-8 ({e})"),
                            )
                        })?;
                        serde_json::from_str::<serde::de::IgnoredAny>(text)
                            .map_err(|e| self.invalid_payload(&event_id, *index, e.to_string()))?;
                    }
                    body
                }
            }
        };

        // Room for a header object's members without growing, in the usual case.
        let object_room = if self.header_object.is_some() { 8 } else { 0 };
        let mut headers = relay_headers(
            tx,
            Origin::Table(self.table.clone()),
            tx_index,
            self.headers.len() + object_room,
        );
        for (header, index) in &self.headers {
            let Some(raw) = text(*index, &event_id)? else {
                continue;
            };
            let mut value = value::text_lossy(raw);
            if header.eq_ignore_ascii_case("traceparent") {
                value = extract_traceparent(&value).into();
            }
            if value.chars().any(char::is_control) {
                return Err(RouteError::InvalidHeaderValue {
                    table: self.table.to_string(),
                    event_id,
                    column: self.column_name(*index),
                    header: header.to_string(),
                });
            }
            headers.push((header.clone(), value.as_ref().into()));
        }
        if let Some(plan) = &self.header_object
            && let Some(raw) = text(plan.index, &event_id)?
        {
            self.expand_header_object(plan, raw, envelope_headers, &event_id, &mut headers)?;
        }
        if let Some(native) = &self.native {
            let bad = |index: usize, header: &'static str, reason: String| {
                RouteError::InvalidNativeValue {
                    table: self.table.to_string(),
                    event_id: event_id.clone(),
                    column: self.column_name(index),
                    header,
                    reason,
                }
            };
            native.apply(
                &|index| text(index, &event_id),
                &bad,
                &event_id,
                &tx.commit_time_text,
                &mut subject,
                &mut headers,
            )?;
        }

        if let Some(plan) = &self.contracts {
            self.check_contract(plan, &text, &event_id, &subject, &payload, &mut headers)?;
        }

        Ok(OutboundMessage {
            subject,
            event_id,
            headers,
            shared_headers: SHARED_HEADERS,
            payload,
            table: self.table.clone(),
            commit_lsn: tx.commit_lsn,
            commit_time_micros: tx.commit_time_micros,
        })
    }
}

/// `Outbox-Schema`, allocated once.
static SCHEMA_HEADER: std::sync::LazyLock<Arc<str>> =
    std::sync::LazyLock::new(|| outbox_contract::HEADER_SCHEMA.into());

impl CompiledRoute {
    /// Checks the payload against the contract its event type (or subject) matches, and names
    /// the contract in `Outbox-Schema`; the payload itself is published as it is.
    fn check_contract<'v>(
        &self,
        plan: &ContractPlan,
        text: &impl Fn(usize, &str) -> Result<Option<&'v [u8]>, RouteError>,
        event_id: &str,
        subject: &str,
        payload: &[u8],
        headers: &mut Vec<(Arc<str>, Arc<str>)>,
    ) -> Result<(), RouteError> {
        let event_type = match (plan.type_index, plan.set.type_source()) {
            (Some(index), _) => text(index, event_id)?.map(value::text_lossy),
            (None, TypeSource::Header(name)) => headers
                .iter()
                .find(|(header, _)| header.eq_ignore_ascii_case(name))
                .map(|(_, v)| std::borrow::Cow::Borrowed(v.as_ref())),
            (None, TypeSource::Column(_)) => None,
        };
        match plan.set.check(
            &self.table,
            event_id,
            event_type.as_deref(),
            subject,
            payload,
        ) {
            Ok(Some(key)) => {
                headers.push((SCHEMA_HEADER.clone(), key));
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(refusal) => Err(RouteError::Contract {
                table: self.table.to_string(),
                event_id: event_id.to_owned(),
                refusal: Box::new(refusal),
            }),
        }
    }

    fn missing_member(
        &self,
        event_id: &str,
        index: usize,
        key: &'static str,
        pointer: &Option<JsonPointer>,
        reason: MemberError,
    ) -> RouteError {
        RouteError::MissingMember {
            table: self.table.to_string(),
            event_id: event_id.to_owned(),
            column: self.column_name(index),
            key,
            pointer: pointer
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            reason: Box::new(reason),
        }
    }

    /// The members of a `headers_json` value (`raw`, not NULL) as headers; `found` is the
    /// object's member of `raw` (or why there is none) when the payload's pass found it.
    fn expand_header_object(
        &self,
        plan: &HeaderObjectPlan,
        raw: &[u8],
        found: Option<Result<&str, MemberError>>,
        event_id: &str,
        headers: &mut Vec<(Arc<str>, Arc<str>)>,
    ) -> Result<(), RouteError> {
        let invalid = |reason| RouteError::InvalidHeaderObject {
            table: self.table.to_string(),
            event_id: event_id.to_owned(),
            column: self.column_name(plan.index),
            reason,
        };
        let missing = |reason| {
            self.missing_member(
                event_id,
                plan.index,
                "headers_json_pointer",
                &plan.pointer,
                reason,
            )
        };
        let object = match (found, &plan.pointer) {
            (Some(found), _) => found.map_err(missing)?,
            (None, None) => {
                std::str::from_utf8(raw).map_err(|_| invalid(HeaderObjectError::NotUtf8))?
            }
            (None, Some(pointer)) => {
                let text =
                    std::str::from_utf8(raw).map_err(|_| invalid(HeaderObjectError::NotUtf8))?;
                pointer.resolve(text).map_err(missing)?
            }
        };
        if object == "null" {
            return Ok(());
        }
        let mapped = |name: &str| {
            self.headers
                .iter()
                .any(|(header, _)| header.eq_ignore_ascii_case(name))
                || (plan.cloudevents
                    && name
                        .as_bytes()
                        .get(..CE_PREFIX.len())
                        .is_some_and(|p| p.eq_ignore_ascii_case(CE_PREFIX.as_bytes())))
        };
        expand_headers(object, headers, &mapped).map_err(invalid)
    }
}

/// `member` (a sub-slice of `body`'s text) as a slice of `body`: the producer's bytes, no copy.
fn slice_of(body: &Bytes, member: &str) -> Bytes {
    let start = (member.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    if body.get(start..start.saturating_add(member.len())) == Some(member.as_bytes()) {
        body.slice(start..start + member.len())
    } else {
        Bytes::copy_from_slice(member.as_bytes())
    }
}

/// The leading headers of a routed event that are the same for its whole transaction and
/// origin (table or message prefix): the publisher builds them once per transaction.
pub(super) const SHARED_HEADERS: usize = 4;

/// Where an event comes from: an outbox table, or a `pg_logical_emit_message` prefix.
pub(super) enum Origin {
    /// `Outbox-Table`.
    Table(Arc<str>),
    /// `Outbox-Message-Prefix`.
    MessagePrefix(Arc<str>),
}

/// The relay's own header names, allocated once: commit LSN, xid, commit time, the two origin
/// headers, the index in the transaction.
static RELAY_HEADER_NAMES: std::sync::LazyLock<[Arc<str>; 6]> = std::sync::LazyLock::new(|| {
    [
        HEADER_COMMIT_LSN.into(),
        HEADER_XID.into(),
        HEADER_COMMIT_TIME.into(),
        HEADER_TABLE.into(),
        outbox_contract::HEADER_MESSAGE_PREFIX.into(),
        HEADER_TX_INDEX.into(),
    ]
});

/// The headers every event carries, in wire order: the [`SHARED_HEADERS`] first (commit LSN,
/// xid, commit time, origin), then the index in the transaction; room for `more`.
pub(super) fn relay_headers(
    tx: &TxContext,
    origin: Origin,
    tx_index: u64,
    more: usize,
) -> Vec<(Arc<str>, Arc<str>)> {
    let [commit_lsn, xid, commit_time, table, prefix, index] = &*RELAY_HEADER_NAMES;
    let (origin_name, origin) = match origin {
        Origin::Table(table_name) => (table, table_name),
        Origin::MessagePrefix(prefix_name) => (prefix, prefix_name),
    };
    let mut headers = Vec::with_capacity(5 + more);
    headers.push((commit_lsn.clone(), tx.commit_lsn_text.clone()));
    headers.push((xid.clone(), tx.xid_text.clone()));
    headers.push((commit_time.clone(), tx.commit_time_text.clone()));
    headers.push((origin_name.clone(), origin));
    headers.push((index.clone(), tx_index.to_string().into()));
    headers
}
/// Debezium stores the span context as Java properties text (`traceparent=00-…` lines); a bare
/// W3C value is taken as is.
fn extract_traceparent(value: &str) -> String {
    value
        .lines()
        .find_map(|l| l.trim().strip_prefix("traceparent="))
        .unwrap_or(value)
        .trim()
        .to_owned()
}
