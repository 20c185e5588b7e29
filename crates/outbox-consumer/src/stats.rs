//! Counters of what the consumer did.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

/// Counters of what the consumer did; cheap to clone, read with [`ConsumerStats::snapshot`].
#[derive(Debug, Clone, Default)]
pub struct ConsumerStats(Arc<Counters>);

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) applied: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) parked: AtomicU64,
    pub(crate) park_failures: AtomicU64,
    pub(crate) infra_errors: AtomicU64,
    pub(crate) contracts_passed: AtomicU64,
    pub(crate) contracts_refused: AtomicU64,
}

/// A snapshot of [`ConsumerStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Events whose handler ran and committed.
    pub applied: u64,
    /// Deliveries skipped because the ledger already had the event id.
    pub duplicates: u64,
    /// Handler failures answered with a delayed NAK.
    pub retried: u64,
    /// Messages published to the dead-letter subject and terminated.
    pub parked: u64,
    /// Attempts to park that failed (the message was NAKed and will be parked later).
    pub park_failures: u64,
    /// PostgreSQL / NATS failures outside the handler (the message was NAKed), reading a
    /// contract from its KV bucket included.
    pub infra_errors: u64,
    /// Deliveries whose payload satisfied the contract its `Outbox-Schema` header names
    /// ([`ConsumerBuilder::validate_contracts`](crate::ConsumerBuilder::validate_contracts)).
    pub contracts_passed: u64,
    /// Deliveries refused by their contract and parked instead of applied: a violation, a key
    /// the bucket does not hold, stored bytes that are not the key's version, or no
    /// `Outbox-Schema` header where one is required. A parked one is in `parked` too.
    pub contracts_refused: u64,
}

impl ConsumerStats {
    /// Current values.
    pub fn snapshot(&self) -> StatsSnapshot {
        let c = &self.0;
        let get = |a: &AtomicU64| a.load(AtomicOrdering::Relaxed);
        StatsSnapshot {
            applied: get(&c.applied),
            duplicates: get(&c.duplicates),
            retried: get(&c.retried),
            parked: get(&c.parked),
            park_failures: get(&c.park_failures),
            infra_errors: get(&c.infra_errors),
            contracts_passed: get(&c.contracts_passed),
            contracts_refused: get(&c.contracts_refused),
        }
    }

    pub(crate) fn inc(&self, f: impl Fn(&Counters) -> &AtomicU64) {
        f(&self.0).fetch_add(1, AtomicOrdering::Relaxed);
    }
}
