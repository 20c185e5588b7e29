//! A window of the replication stream: the transactions committed before an end position, then
//! the end of the stream (`outbox-relay restore` replays such a window from a copy of the slot).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use relay_core::Lsn;
use relay_core::stage::{ChangeSource, SourceError, SourceEvent};

use super::PgSource;

/// `inner`'s stream up to (not including) the first transaction committed at or after `end`.
/// Nothing is confirmed to `inner`: the window reads a slot that is dropped afterwards.
#[derive(Debug)]
pub struct WindowSource<S = PgSource> {
    inner: S,
    end: Lsn,
    /// Inside a transaction (a keepalive past `end` ends the window only between them).
    in_tx: bool,
    /// The last commit position read (for progress reports).
    reached: Arc<AtomicU64>,
}

impl<S: ChangeSource> WindowSource<S> {
    /// The window of `inner` that ends before `end`; `reached` follows the last commit position
    /// read (and is `end` once the window is complete).
    pub fn new(inner: S, end: Lsn, reached: Arc<AtomicU64>) -> Self {
        Self {
            inner,
            end,
            in_tx: false,
            reached,
        }
    }

    /// The stream the window read.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: ChangeSource> ChangeSource for WindowSource<S> {
    async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        let Some(event) = self.inner.next().await? else {
            return Ok(None);
        };
        match &event {
            // Begin carries the commit LSN: this transaction is past the window.
            SourceEvent::Begin { final_lsn, .. } if *final_lsn >= self.end => {
                self.reached.fetch_max(self.end.0, Ordering::Relaxed);
                return Ok(None);
            }
            SourceEvent::Begin { final_lsn, .. } => {
                self.in_tx = true;
                self.reached.fetch_max(final_lsn.0, Ordering::Relaxed);
            }
            SourceEvent::Commit { .. } => self.in_tx = false,
            // A keepalive names a position decoding has passed: every transaction committed
            // before it was sent already.
            SourceEvent::KeepAlive { wal_end } if !self.in_tx && *wal_end >= self.end => {
                self.reached.fetch_max(self.end.0, Ordering::Relaxed);
                return Ok(None);
            }
            _ => {}
        }
        Ok(Some(event))
    }

    fn confirm(&mut self, _lsn: Lsn) {}
}

#[cfg(test)]
mod tests;
