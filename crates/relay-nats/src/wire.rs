//! The relay's side of its publishing connection (crate `nats-wire`, which knows nothing of the
//! relay): how the connection reads an [`OutboundMessage`], its options from `[nats]` (the
//! credentials and TLS [`ClientAuth`] resolved for both clients), and its refusals as the
//! pipeline's [`PublishError`]s. Every message of every publish mode goes on it unless
//! `[nats] publish_path = "async-nats"`; where each message goes in each mode:
//! docs/design.md, "Where each message goes".

use std::sync::Arc;

use nats_wire::{ConnectOptions, Credentials, Framing, Header, WireError, WireErrorKind};
use relay_core::message::OutboundMessage;
use relay_core::secret::Secret;
use relay_core::stage::{PublishError, PublishErrorKind};

use crate::client_auth::ClientAuth;
use crate::connection_state::ConnectionState;
use crate::error::NatsError;
use crate::error_codes::kind_for_error_code;
use crate::header_entries::split;
use crate::settings::NatsSettings;

pub(crate) use nats_wire::{RawOutcome, fast_batch_reply_suffix_len};

/// How the publishing connection reads the relay's messages.
#[derive(Debug)]
pub(crate) struct Outbox;

impl Framing for Outbox {
    type Message = OutboundMessage;

    fn subject(msg: &OutboundMessage) -> &str {
        &msg.subject
    }

    fn msg_id(msg: &OutboundMessage) -> &str {
        &msg.event_id
    }

    fn shared_headers(msg: &OutboundMessage) -> &[Header] {
        split(msg).0
    }

    fn own_headers(msg: &OutboundMessage) -> &[Header] {
        split(msg).1
    }

    fn payload(msg: &OutboundMessage) -> &[u8] {
        &msg.payload
    }
}

/// The relay's publishing connection.
pub(crate) type LeanConnection = nats_wire::Connection<Outbox>;
/// A fast batch's reply subjects and answers on it.
pub(crate) type BatchReplies = nats_wire::BatchReplies<Outbox>;

impl Credentials for ClientAuth {
    fn user(&self) -> Option<(&str, &str)> {
        self.user
            .as_ref()
            .map(|(user, password)| (user.as_str(), password.expose()))
    }

    fn token(&self) -> Option<&str> {
        self.token.as_ref().map(Secret::expose)
    }

    fn nkey(&self) -> Option<&nkeys::KeyPair> {
        self.nkey.as_ref().map(|nkey| &*nkey.pair)
    }

    fn jwt(&self) -> Option<(&str, &nkeys::KeyPair)> {
        self.jwt.as_ref().map(|(jwt, pair)| (jwt.as_str(), &**pair))
    }

    fn tls(&self) -> Result<&Arc<rustls::ClientConfig>, &str> {
        self.tls.config()
    }
}

/// The publishing connection's options: the servers of `[nats] url`, with `auth` (what
/// [`crate::connect`] resolved for both connections); its permission errors are recorded in
/// `state`, the async-nats connection's, so both paths explain a refused publish alike. Errors
/// name the setting and the fix.
pub(crate) fn options(
    settings: &NatsSettings,
    auth: Arc<ClientAuth>,
    state: Arc<ConnectionState>,
) -> Result<ConnectOptions, NatsError> {
    let mut options = ConnectOptions::new(&settings.url, auth).map_err(|e| {
        NatsError::Settings(format!(
            "nats.url `{}` is not a NATS server URL list: {e}",
            settings.display_url()
        ))
    })?;
    options.tls_required = settings.tls_required;
    options.connect_timeout = settings.connect_timeout;
    options.display_url = settings.display_url();
    options.name = "outbox-relay (lean publish)".to_owned();
    options.on_server_error = Some(Arc::new(move |text: &str| state.record_server_error(text)));
    options.domain = settings.domain.as_deref().map(Arc::from);
    options.inbox_prefix = settings.inbox_prefix().to_owned();
    Ok(options)
}

/// A PubAck that names another stream than the relay's: not an acknowledgement of the relay's
/// stream (fatal: the relay stops before the message's transaction; docs/security.md).
pub(crate) fn other_stream(expected: &str, received: &str) -> PublishError {
    PublishError::new(
        PublishErrorKind::Rejected,
        format!(
            "an answer to the relay's publish names stream `{received}`, not `{expected}`: not counted as stored. Another client answered the relay's reply subject, or another stream captured the subject: other users of the account must not both subscribe to the outbox subjects and publish to _INBOX.> (docs/security.md, \"Who else may use the account\")"
        ),
    )
}

/// The outcome of a publish whose connection was dropped before it was answered.
pub(crate) fn connection_closed() -> WireError {
    WireError {
        kind: WireErrorKind::Unknown,
        detail: "the lean publish connection was closed".into(),
    }
}

/// A refusal or unknown outcome of the publishing connection, as the pipeline classes it.
pub(crate) fn publish_error(error: WireError) -> PublishError {
    let WireError { kind, detail } = error;
    match kind {
        WireErrorKind::Unknown => PublishError::new(PublishErrorKind::Unknown, detail),
        WireErrorKind::ClosedByServer => PublishError::closed_by_server(detail),
        WireErrorKind::NoResponders => PublishError::new(PublishErrorKind::NoStream, detail),
        WireErrorKind::Refused { err_code } => {
            PublishError::new(kind_for_error_code(err_code), detail)
        }
        WireErrorKind::OtherDomain {
            stream,
            expected,
            received,
        } => crate::domain::mismatch(Some(&expected), &stream, received.as_deref()),
        WireErrorKind::OtherStream { expected, received } => other_stream(&expected, &received),
        WireErrorKind::Unsendable { .. } => PublishError::new(
            PublishErrorKind::Rejected,
            format!("{detail}: nothing was sent; the value must not hold CR, LF or NUL"),
        ),
        WireErrorKind::Denied => PublishError::new(
            PublishErrorKind::Rejected,
            format!(
                "{detail}: grant the relay's NATS user publish permission on the outbox subjects"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of the connection's refusals keeps its meaning for the pipeline.
    #[test]
    fn wire_errors_keep_their_class() {
        let of = |kind| {
            publish_error(WireError {
                kind,
                detail: "d".into(),
            })
        };
        assert_eq!(of(WireErrorKind::Unknown).kind, PublishErrorKind::Unknown);
        let closed = of(WireErrorKind::ClosedByServer);
        assert!(closed.closed_by_server && closed.kind == PublishErrorKind::Unknown);
        assert_eq!(
            of(WireErrorKind::NoResponders).kind,
            PublishErrorKind::NoStream
        );
        // Expected stream mismatch: refused for good; a full stream: nothing stored, again
        // once there is room; the commit-order condition: again, in turn.
        assert_eq!(
            of(WireErrorKind::Refused { err_code: 10060 }).kind,
            PublishErrorKind::Rejected
        );
        assert_eq!(
            of(WireErrorKind::Refused { err_code: 10077 }).kind,
            PublishErrorKind::StreamFull
        );
        assert_eq!(
            of(WireErrorKind::Refused { err_code: 10070 }).kind,
            PublishErrorKind::OutOfTurn
        );
        let other = of(WireErrorKind::OtherDomain {
            stream: "OUTBOX".into(),
            expected: "hub".into(),
            received: Some("leaf".into()),
        });
        assert_eq!(other.kind, PublishErrorKind::Rejected);
        for needle in ["`OUTBOX`", "`leaf`", "[nats] domain = \"hub\""] {
            assert!(other.message.contains(needle), "{needle}: {other}");
        }
        let denied = of(WireErrorKind::Denied);
        assert_eq!(denied.kind, PublishErrorKind::Rejected);
        assert!(denied.message.contains("publish permission"), "{denied}");
    }
}
