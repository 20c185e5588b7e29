//! Per-message mode on a stream where every condition names a sequence (a replicated stream of
//! nats-server 2.14 or later, see [`crate::StreamReport::order_by_sequence`]): nats-server
//! checks `Nats-Expected-Last-Msg-Id` there only when a replica applies the message, and a
//! refused one fails the stream on every replica ("last msgid mismatch", no leader, again at
//! each restart), while `Nats-Expected-Last-Sequence` is refused cleanly before it is
//! proposed.
//!
//! One task publishes every message and every re-send in the order the pipeline called: each
//! takes its place in the commit-order chain (`chain`) before it goes, and a message whose
//! predecessor is unsettled names the stream's last sequence the chain predicts for it. The
//! chain may have to wait for what is in flight to learn that sequence, which the pipeline's
//! loop must never do (it polls the acks that end the wait).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::Framing;
use super::MessagePublisher;
use super::chain::Chain;
use super::framing::{Command, Framer, alone_in_chain};

/// Starts the task over `per_message` and returns the handle the publisher keeps.
pub(crate) fn start(per_message: MessagePublisher) -> Framer {
    let (framer, commands) = Framer::new(Framing::BySequence);
    let chain = Arc::new(Chain::default());
    tokio::spawn(run(per_message, chain.clone(), commands));
    framer.with_chain(chain)
}

async fn run(
    per_message: MessagePublisher,
    chain: Arc<Chain>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    while let Some(command) = commands.recv().await {
        match command {
            // Transactions do not change how a message goes on its own.
            Command::Begin(_) | Command::End | Command::Hold | Command::AloneThrough(_) => {}
            // Never waits for a lost connection, as per-message mode's send: a delivery whose
            // outcome is unknown re-sends, and its re-send waits up to `ack_timeout`.
            Command::Send(handed) => {
                alone_in_chain(&per_message, &chain, handed, false, Duration::ZERO).await;
            }
            Command::Resend(handed) => {
                let wait = per_message.ack_timeout;
                alone_in_chain(&per_message, &chain, handed, true, wait).await;
            }
        }
    }
}
