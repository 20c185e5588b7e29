//! Publishing one message on the lean path ([`crate::wire`]): the same outcomes, server-close
//! and quarantine handling, permission errors and duplicate check as through async-nats.

use std::sync::Arc;

use futures::future::BoxFuture;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PubReceipt, PublishError};

use relay_core::message::{HEADER_EXPECTED_LAST_MSG_ID, HEADER_EXPECTED_LAST_SEQUENCE};

use super::MessagePublisher;
use super::message::{Condition, verify_duplicate};
use crate::wire::LeanConnection;

impl MessagePublisher {
    /// [`Self::publish`] on the lean connection: the same outcomes, server-close and
    /// quarantine handling, permission errors and duplicate check as through async-nats.
    #[inline]
    pub(super) fn publish_lean(
        &self,
        lean: &LeanConnection,
        msg: &Arc<OutboundMessage>,
        condition: Option<Condition<'_>>,
        probe: Option<tokio::sync::OwnedMutexGuard<()>>,
    ) -> Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError> {
        // No allocation for the common condition (an event id): the sequence's digits only.
        let digits;
        let line = match condition {
            None => None,
            Some(Condition::AfterEvent(id)) => Some((HEADER_EXPECTED_LAST_MSG_ID, id)),
            Some(Condition::AfterSequence(seq)) => {
                digits = seq.to_string();
                Some((HEADER_EXPECTED_LAST_SEQUENCE, digits.as_str()))
            }
        };
        let outcome = lean
            .publish_if(&self.stream, msg, line)
            .map_err(crate::wire::publish_error)?;
        let check = self.duplicate_check();
        let quarantine = self.quarantine.clone();
        let msg = msg.clone();
        Ok(Box::pin(async move {
            // The connection resolves every outstanding publish when it goes, so a dropped
            // sender only means the publisher itself is gone.
            let outcome = outcome
                .await
                .unwrap_or_else(|_| Err(crate::wire::connection_closed()))
                .map_err(crate::wire::publish_error);
            let closed = matches!(&outcome, Err(e) if e.closed_by_server);
            quarantine.outcome(&msg.event_id, closed);
            drop(probe);
            let stored = outcome?;
            if stored.duplicate {
                // Boxed, as on the async-nats path: keeps every outstanding ack small.
                Box::pin(verify_duplicate(&check, stored.seq, &msg)).await?;
            }
            Ok(PubReceipt {
                stream_seq: stored.seq,
                duplicate: stored.duplicate,
            })
        }))
    }
}
