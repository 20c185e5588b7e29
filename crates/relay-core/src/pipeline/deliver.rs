//! One message's delivery: publish, await the ack, re-publish with the same `Nats-Msg-Id`
//! while the outcome is unknown.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::PipelineStats;
use crate::frontier::EventTicket;
use crate::message::OutboundMessage;
use crate::stage::{PubReceipt, PublishError, PublishErrorKind, Publisher};

/// The outcome of one delivery: its ticket and receipt, or the message and the fatal error.
pub(super) type Delivery =
    Result<(EventTicket, PubReceipt), (EventTicket, Arc<OutboundMessage>, PublishError)>;

/// Retry settings a delivery carries.
#[derive(Debug, Clone, Copy)]
pub(super) struct RetryPolicy {
    pub(super) initial: Duration,
    pub(super) max: Duration,
    pub(super) no_stream_grace: Duration,
}

/// Publishes one message until it is acknowledged or refused for good.
pub(super) async fn deliver<P: Publisher>(
    publisher: Arc<P>,
    msg: Arc<OutboundMessage>,
    first: Result<P::Ack, PublishError>,
    ticket: EventTicket,
    policy: RetryPolicy,
    stats: Arc<PipelineStats>,
) -> Delivery {
    let started = Instant::now();
    let mut delay = policy.initial;
    let mut pending = first;
    loop {
        let result = match pending {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        let error = match result {
            Ok(receipt) => {
                stats.observe_ack(&msg, &receipt);
                return Ok((ticket, receipt));
            }
            Err(e) => e,
        };
        stats.count_publish_error(error.kind);
        let retry = match error.kind {
            PublishErrorKind::Unknown => true,
            PublishErrorKind::NoStream => started.elapsed() < policy.no_stream_grace,
            PublishErrorKind::Rejected | PublishErrorKind::Collision => false,
        };
        if !retry {
            return Err((ticket, msg, error));
        }
        tracing::warn!(
            event_id = %msg.event_id,
            subject = %msg.subject,
            error = %error,
            retry_in = ?delay,
            "publish outcome unknown; re-publishing with the same Nats-Msg-Id"
        );
        stats.publish_retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(policy.max);
        // Boxed: a publish future can be large, and inline it would size every delivery in the
        // window for this rare retry path.
        pending = Box::pin(publisher.send(&msg)).await;
    }
}
