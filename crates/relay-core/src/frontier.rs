//! The ack frontier: the newest WAL position that may be confirmed.
//!
//! PostgreSQL delivers committed transactions whole and in commit order (pgoutput v1), while
//! JetStream acknowledgements come back in any order. The frontier is the Commit `end_lsn` of the
//! newest transaction such that every event of it *and of every earlier transaction* has a
//! positive ack: the contiguous acked prefix in commit order, never "the last ack that came back"
//! (the bug class of YugabyteDB #33126).
//!
//! A keepalive's WAL position may be confirmed only when nothing at all is received but
//! unacknowledged: no open transaction and no committed transaction with an outstanding event.
//! That is what keeps a slot moving while only other tables write WAL, without ever confirming a
//! position in front of an event the broker has not stored.

use std::collections::VecDeque;

use pgoutput::Lsn;

/// Identifies the transaction an in-flight event belongs to; handed back on ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTicket {
    tx_seq: u64,
}

/// One transaction that has begun and is not yet behind the frontier.
#[derive(Debug)]
struct PendingTx {
    /// Commit end LSN, known once the Commit message arrived.
    end_lsn: Option<Lsn>,
    /// Events handed to the publisher and not yet acknowledged.
    outstanding: u64,
    /// Events the transaction carried in all.
    events: u64,
}

/// Errors from feeding the frontier an impossible sequence of events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrontierError {
    /// A Begin arrived while another transaction was still open.
    #[error("transaction began while another was still open")]
    NestedBegin,
    /// A row or Commit arrived outside a transaction.
    #[error("change or commit outside a transaction")]
    NoOpenTransaction,
    /// An ack arrived for a transaction the frontier no longer tracks, or twice for one event.
    #[error("acknowledgement for an event that is not outstanding")]
    UnknownTicket,
    /// A Begin or Commit arrived as a plain decoded message: the source frames transactions
    /// itself, so this one would open or close a transaction the frontier never saw.
    #[error("a pgoutput {0} message arrived outside the source's transaction framing")]
    Unframed(&'static str),
    /// Commit LSNs must increase; this one did not.
    #[error("commit end LSN {got} is not after the previous one {previous}")]
    CommitOutOfOrder {
        /// The end LSN received.
        got: Lsn,
        /// The newest end LSN seen before it.
        previous: Lsn,
    },
}

/// Tracks outstanding events per transaction and computes the confirmable LSN.
#[derive(Debug)]
pub struct AckFrontier {
    /// Transactions not yet behind the frontier, oldest first; the last may still be open.
    pending: VecDeque<PendingTx>,
    /// Sequence number of `pending[0]`.
    front_seq: u64,
    /// Whether the last entry of `pending` is still open (no Commit yet).
    open: bool,
    /// Everything at or before this LSN is acknowledged (or had nothing to publish).
    confirmed: Lsn,
    /// Newest commit end LSN received, to check ordering.
    last_end_lsn: Lsn,
    /// Events outstanding across all transactions.
    in_flight: u64,
    /// End LSN of the newest transaction behind the frontier that carried events.
    last_eventful: Lsn,
}

impl AckFrontier {
    /// A frontier that starts at `start`, the position the stream resumes from.
    pub fn new(start: Lsn) -> Self {
        Self {
            pending: VecDeque::new(),
            front_seq: 0,
            open: false,
            confirmed: start,
            last_end_lsn: start,
            in_flight: 0,
            last_eventful: start,
        }
    }

    /// The newest position that may be stored and reported to the slot.
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// End LSN of the newest confirmable transaction that carried events. Positions past it
    /// came only from keepalives or event-free transactions.
    pub fn last_eventful(&self) -> Lsn {
        self.last_eventful
    }

    /// Events handed to the publisher and not yet acknowledged.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Whether anything is received but not yet behind the frontier.
    pub fn is_idle(&self) -> bool {
        !self.open && self.pending.is_empty()
    }

    /// Whether every outstanding event (if any) belongs to the open transaction: everything
    /// received before it is behind the frontier. A drain that will never read that
    /// transaction's Commit cannot move the frontier by waiting for those acks.
    pub fn only_open_transaction_pending(&self) -> bool {
        self.open && self.pending.len() == 1
    }

    /// A transaction begins.
    pub fn begin(&mut self) -> Result<(), FrontierError> {
        if self.open {
            return Err(FrontierError::NestedBegin);
        }
        self.pending.push_back(PendingTx {
            end_lsn: None,
            outstanding: 0,
            events: 0,
        });
        self.open = true;
        Ok(())
    }

    /// An event of the open transaction goes to the publisher; its ack must come back with the
    /// returned ticket.
    pub fn event(&mut self) -> Result<EventTicket, FrontierError> {
        if !self.open {
            return Err(FrontierError::NoOpenTransaction);
        }
        let index = self.pending.len() - 1;
        let tx = self
            .pending
            .back_mut()
            .ok_or(FrontierError::NoOpenTransaction)?;
        tx.outstanding += 1;
        tx.events += 1;
        self.in_flight += 1;
        Ok(EventTicket {
            tx_seq: self.front_seq + index as u64,
        })
    }

    /// The open transaction committed, ending at `end_lsn`.
    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), FrontierError> {
        if !self.open {
            return Err(FrontierError::NoOpenTransaction);
        }
        if end_lsn <= self.last_end_lsn {
            // pgoutput v1 sends commits in strictly increasing order, and never a commit at or
            // before the start position; anything else means the stream is not what we think.
            return Err(FrontierError::CommitOutOfOrder {
                got: end_lsn,
                previous: self.last_end_lsn,
            });
        }
        if let Some(tx) = self.pending.back_mut() {
            tx.end_lsn = Some(end_lsn);
        }
        self.last_end_lsn = self.last_end_lsn.max(end_lsn);
        self.open = false;
        self.advance();
        Ok(())
    }

    /// The broker acknowledged the event behind `ticket`.
    pub fn ack(&mut self, ticket: EventTicket) -> Result<(), FrontierError> {
        let index = ticket
            .tx_seq
            .checked_sub(self.front_seq)
            .ok_or(FrontierError::UnknownTicket)?;
        let tx = usize::try_from(index)
            .ok()
            .and_then(|i| self.pending.get_mut(i))
            .ok_or(FrontierError::UnknownTicket)?;
        if tx.outstanding == 0 {
            return Err(FrontierError::UnknownTicket);
        }
        tx.outstanding -= 1;
        self.in_flight -= 1;
        self.advance();
        Ok(())
    }

    /// A keepalive reported the server's WAL position. Confirmable only when nothing is
    /// received-but-unacknowledged; returns whether the frontier moved.
    pub fn keepalive(&mut self, wal_end: Lsn) -> bool {
        if self.is_idle() && wal_end > self.confirmed {
            self.confirmed = wal_end;
            return true;
        }
        false
    }

    /// Pops every completed transaction off the front, moving `confirmed` to its end LSN.
    fn advance(&mut self) {
        while let Some(front) = self.pending.front() {
            match front.end_lsn {
                Some(end_lsn) if front.outstanding == 0 => {
                    self.confirmed = self.confirmed.max(end_lsn);
                    if front.events > 0 {
                        self.last_eventful = self.last_eventful.max(end_lsn);
                    }
                    self.pending.pop_front();
                    self.front_seq += 1;
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(v: u64) -> Lsn {
        Lsn(v)
    }

    #[test]
    fn only_the_open_transaction_pending_once_everything_before_it_is_acked() {
        let mut f = AckFrontier::new(lsn(10));
        assert!(!f.only_open_transaction_pending(), "nothing open");
        f.begin().unwrap();
        let a = f.event().unwrap();
        f.commit(lsn(100)).unwrap();
        f.begin().unwrap();
        let b = f.event().unwrap();
        // Transaction 1 still has an outstanding event: waiting can move the frontier.
        assert!(!f.only_open_transaction_pending());
        f.ack(a).unwrap();
        assert_eq!(f.confirmed(), lsn(100));
        assert!(f.only_open_transaction_pending());
        f.ack(b).unwrap();
        assert!(
            f.only_open_transaction_pending(),
            "open, nothing outstanding"
        );
        f.commit(lsn(200)).unwrap();
        assert!(!f.only_open_transaction_pending(), "committed");
    }

    #[test]
    fn acks_out_of_order_advance_only_over_the_contiguous_prefix() {
        let mut f = AckFrontier::new(lsn(10));
        f.begin().unwrap();
        let a1 = f.event().unwrap();
        let a2 = f.event().unwrap();
        f.commit(lsn(100)).unwrap();
        f.begin().unwrap();
        let b1 = f.event().unwrap();
        f.commit(lsn(200)).unwrap();

        // The later transaction is fully acked first: nothing may move.
        f.ack(b1).unwrap();
        assert_eq!(f.confirmed(), lsn(10));
        f.ack(a2).unwrap();
        assert_eq!(f.confirmed(), lsn(10));
        // The last outstanding event of the first transaction releases both.
        f.ack(a1).unwrap();
        assert_eq!(f.confirmed(), lsn(200));
        assert_eq!(f.in_flight(), 0);
        assert!(f.is_idle());
    }

    #[test]
    fn an_open_transaction_holds_the_frontier_even_when_all_its_events_are_acked() {
        let mut f = AckFrontier::new(lsn(0));
        f.begin().unwrap();
        let t = f.event().unwrap();
        f.ack(t).unwrap();
        assert_eq!(f.confirmed(), lsn(0));
        assert!(!f.keepalive(lsn(500)), "keepalive inside a transaction");
        f.commit(lsn(300)).unwrap();
        assert_eq!(f.confirmed(), lsn(300));
    }

    #[test]
    fn keepalive_moves_only_when_nothing_is_in_flight() {
        let mut f = AckFrontier::new(lsn(5));
        assert!(f.keepalive(lsn(50)));
        assert_eq!(f.confirmed(), lsn(50));

        f.begin().unwrap();
        let t = f.event().unwrap();
        f.commit(lsn(80)).unwrap();
        assert!(
            !f.keepalive(lsn(1000)),
            "an unacked event is behind this position"
        );
        assert_eq!(f.confirmed(), lsn(50));
        f.ack(t).unwrap();
        assert_eq!(f.confirmed(), lsn(80));
        assert!(f.keepalive(lsn(1000)));
        assert_eq!(f.confirmed(), lsn(1000));
        assert!(!f.keepalive(lsn(900)), "never backwards");
        assert_eq!(f.confirmed(), lsn(1000));
    }

    #[test]
    fn empty_transactions_complete_at_commit() {
        let mut f = AckFrontier::new(lsn(0));
        f.begin().unwrap();
        f.commit(lsn(42)).unwrap();
        assert_eq!(f.confirmed(), lsn(42));
        assert_eq!(
            f.last_eventful(),
            lsn(0),
            "no events behind the frontier yet"
        );
        f.begin().unwrap();
        let t = f.event().unwrap();
        f.commit(lsn(50)).unwrap();
        f.ack(t).unwrap();
        assert!(f.keepalive(lsn(70)));
        assert_eq!((f.confirmed(), f.last_eventful()), (lsn(70), lsn(50)));
    }

    #[test]
    fn duplicate_or_foreign_acks_are_errors() {
        let mut f = AckFrontier::new(lsn(0));
        f.begin().unwrap();
        let t = f.event().unwrap();
        f.commit(lsn(10)).unwrap();
        f.ack(t).unwrap();
        assert_eq!(f.ack(t), Err(FrontierError::UnknownTicket));
        assert_eq!(f.event(), Err(FrontierError::NoOpenTransaction));
        assert_eq!(f.commit(lsn(20)), Err(FrontierError::NoOpenTransaction));
        f.begin().unwrap();
        assert_eq!(f.begin(), Err(FrontierError::NestedBegin));
    }

    #[test]
    fn randomized_ack_orders_never_pass_an_unacked_event() {
        // A small deterministic LCG instead of a dependency: enough to shuffle ack orders.
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 33
        };
        for _round in 0..200 {
            let mut f = AckFrontier::new(lsn(0));
            let mut tickets = Vec::new(); // (ticket, end_lsn of its transaction)
            let tx_count = 1 + next() % 8;
            for tx in 0..tx_count {
                f.begin().unwrap();
                let end = (tx + 1) * 100;
                for _ in 0..next() % 5 {
                    tickets.push((f.event().unwrap(), end));
                }
                f.commit(lsn(end)).unwrap();
            }
            while !tickets.is_empty() {
                let i = (next() as usize) % tickets.len();
                let (ticket, _) = tickets.swap_remove(i);
                f.ack(ticket).unwrap();
                // The frontier must be below the end LSN of every still-unacked event.
                for (_, end) in &tickets {
                    assert!(f.confirmed() < lsn(*end));
                }
            }
            assert_eq!(f.confirmed(), lsn(tx_count * 100));
        }
    }
}
