//! What a publish on the connection can end in besides a stored message: a typed refusal or an
//! unknown outcome, each with a message that says what happened.

use serde::Deserialize;

/// Why a publish did not end in a stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireErrorKind {
    /// No answer says what happened (no PubAck in time, the connection lost or down, an answer
    /// that is not a PubAck): the message may be stored. Send it again.
    Unknown,
    /// The server closed the connection over a protocol error (`-ERR`) after this message was
    /// sent: as [`Self::Unknown`], and this message may be the cause.
    ClosedByServer,
    /// A 503 status: no stream captures the subject (or its leader is being elected).
    NoResponders,
    /// JetStream refused the message with this API error code.
    Refused { err_code: u64 },
    /// The server refused to let this connection publish to the subject (a permissions
    /// violation).
    Denied,
    /// Stored, but by stream `stream` in JetStream domain `received` (`None`: no domain), not
    /// in `expected`, the domain the connection expects ([`crate::ConnectOptions::domain`]).
    OtherDomain {
        stream: String,
        expected: String,
        received: Option<String>,
    },
    /// A PubAck naming stream `received`, not `expected`, the stream the connection expects
    /// ([`crate::ConnectOptions::stream`]): not an acknowledgement of the stream's.
    OtherStream { expected: String, received: String },
    /// A header of the message (its name `header`) holds CR, LF or NUL: it cannot be framed,
    /// and nothing was sent.
    Unsendable { header: String },
}

/// A publish's refusal or unknown outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct WireError {
    pub kind: WireErrorKind,
    pub detail: String,
}

impl WireError {
    pub(crate) fn new(kind: WireErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    pub(crate) fn unknown(detail: impl Into<String>) -> Self {
        Self::new(WireErrorKind::Unknown, detail)
    }
}

/// The `error` object of a JetStream API answer: `{"code":400,"err_code":10060,
/// "description":"..."}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ApiError {
    /// The HTTP-like status.
    #[serde(default)]
    pub code: u64,
    /// JetStream's own error code.
    #[serde(default)]
    pub err_code: u64,
    #[serde(default)]
    pub description: String,
}
