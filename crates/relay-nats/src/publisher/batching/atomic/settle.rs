//! An atomic batch whose commit was sent (or could not be), until its outcome is known: the
//! members answered from the commit's ack, the batch published again whole while it is not
//! committed, or its messages one by one where it was refused whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::outcome::{CommitOutcome, Verdict, judge};
use super::{BatchIds, send_commit, send_member};
use crate::publisher::MessagePublisher;
use crate::publisher::chain::Link;
use crate::publisher::framing::{After, Reply, unknown};
use crate::publisher::message::Condition;

/// First wait before a batch is published again; doubled up to [`REPUBLISH_MAX_DELAY`].
const REPUBLISH_FIRST_DELAY: Duration = Duration::from_millis(100);
const REPUBLISH_MAX_DELAY: Duration = Duration::from_secs(5);

/// A batch whose commit was sent (or could not be), waiting for its outcome.
pub(super) struct Settling {
    /// Its place in the commit-order chain (none when it was refused before it was sent).
    pub(super) link: Option<Link>,
    /// The stream's last sequence its first message names, when it is conditional.
    pub(super) condition: Option<u64>,
    /// The event its first message names as its predecessor.
    pub(super) first_after: After,
    pub(super) per_message: MessagePublisher,
    pub(super) disabled: Arc<AtomicBool>,
    pub(super) ids: Arc<BatchIds>,
    pub(super) commit_lsn: Lsn,
    pub(super) part: u32,
    /// The id it was last published under.
    pub(super) id: String,
    pub(super) members: Vec<(Arc<OutboundMessage>, Reply)>,
}

impl Settling {
    /// Waits for the outcome of the commit `first` sent (or why it could not be sent) and
    /// settles the batch; `permit` counts it among the server's open batches until then.
    pub(super) async fn run(
        self,
        first: Result<BoxFuture<'static, CommitOutcome>, PublishError>,
        permit: OwnedSemaphorePermit,
    ) {
        match first {
            Ok(answer) => self.settle(answer.await).await,
            // Never sent: the pipeline re-sends its events in order.
            Err(failed) if failed.kind == PublishErrorKind::OutOfTurn => {
                self.conclude(Verdict::Refused(failed)).await;
            }
            Err(failed) => self.republish_whole(failed, Instant::now()).await,
        }
        // The server's limit counts open batches until they are committed or refused.
        drop(permit);
    }

    /// Hands each member its outcome from the commit's ack, publishing the batch again whole
    /// while it is not committed.
    async fn settle(self, outcome: CommitOutcome) {
        let since = Instant::now();
        match judge(&self.id, outcome, since) {
            Verdict::Again(error) => self.republish_whole(error, since).await,
            verdict => self.conclude(verdict).await,
        }
    }

    /// Publishes the batch again under a new id, with backoff, until its outcome is known;
    /// `since`: when it was first found not committed.
    async fn republish_whole(mut self, mut error: PublishError, since: Instant) {
        let mut delay = REPUBLISH_FIRST_DELAY;
        loop {
            if self.members.iter().all(|(_, reply)| reply.is_closed()) {
                // The session that waited for it ended; its transaction is read again.
                return;
            }
            tracing::warn!(
                batch = %self.id,
                error = %error,
                retry_in = ?delay,
                "atomic batch not committed or its outcome unknown; publishing the whole transaction again as a new batch"
            );
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(REPUBLISH_MAX_DELAY);
            self.id = self.ids.mint(self.commit_lsn, self.part);
            let outcome = self.publish_whole().await;
            match judge(&self.id, outcome, since) {
                Verdict::Again(again) => error = again,
                verdict => return self.conclude(verdict).await,
            }
        }
    }

    /// Sends every member under the current id, the last with the commit header, on the path
    /// the publisher takes now.
    async fn publish_whole(&self) -> CommitOutcome {
        let path = self.per_message.path(self.per_message.ack_timeout).await;
        let count = self.members.len();
        for (i, (msg, _)) in self.members.iter().enumerate().take(count - 1) {
            let condition = self.condition.filter(|_| i == 0);
            if let Err(e) =
                send_member(&self.per_message, &path, msg, &self.id, i + 1, condition).await
            {
                return CommitOutcome::Failed(e);
            }
        }
        let (last, _) = &self.members[count - 1];
        match send_commit(&self.per_message, &path, last, &self.id, count).await {
            Ok(answer) => answer.await,
            Err(e) => CommitOutcome::Failed(e),
        }
    }

    async fn conclude(self, verdict: Verdict) {
        let Self {
            per_message,
            disabled,
            id,
            members,
            mut link,
            first_after,
            ..
        } = self;
        let mut answered = |stored: Option<(u64, bool)>| {
            if let Some(link) = link.as_mut() {
                link.answered(stored);
            }
        };
        match verdict {
            Verdict::Committed { seq, size } => {
                answered(Some((seq, false)));
                let stored = size.unwrap_or(members.len() as u64);
                let first = seq.saturating_sub(stored.saturating_sub(1));
                for (i, (_, reply)) in members.into_iter().enumerate() {
                    let _ = reply.send(Ok(PubReceipt {
                        stream_seq: first + i as u64,
                        duplicate: false,
                    }));
                }
            }
            Verdict::StoredOneByOne { seq, duplicate } => {
                answered(Some((seq, duplicate)));
                // The last one is acknowledged, the others' outcomes are unknown.
                if !disabled.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        batch = %id,
                        "a NATS server acknowledged an atomic batch without its id: it ignores batch headers (before 2.12); publishing each message on its own from now on"
                    );
                }
                let last = members.len().saturating_sub(1);
                for (i, (_, reply)) in members.into_iter().enumerate() {
                    let outcome = if i == last {
                        Ok(PubReceipt {
                            stream_seq: seq,
                            duplicate,
                        })
                    } else {
                        Err(unknown(
                            "the server stored the batch's messages one by one: re-sending it alone",
                        ))
                    };
                    let _ = reply.send(outcome);
                }
            }
            Verdict::StoredBefore | Verdict::NoBatches => {
                if matches!(verdict, Verdict::NoBatches) && !disabled.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(batch = %id, "JetStream refuses atomic batches here; publishing each message on its own from now on");
                } else {
                    tracing::debug!(batch = %id, "batch refused whole, its ids stored before; publishing its messages one by one");
                }
                one_by_one(&per_message, members, first_after).await;
                answered(None);
            }
            Verdict::Refused(error) | Verdict::Again(error) => {
                answered(None);
                for (_, reply) in members {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Publishes the messages of a batch of which nothing was stored each on its own, in order,
/// each naming the one before it (the first, the batch's predecessor), where the stream's
/// deduplication answers for those it already holds (all of them after 10201: the batch that
/// stored them was atomic too). The batch is still in flight in the chain until the last is
/// answered. Where every condition names a sequence, they are answered as failed instead, and
/// the pipeline re-sends them in order through the chain.
async fn one_by_one(
    per_message: &MessagePublisher,
    members: Vec<(Arc<OutboundMessage>, Reply)>,
    first_after: After,
) {
    if per_message.by_sequence {
        for (_, reply) in members {
            let _ = reply.send(Err(unknown(
                "the batch was refused whole: its messages are re-sent one by one in order",
            )));
        }
        return;
    }
    let mut after = first_after;
    for (msg, reply) in members {
        let outcome = match per_message
            .send_now(&msg, Condition::event(after.as_deref()))
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        after = Some(Arc::from(msg.event_id.as_str()));
        let _ = reply.send(outcome);
    }
}
