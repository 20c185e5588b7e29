//! How events go out, decided once: [`Framing`], chosen from `[nats] publish_mode` and what the
//! server and the stream take ([`Framing::choose`], pure, so every case is tested without a
//! server). The publisher keeps the choice; nothing else branches on the mode.

use crate::settings::PublishMode;

/// How the publisher frames what the pipeline hands it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Each message on its own, with no condition on the stream's last message: a backfill's
    /// rows, which go out in key order beside the relay's live events.
    Alone,
    /// Each message on its own, stored only after the event published before it while that one
    /// is not known stored (`Nats-Expected-Last-Msg-Id`): `per-message` mode.
    ByEventId,
    /// Each message on its own, at the stream sequence after its predecessor's while that one is
    /// not known stored (`Nats-Expected-Last-Sequence`): `per-message` mode on a replicated
    /// stream of nats-server 2.14 or later, where a refused event-id condition fails the stream
    /// ([`crate::StreamReport::order_by_sequence`]).
    BySequence,
    /// Each transaction as one atomic batch (in parts above the batch limit); what a batch does
    /// not take goes on its own, with its condition naming a sequence when `by_sequence`.
    AtomicBatch {
        /// Every condition names a stream sequence (a replicated stream, as for
        /// [`Framing::BySequence`]).
        by_sequence: bool,
    },
    /// Fast batches: flow-controlled, acknowledged many messages at a time, open across
    /// transactions while more come.
    FastBatch,
}

/// What the stream takes, for [`Framing::choose`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTakes {
    /// `allow_atomic`.
    pub atomic_batches: bool,
    /// `allow_batched`.
    pub fast_batches: bool,
    /// Every commit-order condition must name a sequence ([`crate::StreamReport::order_by_sequence`]).
    pub order_by_sequence: bool,
}

impl StreamTakes {
    /// A stream that takes both kinds of batch and event-id conditions (tests, benchmarks).
    pub const BATCHES: Self = Self {
        atomic_batches: true,
        fast_batches: true,
        order_by_sequence: false,
    };
}

/// What the choice says to the operator: an INFO line, or a WARN line when the configured mode
/// cannot be used (every message then goes on its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChoiceNote {
    Info(String),
    Warn(String),
}

impl Framing {
    /// How events go out for `mode`, given what `stream` (named `stream_name`) takes, the
    /// server's version and whether `[nats] domain` is set; with what to log about it.
    /// `atomic-batch` needs a server that takes `Nats-Msg-Id` inside atomic batches (2.12.1+) and
    /// `allow_atomic`; `fast-batch` a server with fast batches (2.14.0+), `allow_batched`, no
    /// domain (its flow acks name none) and event-id conditions (on a replicated stream it
    /// cannot keep commit order). Otherwise one warning says which is missing and every message
    /// goes on its own.
    // Long: one decision table over the mode and what the server and stream take, each case
    // with its one line for the operator
    pub fn choose(
        mode: PublishMode,
        stream: StreamTakes,
        stream_name: &str,
        server_version: &str,
        domain: bool,
    ) -> (Self, Vec<ChoiceNote>) {
        let alone = if stream.order_by_sequence {
            Self::BySequence
        } else {
            Self::ByEventId
        };
        let mut notes = Vec::new();
        if stream.order_by_sequence {
            notes.push(ChoiceNote::Info(
                "commit order kept by the stream's sequence (Nats-Expected-Last-Sequence): the stream is replicated, and on nats-server 2.14 or later a refused Nats-Expected-Last-Msg-Id fails a replicated stream".to_owned(),
            ));
        }
        let (name, supported, needs_server, setting, edit, allowed) = match mode {
            PublishMode::PerMessage => return (alone, notes),
            PublishMode::AtomicBatch => (
                "atomic-batch",
                crate::server_features::supports_atomic_batches as fn(&str) -> bool,
                "2.12.1 (Nats-Msg-Id inside atomic batches)",
                "allow_atomic",
                "--allow-batch",
                stream.atomic_batches,
            ),
            PublishMode::FastBatch => (
                "fast-batch",
                crate::server_features::supports_fast_batches as fn(&str) -> bool,
                "2.14.0 (fast batch publishing)",
                "allow_batched",
                "--allow-batched",
                stream.fast_batches,
            ),
        };
        let refusal = if mode == PublishMode::FastBatch && domain {
            Some(format!(
                "[nats] publish_mode = \"{name}\" is not used with [nats] domain set (its flow acknowledgements name no domain); publishing each message on its own"
            ))
        } else if mode == PublishMode::FastBatch && stream.order_by_sequence {
            Some(format!(
                "[nats] publish_mode = \"{name}\" does not keep commit order on a replicated stream of nats-server 2.14 or later; publishing each message on its own"
            ))
        } else if !supported(server_version) {
            Some(format!(
                "[nats] publish_mode = \"{name}\" needs nats-server {needs_server} or later; publishing each message on its own"
            ))
        } else if !allowed {
            Some(format!(
                "[nats] publish_mode = \"{name}\" needs the stream's {setting} (nats stream edit {stream_name} {edit}, or create_stream); publishing each message on its own"
            ))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            notes.push(ChoiceNote::Warn(refusal));
            return (alone, notes);
        }
        let framing = if mode == PublishMode::FastBatch {
            Self::FastBatch
        } else {
            Self::AtomicBatch {
                by_sequence: stream.order_by_sequence,
            }
        };
        notes.push(ChoiceNote::Info(framing.describe().to_owned()));
        (framing, notes)
    }

    /// Whether every commit-order condition names a stream sequence.
    pub fn by_sequence(self) -> bool {
        matches!(
            self,
            Self::BySequence | Self::AtomicBatch { by_sequence: true }
        )
    }

    /// Whether transactions go out as atomic batches.
    pub fn atomic_batches(self) -> bool {
        matches!(self, Self::AtomicBatch { .. })
    }

    /// Whether messages go out in fast batches.
    pub fn fast_batches(self) -> bool {
        self == Self::FastBatch
    }

    /// What one framing task calls the unit it publishes, for its messages.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Self::AtomicBatch { .. } => "batch",
            Self::FastBatch => "fast batch",
            Self::Alone | Self::ByEventId | Self::BySequence => "message",
        }
    }

    /// The INFO line of a batch framing.
    fn describe(self) -> &'static str {
        match self {
            Self::FastBatch => "publishing in fast batches (one flow ack for many messages)",
            Self::AtomicBatch { .. } => "publishing each transaction as one atomic batch",
            Self::Alone | Self::ByEventId | Self::BySequence => {
                "publishing each message on its own"
            }
        }
    }
}

#[cfg(test)]
mod tests;
