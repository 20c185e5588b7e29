//! The one list of header lines every publish path sends for an event, in order: the
//! transaction's shared part, then the event's own. Both the async-nats path
//! (`JetStreamPublisher::headers`) and the lean path's frames (`crate::wire`) are built from it.

use std::sync::Arc;

use relay_core::message::{HEADER_EXPECTED_STREAM, HEADER_MSG_ID, OutboundMessage};

/// The headers a transaction's events share, in the order they are set:
/// `Nats-Expected-Stream`, then `shared` (a message's first `shared_headers`). With
/// [`own_entries`], the one list both `JetStreamPublisher::headers` and the lean path's
/// frames (`crate::wire`) come from; a later entry replaces an earlier one of the same name.
pub(crate) fn shared_entries<'a>(
    stream: &'a str,
    shared: &'a [(Arc<str>, Arc<str>)],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    std::iter::once((HEADER_EXPECTED_STREAM, stream))
        .chain(shared.iter().map(|(name, value)| (&**name, &**value)))
}

/// The headers of one event after the shared ones: `Nats-Msg-Id`, then `own` (the rest of
/// its headers).
pub(crate) fn own_entries<'a>(
    msg: &'a OutboundMessage,
    own: &'a [(Arc<str>, Arc<str>)],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    std::iter::once((HEADER_MSG_ID, msg.event_id.as_str()))
        .chain(own.iter().map(|(name, value)| (&**name, &**value)))
}

/// One header of an [`OutboundMessage`].
pub(crate) type Header = (Arc<str>, Arc<str>);

/// `msg`'s headers split into the shared part and its own.
pub(crate) fn split(msg: &OutboundMessage) -> (&[Header], &[Header]) {
    msg.headers
        .split_at(msg.shared_headers.min(msg.headers.len()))
}

/// Whether `values` are, by pointer, the values of `shared` (the same transaction and table).
pub(crate) fn same_values(values: &[Arc<str>], shared: &[(Arc<str>, Arc<str>)]) -> bool {
    values.len() == shared.len()
        && values
            .iter()
            .zip(shared)
            .all(|(value, (_, next))| Arc::ptr_eq(value, next))
}
