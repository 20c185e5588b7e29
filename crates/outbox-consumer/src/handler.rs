//! The user's [`Handler`] and its error types.

use futures::future::BoxFuture;
use tokio_postgres::Transaction;

use crate::event::Event;

/// Boxed error a [`Handler`] returns. `anyhow::Error`, `tokio_postgres::Error`,
/// `serde_json::Error` and `String` all convert into it with `?` / `.into()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The user's code: applies one event inside the open transaction.
///
/// The transaction already holds this event's ledger row; the library commits it after the
/// handler returns `Ok`, and rolls it back on `Err` (the event is then retried, see
/// [`ConsumerBuilder::max_deliver`](crate::ConsumerBuilder::max_deliver)). Do all business writes through `tx`: writes through
/// any other connection are not covered by the exactly-once guarantee.
///
/// Implement it for a struct, or wrap a closure with [`handler_fn`].
pub trait Handler: Send + Sync + 'static {
    /// Applies `event` in `tx`.
    fn handle<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<(), BoxError>>;
}

impl<F> Handler for F
where
    F: for<'a> Fn(&'a Transaction<'a>, &'a Event) -> BoxFuture<'a, Result<(), BoxError>>
        + Send
        + Sync
        + 'static,
{
    fn handle<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        self(tx, event)
    }
}

/// Pins down a closure's signature so it can be used as a [`Handler`]:
///
/// ```no_run
/// use futures::FutureExt as _;
/// let handler = outbox_consumer::handler_fn(|tx, event| {
///     async move {
///         tx.execute("INSERT INTO seen (id) VALUES ($1)", &[&event.id]).await?;
///         Ok(())
///     }
///     .boxed()
/// });
/// ```
pub fn handler_fn<F>(f: F) -> F
where
    F: for<'a> Fn(&'a Transaction<'a>, &'a Event) -> BoxFuture<'a, Result<(), BoxError>>
        + Send
        + Sync
        + 'static,
{
    f
}

/// A handler error that retrying cannot fix (for example a payload that does not decode):
/// the message is parked on the dead-letter subject at once instead of after
/// [`ConsumerBuilder::max_deliver`](crate::ConsumerBuilder::max_deliver) deliveries.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Permanent(pub BoxError);

impl Permanent {
    /// Wraps `err` as permanent.
    pub fn new(err: impl Into<BoxError>) -> Self {
        Self(err.into())
    }
}
