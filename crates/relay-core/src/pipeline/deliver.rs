//! One message's delivery: publish, await the ack, re-publish with the same `Nats-Msg-Id`
//! while the outcome is unknown.
//!
//! An unknown outcome is retried for as long as it takes: a broker outage makes the relay
//! wait, never skip. The one exception is a message the server answers by closing the
//! connection: when the server closed it right after a protocol error about what the client
//! sent (`PublishError::closed_by_server`; the publisher tells this apart from an outage by
//! the server's `-ERR`, and re-sends such a message alone), `Publisher::max_server_closes`
//! times in a row for the same message, the message is the cause and it is refused for good.
//! Any other outcome in between (a timeout, a plain connection loss, no responders) starts the
//! count again, so an outage in the middle never adds up to a refusal.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::PipelineStats;
use crate::frontier::EventTicket;
use crate::message::OutboundMessage;
use crate::stage::{PubReceipt, PublishError, PublishErrorKind, Publisher};

/// The outcome of one delivery: its ticket, receipt and message, or the message and the fatal
/// error.
pub(super) type Delivery = Result<
    (EventTicket, PubReceipt, Arc<OutboundMessage>),
    (EventTicket, Arc<OutboundMessage>, PublishError),
>;

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
    // Attempts in a row that ended with the server closing the connection over this message.
    let mut closes = 0u32;
    loop {
        let result = match pending {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        let error = match result {
            Ok(receipt) => {
                stats.observe_ack(&msg, &receipt);
                return Ok((ticket, receipt, msg));
            }
            Err(e) => e,
        };
        stats.count_publish_error(error.kind);
        closes = if error.closed_by_server {
            closes + 1
        } else {
            0
        };
        if error.closed_by_server && closes >= publisher.max_server_closes().max(1) {
            return Err((ticket, msg, refused_after_closes(closes, &error)));
        }
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
        pending = Box::pin(publisher.resend(&msg)).await;
    }
}

/// The fatal error for a message the server closed the connection on `closes` times in a row.
fn refused_after_closes(closes: u32, last: &PublishError) -> PublishError {
    PublishError::new(
        PublishErrorKind::Rejected,
        format!(
            "NATS closed the connection {closes} times in a row right after this message was sent ({last}): the server refuses it, so re-sending cannot help. Check the server's limits (max_control_line, max_payload, account limits) against [nats] max_control_line"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use bytes::Bytes;
    use futures::future::BoxFuture;
    use pgoutput::Lsn;

    use super::*;
    use crate::frontier::AckFrontier;

    /// Answers each send with the next scripted outcome; acknowledges once the script is done.
    #[derive(Clone)]
    struct Scripted {
        outcomes: Arc<Mutex<VecDeque<PublishError>>>,
        sends: Arc<Mutex<u32>>,
        limit: u32,
    }

    impl Scripted {
        fn new(limit: u32, outcomes: Vec<PublishError>) -> Self {
            Self {
                outcomes: Arc::new(Mutex::new(outcomes.into())),
                sends: Arc::default(),
                limit,
            }
        }

        fn sends(&self) -> u32 {
            *self.sends.lock().expect("sends")
        }
    }

    impl Publisher for Scripted {
        type Ack = BoxFuture<'static, Result<PubReceipt, PublishError>>;

        async fn send(&self, _: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
            *self.sends.lock().expect("sends") += 1;
            let next = self.outcomes.lock().expect("outcomes").pop_front();
            Ok(Box::pin(async move {
                match next {
                    Some(error) => Err(error),
                    None => Ok(PubReceipt {
                        stream_seq: 1,
                        duplicate: false,
                    }),
                }
            }))
        }

        fn max_server_closes(&self) -> u32 {
            self.limit
        }

        fn begin_transaction(&self, _commit_lsn: Lsn) {}

        fn end_transaction(&self) {}

        async fn resend(&self, msg: &Arc<OutboundMessage>) -> Result<Self::Ack, PublishError> {
            self.send(msg).await
        }
    }

    fn closed() -> PublishError {
        PublishError::closed_by_server("-ERR 'maximum control line exceeded'")
    }

    fn timeout() -> PublishError {
        PublishError::new(PublishErrorKind::Unknown, "timed out")
    }

    async fn run(publisher: &Scripted) -> Delivery {
        let msg = Arc::new(OutboundMessage::bare(
            "outbox.a",
            "ev-1",
            Bytes::new(),
            Lsn(1),
        ));
        let mut frontier = AckFrontier::new(Lsn(0));
        frontier.begin().expect("begin");
        let ticket = frontier.event().expect("ticket");
        let first = publisher.send(&msg).await;
        let policy = RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            no_stream_grace: Duration::from_secs(30),
        };
        deliver(
            Arc::new(publisher.clone()),
            msg,
            first,
            ticket,
            policy,
            Arc::default(),
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_the_server_closes_the_connection_on_every_time_is_refused() {
        let publisher = Scripted::new(5, vec![closed(); 10]);
        let Err((_, _, error)) = run(&publisher).await else {
            panic!("refused");
        };
        assert_eq!(error.kind, PublishErrorKind::Rejected);
        assert!(error.message.contains("5 times in a row"), "{error}");
        assert!(error.message.contains("maximum control line"), "{error}");
        assert_eq!(
            publisher.sends(),
            5,
            "refused on the fifth close, not re-sent again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn any_other_outcome_in_between_starts_the_count_again() {
        // An outage (timeouts) between closes: never five closes in a row, so it is delivered.
        let mut script = Vec::new();
        for _ in 0..4 {
            script.extend([closed(), closed(), closed(), closed(), timeout()]);
        }
        let publisher = Scripted::new(5, script);
        assert!(run(&publisher).await.is_ok(), "delivered after the outage");
        assert_eq!(publisher.sends(), 21);
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_waited_out_however_long_it_lasts() {
        // Plain connection losses and timeouts are never counted, with any limit.
        let publisher = Scripted::new(1, vec![timeout(); 200]);
        assert!(run(&publisher).await.is_ok());
        assert_eq!(publisher.sends(), 201);
        // A publisher that cannot tell closes apart keeps the default: retry forever.
        let publisher = Scripted::new(u32::MAX, vec![closed(); 50]);
        assert!(run(&publisher).await.is_ok());
    }
}
