//! Per-message processing: one worker's PostgreSQL connection, the contract check, the ledger
//! transaction, and the ack / NAK / park decision.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls, Statement};
use tracing::{debug, warn};

use crate::contracts::Verdict;
use crate::event::Event;
use crate::handler::{BoxError, Handler, Permanent};
use crate::ledger::{INSERT_SQL, REAPPLY_SQL};
use crate::shared::{Error, Inner, LedgerConnections, hooks};

/// One worker's PostgreSQL connection.
pub(crate) struct Slot {
    pub(crate) client: Option<Client>,
    insert: Option<Statement>,
    /// The re-apply ledger write ([`REAPPLY_SQL`]), prepared on first use.
    reapply: Option<Statement>,
    config: Option<tokio_postgres::Config>,
}

impl Slot {
    async fn connect(config: &tokio_postgres::Config) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                warn!(error = %e, "outbox-consumer: PostgreSQL connection ended");
            }
        });
        Ok(client)
    }

    /// The client, the prepared ledger insert and, when `reapply`, the re-apply write;
    /// reconnects if possible.
    async fn ready(
        &mut self,
        reapply: bool,
    ) -> Result<(&mut Client, Statement, Option<Statement>), SlotError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.insert = None;
            self.reapply = None;
            self.client = None;
            let Some(config) = &self.config else {
                return Err(SlotError::Fatal);
            };
            self.client = Some(Self::connect(config).await.map_err(SlotError::Retry)?);
        }
        let Some(client) = self.client.as_mut() else {
            return Err(SlotError::Fatal);
        };
        let stmt = match &self.insert {
            Some(s) => s.clone(),
            None => {
                let s = client.prepare(INSERT_SQL).await.map_err(SlotError::Retry)?;
                self.insert = Some(s.clone());
                s
            }
        };
        let reapply = match (&self.reapply, reapply) {
            (_, false) => None,
            (Some(s), true) => Some(s.clone()),
            (None, true) => {
                let s = client
                    .prepare(REAPPLY_SQL)
                    .await
                    .map_err(SlotError::Retry)?;
                self.reapply = Some(s.clone());
                Some(s)
            }
        };
        Ok((client, stmt, reapply))
    }
}

enum SlotError {
    /// No connection and nothing to reconnect with.
    Fatal,
    Retry(tokio_postgres::Error),
}

/// The result of one attempt at one message.
enum Attempt {
    Applied,
    Duplicate,
    HandlerFailed(BoxError),
    /// PostgreSQL trouble outside the handler: retry, never park.
    Infra(String),
}

pub(crate) async fn open_slots(pg: LedgerConnections, workers: usize) -> Result<Vec<Slot>, Error> {
    let slot = |client, config| Slot {
        client,
        insert: None,
        reapply: None,
        config,
    };
    Ok(match pg {
        LedgerConnections::Client(c) => vec![slot(Some(c), None)],
        LedgerConnections::Clients(cs) => cs.into_iter().map(|c| slot(Some(c), None)).collect(),
        LedgerConnections::Config(config) => {
            let mut v = Vec::with_capacity(workers);
            for _ in 0..workers {
                v.push(slot(
                    Some(Slot::connect(&config).await?),
                    Some(config.clone()),
                ));
            }
            v
        }
    })
}

/// A slot nobody uses; with at most `slots.len()` concurrent workers one is always free.
pub(crate) async fn lock_free_slot(slots: &[Mutex<Slot>]) -> tokio::sync::MutexGuard<'_, Slot> {
    for s in slots {
        if let Ok(guard) = s.try_lock() {
            return guard;
        }
    }
    // Unreachable in practice; waiting is still correct.
    slots[0].lock().await
}

impl Inner {
    /// Handles one message to the end: acked, NAKed or parked. `Err` only for fatal errors.
    // Long: one message to its end (contract, handler, commit, ack, NAK or park) with the retry
    // state of that one message
    pub(crate) async fn process<H: Handler>(
        &self,
        slot: &mut Slot,
        handler: &H,
        msg: jetstream::Message,
    ) -> Result<(), Error> {
        let event = match Event::from_message(&msg) {
            Ok(e) => e,
            Err(e) => {
                let delivered = msg
                    .info()
                    .map(|i| u64::try_from(i.delivered).unwrap_or(0))
                    .unwrap_or(0);
                self.park(&msg, None, delivered, &format!("invalid message: {e}"))
                    .await;
                return Ok(());
            }
        };

        if let Some(contracts) = &self.contracts {
            let checked =
                contracts.verdict(&self.jetstream, event.schema.as_deref(), &event.payload);
            match self.with_progress(&msg, checked).await {
                Verdict::Passed => self.stats.inc(|c| &c.contracts_passed),
                Verdict::NoContract => {}
                Verdict::Refused(refusal) => {
                    self.stats.inc(|c| &c.contracts_refused);
                    let reason = refusal.to_string();
                    self.park(&msg, Some(&event), event.delivered, &reason)
                        .await;
                    return Ok(());
                }
                Verdict::Unavailable(e) => {
                    self.retry_later(&msg, &event, &error_chain(&e), "cannot read the contract")
                        .await;
                    return Ok(());
                }
            }
        }

        let attempt = self
            .with_progress(&msg, self.attempt(slot, handler, &event))
            .await;
        let attempt = match attempt {
            Ok(a) => a,
            Err(()) => {
                return Err(Error::ConnectionLost);
            }
        };

        match attempt {
            Attempt::Applied | Attempt::Duplicate => {
                if matches!(attempt, Attempt::Applied) {
                    self.stats.inc(|c| &c.applied);
                    debug!(event_id = %event.id, seq = event.stream_sequence, "applied");
                } else {
                    self.stats.inc(|c| &c.duplicates);
                    debug!(event_id = %event.id, seq = event.stream_sequence, "duplicate skipped");
                }
                if let Some(hook) = &self.hook {
                    hook(hooks::Point::BeforeAck, &event).await;
                }
                if let Err(e) = msg.ack_with(AckKind::Ack).await {
                    // The ledger absorbs the redelivery.
                    warn!(event_id = %event.id, error = %e, "ack failed; will be redelivered");
                }
            }
            Attempt::HandlerFailed(err) => {
                let reason = error_chain(err.as_ref());
                let permanent = err.downcast_ref::<Permanent>().is_some();
                if permanent || event.delivered >= u64::from(self.max_deliver) {
                    let why = if permanent {
                        format!("permanent handler error: {reason}")
                    } else {
                        format!(
                            "handler failed {} times; last error: {reason}",
                            event.delivered
                        )
                    };
                    self.park(&msg, Some(&event), event.delivered, &why).await;
                } else {
                    self.stats.inc(|c| &c.retried);
                    let delay = self.backoff(event.delivered);
                    warn!(
                        service = %self.service,
                        event_id = %event.id,
                        delivered = event.delivered,
                        max_deliver = self.max_deliver,
                        retry_in = ?delay,
                        error = %reason,
                        "outbox-consumer: handler failed; will retry"
                    );
                    let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
                }
            }
            Attempt::Infra(reason) => {
                self.retry_later(
                    &msg,
                    &event,
                    &reason,
                    "PostgreSQL error outside the handler",
                )
                .await;
            }
        }
        Ok(())
    }

    /// Awaits `work`, sending progress acks meanwhile so the server does not redeliver the
    /// message while a slow handler (or contract fetch) runs.
    async fn with_progress<T>(&self, msg: &jetstream::Message, work: impl Future<Output = T>) -> T {
        tokio::pin!(work);
        let mut progress = tokio::time::interval(self.ack_wait / 3);
        progress.tick().await;
        loop {
            tokio::select! {
                res = &mut work => break res,
                _ = progress.tick() => {
                    let _ = msg.ack_with(AckKind::Progress).await;
                }
            }
        }
    }

    /// NAKs after a failure that is not the event's (`what`), with backoff; never parks.
    async fn retry_later(&self, msg: &jetstream::Message, event: &Event, reason: &str, what: &str) {
        self.stats.inc(|c| &c.infra_errors);
        let delay = self.backoff(event.delivered);
        warn!(
            service = %self.service,
            event_id = %event.id,
            retry_in = ?delay,
            error = %reason,
            "outbox-consumer: {what}; will retry"
        );
        let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
        // Do not spin on a server that is down.
        tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
    }

    /// BEGIN; ledger insert; handler; COMMIT. `Err(())` when the connection is gone for good.
    async fn attempt<H: Handler>(
        &self,
        slot: &mut Slot,
        handler: &H,
        event: &Event,
    ) -> Result<Attempt, ()> {
        let reapply = self.reapply.filter(|r| r.covers(event.commit_lsn));
        let (client, insert, reapply_stmt) = match slot.ready(reapply.is_some()).await {
            Ok(c) => c,
            Err(SlotError::Fatal) => return Err(()),
            Err(SlotError::Retry(e)) => return Ok(Attempt::Infra(error_chain(&e))),
        };
        let tx = match client.transaction().await {
            Ok(tx) => tx,
            Err(e) => return Ok(Attempt::Infra(error_chain(&e))),
        };
        let seq = i64::try_from(event.stream_sequence).unwrap_or(i64::MAX);
        let lsn = event.commit_lsn.map(|l| l.to_string());
        let row = (&self.service, &event.id, &event.subject, &seq, &lsn);
        let written = match (reapply, &reapply_stmt) {
            (Some(r), Some(stmt)) => tx
                .query_opt(
                    stmt,
                    &[row.0, row.1, row.2, row.3, row.4, &r.recorded_before],
                )
                .await
                .map(|found| found.map(|r| r.get::<_, bool>(0))),
            _ => tx
                .execute(&insert, &[row.0, row.1, row.2, row.3, row.4])
                .await
                .map(|n| (n > 0).then_some(false)),
        };
        let replaced = match written {
            Ok(Some(replaced)) => replaced,
            Ok(None) => {
                // Already applied: nothing to do; the transaction rolls back on drop.
                let _ = tx.rollback().await;
                return Ok(Attempt::Duplicate);
            }
            Err(e) => return Ok(Attempt::Infra(error_chain(&e))),
        };
        let reapplied;
        let event = if replaced {
            reapplied = Event {
                reapplied: true,
                ..event.clone()
            };
            debug!(event_id = %event.id, "re-applying an event the ledger recorded");
            &reapplied
        } else {
            event
        };
        if let Err(err) = handler.handle(&tx, event).await {
            let _ = tx.rollback().await;
            if client.is_closed() {
                // The handler failed because the database went away, not because of the event.
                return Ok(Attempt::Infra(error_chain(err.as_ref())));
            }
            return Ok(Attempt::HandlerFailed(err));
        }
        if let Some(hook) = &self.hook {
            hook(hooks::Point::BeforeCommit, event).await;
        }
        match tx.commit().await {
            Ok(()) => Ok(Attempt::Applied),
            // Unknown outcome if the connection broke during COMMIT: the redelivery finds the
            // ledger row if the commit happened, and applies the event if it did not.
            Err(e) => Ok(Attempt::Infra(error_chain(&e))),
        }
    }

    pub(crate) fn backoff(&self, delivered: u64) -> Duration {
        backoff_delay(self.backoff_initial, self.backoff_max, delivered)
    }
}

/// `initial * 2^(delivered - 1)`, at most `max`.
fn backoff_delay(initial: Duration, max: Duration, delivered: u64) -> Duration {
    let exp = u32::try_from(delivered.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(20);
    initial.saturating_mul(1u32 << exp).min(max)
}

/// `err: source: source ...`.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let next = e.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let (i, m) = (Duration::from_millis(100), Duration::from_secs(1));
        let d: Vec<u128> = [0, 1, 2, 3, 4, 5, 1000]
            .into_iter()
            .map(|n| backoff_delay(i, m, n).as_millis())
            .collect();
        assert_eq!(d, [100, 100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn error_chain_includes_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&e), "outer: inner");
    }
}
