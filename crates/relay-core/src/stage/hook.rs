//! Watching a publisher without wrapping it: tracing and `restore`'s check of duplicate answers
//! see every message the publisher hands to the broker, and its outcome, through a hook the
//! publisher calls. A wrapper would have to hand on every other call of [`super::Publisher`]
//! (a missed `begin_transaction` once made `restore` publish atomic-batch windows per message).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::message::OutboundMessage;

use super::{PubReceipt, PublishError};

/// What a hook awaits before an outcome goes on: a look at the broker, or nothing.
pub type Settling<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Sees each message a publisher hands to the broker (first sends and re-sends alike).
pub trait PublishHook: Send + Sync + fmt::Debug {
    /// `msg` is about to be handed over. What it returns follows this one attempt to its
    /// outcome; `None` when the hook has nothing to follow for `msg` (no allocation then).
    fn handing(&self, msg: &Arc<OutboundMessage>) -> Option<Box<dyn AckWatch>>;
}

/// Follows one attempt to publish a message.
pub trait AckWatch: Send {
    /// The message went out; its answer is awaited.
    fn sent(&mut self) {}

    /// The attempt's outcome: the broker's answer, or the error that ended it. The outcome goes
    /// on to the pipeline once what this returns is done (so a hook may read the broker first).
    fn settled<'a>(self: Box<Self>, outcome: &'a Result<PubReceipt, PublishError>) -> Settling<'a>;
}

/// The hooks a publisher calls, in the order they were added. Empty: nothing is called and
/// nothing allocated.
#[derive(Debug, Clone, Default)]
pub struct PublishHooks(Arc<[Arc<dyn PublishHook>]>);

impl PublishHooks {
    /// These hooks and `hook` after them.
    #[must_use]
    pub fn with(&self, hook: Arc<dyn PublishHook>) -> Self {
        Self(self.0.iter().cloned().chain([hook]).collect())
    }

    /// Whether no hook is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What follows one attempt to hand `msg` over.
    pub fn handing(&self, msg: &Arc<OutboundMessage>) -> Watches {
        Watches(self.0.iter().filter_map(|hook| hook.handing(msg)).collect())
    }
}

/// The watches of one attempt.
#[must_use]
pub struct Watches(Vec<Box<dyn AckWatch>>);

impl fmt::Debug for Watches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watches")
            .field("len", &self.0.len())
            .finish()
    }
}

impl Watches {
    /// Whether nothing follows the attempt.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The message went out.
    pub fn sent(&mut self) {
        for watch in &mut self.0 {
            watch.sent();
        }
    }

    /// Tells every watch the outcome, one after the other.
    pub async fn settled(self, outcome: &Result<PubReceipt, PublishError>) {
        for watch in self.0 {
            watch.settled(outcome).await;
        }
    }
}
