//! What the framing tasks (the batch framer of the two batch modes, `batching`, and the
//! sequence chain of per-message mode, `sequenced`) share: the handle the publisher keeps,
//! whose commands reach one framing task in the order the pipeline called, and the way a
//! framing task publishes a message on its own where every condition names a sequence.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PubReceipt, PublishError, PublishErrorKind};
use tokio::sync::{mpsc, oneshot};

use super::Framing;

/// One answer on a batch's reply subject: a fast batch's flow ack, gap or error (`type`), or
/// the PubAck that ends a batch of either mode (no `type`; `batch` and `count` name the batch
/// it stored).
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct BatchAnswer {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) stream: Option<String>,
    /// The JetStream domain of the stream that stored it (`[nats] domain` checks it).
    pub(crate) domain: Option<String>,
    pub(crate) seq: Option<u64>,
    pub(crate) count: Option<u64>,
    pub(crate) batch: Option<String>,
    #[serde(default)]
    pub(crate) duplicate: bool,
    pub(crate) error: Option<crate::error_codes::ApiError>,
}

/// Where a framing task sends a message's outcome.
pub(crate) type Reply = oneshot::Sender<Result<PubReceipt, PublishError>>;

/// The event id a message names as its predecessor (`Nats-Expected-Last-Msg-Id`), while that
/// one is not known stored: see [`relay_core::stage::Publisher::send`].
pub(crate) type After = Option<Arc<str>>;

/// A message handed to a framing task: the message, its predecessor and where its outcome goes.
pub(crate) type Handed = (Arc<OutboundMessage>, After, Reply);

/// What the publisher tells the framing task, in call order.
pub(crate) enum Command {
    /// A transaction with this commit LSN begins.
    Begin(Lsn),
    Send(Handed),
    /// The pipeline's re-send of a message that failed (see
    /// [`relay_core::stage::Publisher::resend`]), on a stream where every condition names a
    /// sequence: it joins the chain in call order.
    Resend(Handed),
    /// The open transaction ended.
    End,
    /// The pipeline sends nothing new for now: send what is held back (see
    /// [`relay_core::stage::Publisher::hold`]).
    Hold,
    /// Messages of transactions committed at or before this LSN go on their own (see
    /// [`crate::JetStreamPublisher::alone_through`]).
    AloneThrough(Lsn),
}

/// The handle the publisher keeps: commands go to the framing task in call order.
#[derive(Debug)]
pub(crate) struct Framer {
    /// The framing this task carries out.
    framing: Framing,
    commands: mpsc::UnboundedSender<Command>,
    /// The atomic-batch mode's commit-order chain, which the pipeline's re-sends join.
    chain: Option<Arc<super::chain::Chain>>,
}

impl Framer {
    /// A handle for a task carrying out `framing`, and the receiver that task reads.
    pub(crate) fn new(framing: Framing) -> (Self, mpsc::UnboundedReceiver<Command>) {
        let (commands, receiver) = mpsc::unbounded_channel();
        (
            Self {
                framing,
                commands,
                chain: None,
            },
            receiver,
        )
    }

    /// This handle, with the chain its framing task keeps.
    pub(crate) fn with_chain(mut self, chain: Arc<super::chain::Chain>) -> Self {
        self.chain = Some(chain);
        self
    }

    /// The commit-order chain a message sent around the framing task must join.
    pub(crate) fn chain(&self) -> Option<&Arc<super::chain::Chain>> {
        self.chain.as_ref()
    }

    pub(crate) fn begin(&self, commit_lsn: Lsn) {
        let _ = self.commands.send(Command::Begin(commit_lsn));
    }

    pub(crate) fn end(&self) {
        let _ = self.commands.send(Command::End);
    }

    pub(crate) fn hold(&self) {
        let _ = self.commands.send(Command::Hold);
    }

    pub(crate) fn alone_through(&self, lsn: Lsn) {
        let _ = self.commands.send(Command::AloneThrough(lsn));
    }

    /// Hands `msg` (with its predecessor while that one is unsettled) to the framing task; the
    /// future resolves with its ack.
    pub(crate) fn send(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> BoxFuture<'static, Result<PubReceipt, PublishError>> {
        self.hand_over(msg, after, Command::Send)
    }

    /// Hands the pipeline's re-send of `msg` to the framing task (see [`Command::Resend`]).
    pub(crate) fn resend(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
    ) -> BoxFuture<'static, Result<PubReceipt, PublishError>> {
        self.hand_over(msg, after, Command::Resend)
    }

    fn hand_over(
        &self,
        msg: &Arc<OutboundMessage>,
        after: Option<&str>,
        command: fn(Handed) -> Command,
    ) -> BoxFuture<'static, Result<PubReceipt, PublishError>> {
        let (reply, outcome) = oneshot::channel();
        let sent = self
            .commands
            .send(command((msg.clone(), after.map(Arc::from), reply)));
        let what = self.framing.unit();
        Box::pin(async move {
            if sent.is_err() {
                return Err(unknown(&format!("the {what} publisher stopped")));
            }
            outcome.await.unwrap_or_else(|_| {
                Err(unknown(&format!(
                    "its {what} was abandoned before it ended"
                )))
            })
        })
    }
}

/// An outcome the server never gave: the pipeline re-sends (deduplicated by `Nats-Msg-Id`).
pub(crate) fn unknown(why: &str) -> PublishError {
    PublishError::new(PublishErrorKind::Unknown, why.to_owned())
}

/// Hands the outcome of a publish on its own (`sent`: handed to the connection, or not) to
/// `reply`, without holding up the framing task while the ack is on its way.
pub(crate) fn reply_when_acked(
    sent: Result<BoxFuture<'static, Result<PubReceipt, PublishError>>, PublishError>,
    reply: Reply,
) {
    match sent {
        Ok(ack) => {
            tokio::spawn(async move {
                let _ = reply.send(ack.await);
            });
        }
        Err(e) => {
            let _ = reply.send(Err(e));
        }
    }
}

/// Whether `msg` goes into a batch: it belongs to the open transaction (`current`, its commit
/// LSN), it committed after `alone_through`, and the server has not shown that it cannot take
/// batches (`disabled`). Re-sends, dead letters of earlier transactions, non-transactional
/// messages and what an earlier run may have published go on their own.
pub(crate) fn batchable(
    msg: &OutboundMessage,
    current: Option<Lsn>,
    alone_through: Lsn,
    disabled: &AtomicBool,
) -> bool {
    !disabled.load(Ordering::Relaxed)
        && current == Some(msg.commit_lsn)
        && msg.commit_lsn > alone_through
}

/// Publishes `msg` on its own on a stream where every condition names a sequence (see
/// `chain`): it takes its place in `chain`, and when its predecessor is unsettled (`after`) it
/// is stored only if the stream's last sequence is the one the chain predicts. Refused unsent
/// (out of turn) when nothing tells that sequence; its ack goes to `reply`. `resend`: the
/// pipeline's re-send. `wait`: how long it may wait for a lost connection.
pub(crate) async fn alone_in_chain(
    per_message: &super::MessagePublisher,
    chain: &Arc<super::chain::Chain>,
    (msg, after, reply): Handed,
    resend: bool,
    wait: Duration,
) {
    let link = match chain.message(after.is_some(), resend).await {
        Ok(link) => link,
        Err(super::chain::NoBase) => {
            let _ = reply.send(Err(PublishError::new(
                PublishErrorKind::OutOfTurn,
                "the event before this one is not known stored and the stream's last sequence is unknown: re-sent in order".to_owned(),
            )));
            return;
        }
    };
    let condition = link.base.map(super::message::Condition::AfterSequence);
    let sent = per_message.send_waiting(&msg, condition, wait).await;
    reply_when_acked(sent.map(|ack| link.follow(ack)), reply);
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn committed_at(lsn: u64) -> OutboundMessage {
        OutboundMessage {
            subject: "outbox.x".into(),
            event_id: "e".into(),
            headers: Vec::new(),
            shared_headers: 0,
            payload: Bytes::from_static(b"{}"),
            table: "public.outbox".into(),
            commit_lsn: Lsn(lsn),
            commit_time_micros: 0,
        }
    }

    #[test]
    fn what_an_earlier_run_may_have_published_is_never_batched() {
        let enabled = AtomicBool::new(false);
        let msg = committed_at(100);
        assert!(batchable(&msg, Some(Lsn(100)), Lsn(0), &enabled));
        assert!(batchable(&msg, Some(Lsn(100)), Lsn(99), &enabled));
        assert!(
            !batchable(&msg, Some(Lsn(100)), Lsn(100), &enabled),
            "at the bound"
        );
        assert!(
            !batchable(&msg, Some(Lsn(100)), Lsn(500), &enabled),
            "below the bound"
        );
        assert!(
            !batchable(&msg, Some(Lsn(90)), Lsn(0), &enabled),
            "another transaction's"
        );
        assert!(
            !batchable(&msg, Some(Lsn(100)), Lsn(0), &AtomicBool::new(true)),
            "disabled"
        );
    }
}
