//! The one batch framer of the two batch modes, `atomic-batch` (`atomic`) and `fast-batch`
//! (`fast`): one task per publisher reads the publisher's commands in call order, puts the
//! messages of the open transaction into batches and publishes everything else on its own
//! (re-sends, dead letters of earlier transactions, non-transactional messages, a transaction
//! of one message). What a batch is (how it is opened, what is held back, how it is committed
//! and answered) is the [`Mode`]'s; the loop, the commit-order chain and the way a message goes
//! on its own are shared.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use relay_core::Lsn;
use tokio::sync::mpsc;

use super::MessagePublisher;
use super::chain::Chain;
use super::framing::{Command, Framer, Handed, alone_in_chain, batchable, reply_when_acked};
use super::message::Condition;

pub(crate) mod atomic;
pub(crate) mod fast;

/// What the framing task keeps whatever its mode, lent to the mode's operations.
pub(crate) struct Shared {
    /// The commit-order chain: every batch and every message on its own takes its place in it.
    pub(crate) chain: Arc<Chain>,
    /// Publishes each message on its own, on the publisher's path.
    pub(crate) per_message: MessagePublisher,
    /// Commit LSN of the open transaction.
    pub(crate) current: Option<Lsn>,
    /// Messages of transactions committed at or before it go on their own
    /// ([`crate::JetStreamPublisher::alone_through`]).
    pub(crate) alone_through: Lsn,
    /// Set once the server showed it cannot take the mode's batches: everything goes on its
    /// own from then on.
    pub(crate) disabled: Arc<AtomicBool>,
}

/// The batches of a batch framing and what differs between them. Each operation that may leave a message to go on its
/// own (a batch of one, a message held for a batch that never started) returns it: the framer
/// sends it, the one way every message on its own goes.
pub(crate) enum Batches {
    /// Each transaction one atomic batch (in parts above the batch limit).
    Atomic(atomic::Atomic),
    /// Fast batches, open across transactions while more come.
    Fast(fast::Fast),
}

impl Batches {
    /// A transaction begins.
    fn begin(&mut self) {
        match self {
            Self::Atomic(atomic) => atomic.begin(),
            // A fast batch goes on into the next transaction.
            Self::Fast(_) => {}
        }
    }

    /// Adds a message of the open transaction to the batch.
    async fn add(&mut self, shared: &Shared, handed: Handed) -> Option<Handed> {
        match self {
            Self::Atomic(atomic) => atomic.add(shared, handed).await,
            Self::Fast(fast) => fast.add(shared, handed).await,
        }
    }

    /// Commits the open batch, sending what is held back.
    async fn close(&mut self, shared: &Shared) -> Option<Handed> {
        match self {
            Self::Atomic(atomic) => atomic.commit(shared).await,
            Self::Fast(fast) => fast.finish().await,
        }
    }

    /// Whether the open batch is committed before a message goes on its own. A fast batch
    /// holds a transaction's first message back, and what came before goes first. An atomic
    /// batch only where every condition names a sequence, which the open batch's count would
    /// change; elsewhere the message goes beside the open batch, which the chain counts.
    fn closes_before_alone(&self, by_sequence: bool) -> bool {
        match self {
            Self::Atomic(_) => by_sequence,
            Self::Fast(_) => true,
        }
    }

    /// Whether a batch stays open across transactions while the pipeline keeps handing
    /// messages over.
    fn spans_transactions(&self) -> bool {
        matches!(self, Self::Fast(_))
    }

    fn is_open(&self) -> bool {
        match self {
            Self::Atomic(atomic) => atomic.is_open(),
            Self::Fast(fast) => fast.is_open(),
        }
    }
}

/// Starts the framing task of `framing` (a batch framing, with `batches` the state of its batches) over
/// `per_message` and returns the handle the publisher keeps.
pub(crate) fn start(
    per_message: MessagePublisher,
    framing: super::Framing,
    batches: Batches,
) -> Framer {
    let (framer, receiver) = Framer::new(framing);
    let chain = Arc::new(Chain::default());
    let worker = BatchFramer {
        shared: Shared {
            chain: chain.clone(),
            per_message,
            current: None,
            alone_through: Lsn(0),
            disabled: Arc::new(AtomicBool::new(false)),
        },
        batches,
    };
    tokio::spawn(worker.run(receiver));
    framer.with_chain(chain)
}

struct BatchFramer {
    shared: Shared,
    batches: Batches,
}

impl BatchFramer {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut next = None;
        loop {
            let command = match next.take() {
                Some(command) => command,
                None => match commands.recv().await {
                    Some(command) => command,
                    None => break,
                },
            };
            match command {
                Command::Begin(lsn) => {
                    self.batches.begin();
                    self.shared.current = Some(lsn);
                }
                Command::Send(handed) => {
                    let shared = &self.shared;
                    if batchable(
                        &handed.0,
                        shared.current,
                        shared.alone_through,
                        &shared.disabled,
                    ) {
                        if let Some(alone) = self.batches.add(&self.shared, handed).await {
                            self.send_alone(alone, false).await;
                        }
                    } else {
                        self.alone(handed, false).await;
                    }
                }
                // Only on a stream where every condition names a sequence (elsewhere re-sends
                // go around this task): the re-send joins the chain in call order.
                Command::Resend(handed) => self.alone(handed, true).await,
                // What a fault left held back goes now; the transaction goes on in the next
                // batch.
                Command::Hold => self.close().await,
                Command::AloneThrough(lsn) => self.shared.alone_through = lsn,
                Command::End => {
                    self.shared.current = None;
                    if self.batches.spans_transactions() {
                        if !commands.is_empty() {
                            // More waiting (catch-up): the batch goes on into the next
                            // transaction.
                            continue;
                        }
                        // In catch-up the next transaction follows within microseconds: a new
                        // batch per transaction would cost a round trip and slow flow acks.
                        if self.batches.is_open()
                            && let Ok(Some(command)) =
                                tokio::time::timeout(fast::LINGER, commands.recv()).await
                        {
                            next = Some(command);
                            continue;
                        }
                    }
                    self.close().await;
                }
            }
        }
    }

    /// Commits the open batch; what it leaves goes on its own.
    async fn close(&mut self) {
        if let Some(alone) = self.batches.close(&self.shared).await {
            self.send_alone(alone, false).await;
        }
    }

    /// Publishes a message on its own, after the open batch where the mode commits that first.
    async fn alone(&mut self, handed: Handed, resend: bool) {
        if self
            .batches
            .closes_before_alone(self.shared.per_message.by_sequence)
        {
            self.close().await;
        }
        self.send_alone(handed, resend).await;
    }

    /// Publishes a message on its own, on its condition, counted in the chain; its ack goes to
    /// its reply. `resend`: the pipeline's re-send.
    ///
    /// It may wait up to `ack_timeout` for a lost connection: this task is not the pipeline's
    /// loop, so the wait holds up no ack, and its batches wait for the connection just as long
    /// when they open. Failing at once instead (as the pipeline's own send does) would leave a
    /// 1-row transaction failed while the batch after it waits, goes out and is refused out
    /// of turn behind it: more re-sends for the same connection loss, never fewer.
    async fn send_alone(&self, (msg, after, reply): Handed, resend: bool) {
        let Shared {
            chain, per_message, ..
        } = &self.shared;
        if per_message.by_sequence {
            let wait = per_message.ack_timeout;
            alone_in_chain(per_message, chain, (msg, after, reply), resend, wait).await;
            return;
        }
        let link = chain.alone(resend);
        let sent = per_message
            .send_alone(&msg, Condition::event(after.as_deref()))
            .await;
        reply_when_acked(sent.map(|ack| link.follow(ack)), reply);
    }
}
