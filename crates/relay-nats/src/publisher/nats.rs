//! Publishing one message through async-nats: the same outcomes, server-close and quarantine
//! handling, permission errors and duplicate check as on the lean path (`lean.rs`).

use std::sync::Arc;

use async_nats::jetstream::context::PublishErrorKind as NatsKind;
use async_nats::jetstream::message::PublishMessage;
use futures::future::BoxFuture;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind};

use super::MessagePublisher;
use super::message::{Condition, classify, verify_duplicate};
use super::path::AsyncNats;
use crate::closes;

impl MessagePublisher {
    /// [`Self::publish`] through async-nats: the outcome as async-nats reports it, a server
    /// close while the ack is pending, a refused publish, and the duplicate check.
    pub(super) async fn publish_nats(
        &self,
        nats: &AsyncNats,
        msg: &Arc<OutboundMessage>,
        condition: Option<Condition<'_>>,
        probe: Option<tokio::sync::OwnedMutexGuard<()>>,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        // Before sending: a server close from now on may be this message's doing.
        let state = self.jetstream.state();
        let mut closes = state.closes.subscribe();
        let condition = condition.map(Condition::header);
        let extra: &[(&str, &str)] = match &condition {
            Some((name, value)) => &[(name, value.as_ref())],
            None => &[],
        };
        let headers = nats.headers(&self.stream, msg, extra);
        let publish = PublishMessage::build()
            .headers(headers)
            .payload(msg.payload.clone());
        let ack = nats
            .context
            .send_publish(msg.subject.clone(), publish)
            .await
            .map_err(classify)?;
        // For the rare duplicate ack and permission errors: reference counts, no copies.
        let check = self.duplicate_check();
        let stream = self.stream.clone();
        let quarantine = self.quarantine.clone();
        let state = state.clone();
        let domain = self.domain.clone();
        let msg = msg.clone();
        Ok(Box::pin(async move {
            let subject = &msg.subject;
            // The server closed the connection over a protocol error while the ack was
            // pending: no ack will come on it. Say so now rather than after the ack timeout.
            let ack = tokio::select! {
                biased;
                ack = ack => ack,
                reason = closes::next_close(&mut closes) => {
                    quarantine.outcome(&msg.event_id, true);
                    return Err(PublishError::closed_by_server(format!(
                        "NATS closed the connection after this message was sent: -ERR '{reason}'"
                    )));
                }
            };
            quarantine.outcome(&msg.event_id, false);
            drop(probe);
            let ack = ack.map_err(|e| {
                let timed_out = e.kind() == NatsKind::TimedOut;
                let error = classify(e);
                match state.publish_denied(subject) {
                    // The server refused the publish itself: no PubAck will ever come.
                    Some(denied) if timed_out => PublishError::new(
                        PublishErrorKind::Rejected,
                        format!(
                            "NATS refused to let the relay publish to `{subject}` ({denied}): grant the relay's NATS user publish permission on the outbox subjects"
                        ),
                    ),
                    _ => error,
                }
            })?;
            if ack.stream != *stream {
                return Err(crate::wire::other_stream(&stream, &ack.stream));
            }
            crate::domain::check_ack_domain(domain.as_deref(), &ack.stream, Some(&ack.domain))?;
            if ack.duplicate {
                // Boxed: the lookup's future is kilobytes, and inline it would make every
                // outstanding ack that large, duplicate or not.
                Box::pin(verify_duplicate(&check, ack.sequence, &msg)).await?;
            }
            Ok(PubReceipt {
                stream_seq: ack.sequence,
                duplicate: ack.duplicate,
            })
        }))
    }
}
