//! The example service's logic: on `order-created`, notify the purchaser and the supplier.
//!
//! Shared by `main.rs` and the crate's tests (`tests/example_service.rs`).

use futures::FutureExt as _;
use futures::future::BoxFuture;
use outbox_consumer::{BoxError, Event, Handler, Permanent};
use serde::Deserialize;
use tokio_postgres::Transaction;

/// The service's own table, created next to the ledger.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS notifications (
    id             bigserial   PRIMARY KEY,
    event_id       text        NOT NULL,
    order_id       text        NOT NULL,
    recipient_role text        NOT NULL CHECK (recipient_role IN ('purchaser', 'supplier')),
    recipient_id   text        NOT NULL,
    message        text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
";

/// The `order-created` payload (the outbox row's JSON).
#[derive(Debug, Deserialize)]
pub struct OrderCreated {
    pub order_id: String,
    pub purchaser_id: String,
    pub supplier_id: String,
    #[serde(default)]
    pub total_cents: i64,
}

/// Writes one notification per party, in the consumer's transaction (so together with the
/// ledger row: both or neither).
#[derive(Debug, Default)]
pub struct NotifyOnOrderCreated;

impl Handler for NotifyOnOrderCreated {
    fn handle<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        event: &'a Event,
    ) -> BoxFuture<'a, Result<(), BoxError>> {
        async move {
            let event_type = event
                .event_type
                .as_deref()
                .or_else(|| event.subject.rsplit('.').next());
            if event_type != Some("order-created") {
                // Not ours; the ledger still records it as handled.
                return Ok(());
            }
            // A payload that does not decode will not decode on a retry either.
            let order: OrderCreated = event.json().map_err(Permanent::new)?;
            let stmt = tx
                .prepare(
                    "INSERT INTO notifications \
                     (event_id, order_id, recipient_role, recipient_id, message) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .await?;
            let amount = format!("{}.{:02}", order.total_cents / 100, order.total_cents % 100);
            let to_purchaser = format!("Thank you for order {} ({amount}).", order.order_id);
            let to_supplier = format!("New order {} to fulfil ({amount}).", order.order_id);
            for (role, who, text) in [
                ("purchaser", &order.purchaser_id, &to_purchaser),
                ("supplier", &order.supplier_id, &to_supplier),
            ] {
                tx.execute(&stmt, &[&event.id, &order.order_id, &role, who, text])
                    .await?;
            }
            Ok(())
        }
        .boxed()
    }
}
