//! JetStream domains (`[nats] domain`): a leaf node deployment where the stream lives in
//! another server's JetStream than the one the relay connects to. Management requests then go
//! to `$JS.<domain>.API` (the connection's JetStream contexts carry the domain, see
//! [`crate::NatsConnection::jetstream`]), and every PubAck must come from that domain: a stream
//! of the same name in another domain (the leaf's own, say) that captures the subjects too
//! answers first, and its acknowledgement says nothing about the stream the relay was set up
//! for. [`check_ack_domain`] is the one check both publish paths make.

use relay_core::stage::{PublishError, PublishErrorKind};

/// A PubAck from a stream in another JetStream domain than the configured one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "stream `{stream}` acknowledged from JetStream domain {} but [nats] domain = \"{expected}\": the message is stored in the wrong domain's stream and is not counted as delivered; make the stream in domain `{expected}` the only one capturing the outbox subjects (remove or rename the other domain's stream `{stream}`), or set [nats] domain to the domain that holds the stream",
    received.as_deref().map_or_else(|| "(none: the server has no domain)".to_owned(), |d| format!("`{d}`"))
)]
pub struct DomainMismatch {
    /// The stream the PubAck names.
    pub stream: String,
    /// `[nats] domain`.
    pub expected: String,
    /// The domain the PubAck names, `None` when it names none.
    pub received: Option<String>,
}

pub(crate) use nats_wire::ack_domain_matches;

/// The check every PubAck of a stored message passes before it counts: `Ok` when it is from
/// the `expected` domain (or none is configured), else a refusal (fatal: the relay stops before
/// the message's transaction, which it publishes again at the next start) naming `stream`, both
/// domains and the fix. An empty `received` is no domain (async-nats' PubAck has `""`).
pub(crate) fn check_ack_domain(
    expected: Option<&str>,
    stream: &str,
    received: Option<&str>,
) -> Result<(), PublishError> {
    let received = received.filter(|d| !d.is_empty());
    if ack_domain_matches(expected, received.map(str::as_bytes)) {
        return Ok(());
    }
    Err(mismatch(expected, stream, received))
}

/// The refusal of a PubAck of `stream` from domain `received` where `expected` is configured
/// (fatal: the relay stops before the message's transaction).
pub(crate) fn mismatch(
    expected: Option<&str>,
    stream: &str,
    received: Option<&str>,
) -> PublishError {
    let mismatch = DomainMismatch {
        stream: stream.to_owned(),
        expected: expected.unwrap_or_default().to_owned(),
        received: received.map(str::to_owned),
    };
    PublishError::new(PublishErrorKind::Rejected, mismatch.to_string())
}

/// Why `domain` cannot be a JetStream domain (`[nats] domain`), or `None`: it is one subject
/// token of `$JS.<domain>.API`, so no dots, spaces or wildcards, and not empty.
pub fn domain_problem(domain: &str) -> Option<String> {
    let bad = domain.is_empty()
        || domain
            .chars()
            .any(|c| c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control());
    bad.then(|| {
        format!(
            "[nats] domain `{domain}` is not a JetStream domain name: it must be one subject token (no dots, spaces, `*` or `>`), the `domain` of the `jetstream {{ }}` block of the servers holding the stream; remove the key when the stream is in the JetStream of the server the relay connects to"
        )
    })
}

/// The JetStream API prefix for `domain`: `$JS.<domain>.API`, or `$JS.API` without one.
pub fn api_prefix(domain: Option<&str>) -> String {
    match domain {
        Some(domain) => format!("$JS.{domain}.API"),
        None => "$JS.API".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_acks_from_the_configured_domain_count() {
        assert!(check_ack_domain(None, "OUTBOX", None).is_ok());
        assert!(check_ack_domain(None, "OUTBOX", Some("leaf")).is_ok());
        assert!(check_ack_domain(Some("hub"), "OUTBOX", Some("hub")).is_ok());
        let other = check_ack_domain(Some("hub"), "OUTBOX", Some("leaf")).unwrap_err();
        assert_eq!(other.kind, PublishErrorKind::Rejected);
        for needle in ["`OUTBOX`", "`leaf`", "\"hub\"", "[nats] domain"] {
            assert!(
                other.message.contains(needle),
                "{needle}: {}",
                other.message
            );
        }
        for none in [None, Some("")] {
            let missing = check_ack_domain(Some("hub"), "OUTBOX", none).unwrap_err();
            assert_eq!(missing.kind, PublishErrorKind::Rejected);
            assert!(missing.message.contains("(none"), "{}", missing.message);
        }
        assert!(ack_domain_matches(Some("hub"), Some(b"hub")));
        assert!(!ack_domain_matches(Some("hub"), Some(b"hubx")));
        assert!(!ack_domain_matches(Some("hub"), None));
    }

    #[test]
    fn a_domain_is_one_token() {
        assert_eq!(domain_problem("hub"), None);
        assert_eq!(domain_problem("eu-west_1"), None);
        for bad in ["", "a.b", "a b", "*", "hub>", "a\tb"] {
            let problem = domain_problem(bad).expect(bad);
            assert!(problem.contains("[nats] domain"), "{problem}");
        }
        assert_eq!(api_prefix(Some("hub")), "$JS.hub.API");
        assert_eq!(api_prefix(None), "$JS.API");
    }
}
