//! The one list of header lines every publish path sends for an event, in order: the
//! transaction's shared part, then the event's own. Both the async-nats path
//! (`JetStreamPublisher::headers`) and the lean connection's frames (crate `nats-wire`) are built
//! from the one order `nats-wire` defines.

use std::sync::Arc;

use relay_core::message::OutboundMessage;

/// The headers a transaction's events share, in the order they are set:
/// `Nats-Expected-Stream`, then `shared` (a message's first `shared_headers`). With
/// [`own_entries`], the one list both `JetStreamPublisher::headers` and the lean path's
/// frames (`crate::wire`) come from; a later entry replaces an earlier one of the same name.
pub(crate) fn shared_entries<'a>(
    stream: &'a str,
    shared: &'a [(Arc<str>, Arc<str>)],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    nats_wire::shared_lines(stream, shared)
}

/// The headers of one event after the shared ones: `Nats-Msg-Id`, then `own` (the rest of
/// its headers).
pub(crate) fn own_entries<'a>(
    msg: &'a OutboundMessage,
    own: &'a [(Arc<str>, Arc<str>)],
) -> impl Iterator<Item = (&'a str, &'a str)> {
    nats_wire::own_lines(&msg.event_id, own)
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
    nats_wire::same_values(values, shared)
}
