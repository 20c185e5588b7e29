//! The backfill as the pipeline's source and checkpoint store.
//!
//! [`PageSource`] reads the table in keyset pages on a task of its own and hands each page to
//! the pipeline as one transaction: Begin (xid 0, commit LSN `0/0`, commit time = when the page
//! was read), the table's Relation before the first page, one Insert per row, Commit with the
//! page's number as its end "LSN". The pipeline's ack frontier then moves over a page only
//! once JetStream acknowledged every row of it and of every page before it, and
//! [`CursorStore`] turns that page number back into the page's last key and stores it: the
//! relay's delivery rule, with pages for transactions and the cursor for the checkpoint.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use relay_core::Lsn;
use relay_core::id_digest::{IdDigest, SharedIds, id_digest};
use relay_core::stage::{
    ChangeSource, CheckpointStore, ErrorClass, SourceError, SourceEvent, StoreError,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{BackfillError, CursorId, TableShape, finish_cursor, save_cursor};

/// What the source, the store and the progress report share.
#[derive(Debug, Default)]
pub struct PageProgress {
    /// Page number → its last key and the rows done once it is (over every run).
    pages: Mutex<BTreeMap<u64, (String, i64)>>,
    /// The stored cursor: last key and rows done.
    stored: Mutex<(Option<String>, i64)>,
    /// Rows read this run.
    read: AtomicU64,
    /// Rows not published because the stream already holds their event id.
    skipped: AtomicU64,
    /// Number of the last page handed to the pipeline.
    last_page: AtomicU64,
    /// Every page was read.
    exhausted: AtomicBool,
}

impl PageProgress {
    /// A run that resumes at cursor `last_key` with `rows_done` rows done by earlier runs.
    #[must_use]
    pub fn new(last_key: Option<String>, rows_done: i64) -> Self {
        Self {
            stored: Mutex::new((last_key, rows_done)),
            ..Self::default()
        }
    }

    /// The stored cursor: last key and rows done.
    #[must_use]
    pub fn stored(&self) -> (Option<String>, i64) {
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Rows read this run.
    #[must_use]
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Rows not published because the stream already held them or the relay published them.
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Whether every page was read and the ack frontier (`confirmed`, a page number) reached
    /// the last of them: the backfill is complete.
    #[must_use]
    pub fn complete_at(&self, confirmed: Lsn) -> bool {
        self.exhausted.load(Ordering::Relaxed)
            && confirmed.0 == self.last_page.load(Ordering::Relaxed)
    }

    /// Page `page_no` ends at `last_key` with `rows_done` rows done: known before its Commit
    /// is handed out, so before the frontier can reach it.
    fn note_page(&self, page_no: u64, last_key: String, rows_done: i64) {
        self.pages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(page_no, (last_key, rows_done));
    }

    /// The cursor of page `page_no`, which the frontier reached; pages up to it are behind
    /// the cursor for good and forgotten.
    fn take_page(&self, page_no: u64) -> Option<(String, i64)> {
        let mut pages = self.pages.lock().unwrap_or_else(PoisonError::into_inner);
        let page = pages.get(&page_no).cloned();
        pages.retain(|n, _| *n > page_no);
        page
    }

    fn set_stored(&self, key: String, rows_done: i64) {
        *self.stored.lock().unwrap_or_else(PoisonError::into_inner) = (Some(key), rows_done);
    }
}

/// What the page reader needs.
#[derive(Debug)]
pub struct PageReader {
    /// The read session, in the backfill's snapshot.
    pub client: Arc<tokio_postgres::Client>,
    /// The table.
    pub shape: TableShape,
    /// A condition on the rows (`--where`), `None` for all.
    pub filter: Option<String>,
    /// The stored cursor (`None`: from the first row).
    pub after: Option<String>,
    /// The last key to read.
    pub end: String,
    /// Rows per page.
    pub page_size: usize,
    /// Rows per second at most (0: no limit).
    pub rate: u64,
    /// Rows done before this run.
    pub rows_done: i64,
    /// Fingerprints of the event ids the stream already holds for this table.
    pub skip: HashSet<IdDigest>,
    /// Fingerprints of the event ids the relay published for it since.
    pub live: SharedIds,
}

/// Pages read ahead of the one being published: the next SELECT runs while JetStream
/// acknowledges the current page, so neither waits for the other.
const PAGES_AHEAD: usize = 2;

/// The table's rows as pgoutput transactions, one per page.
#[derive(Debug)]
pub struct PageSource {
    rx: mpsc::Receiver<Result<Vec<SourceEvent>, SourceError>>,
    /// The rest of the page being handed out.
    current: std::vec::IntoIter<SourceEvent>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PageSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn source_error(error: BackfillError) -> SourceError {
    let class = if error.is_transient() {
        ErrorClass::Transient
    } else {
        ErrorClass::Fatal
    };
    SourceError::new(class, format!("{error:#}")).with_source(error)
}

/// Microseconds since 2000-01-01 UTC, now.
fn pg_now_micros() -> i64 {
    const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800 * 1_000_000;
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    unix - PG_EPOCH_UNIX_MICROS
}

impl PageSource {
    /// Starts reading `reader`'s pages on a task of its own (stopped when the source is
    /// dropped), a few pages ahead of the pipeline.
    #[must_use]
    pub fn start(reader: PageReader, progress: Arc<PageProgress>) -> Self {
        let (tx, rx) = mpsc::channel(PAGES_AHEAD);
        let task = tokio::spawn(read_pages(reader, progress, tx));
        Self {
            rx,
            current: Vec::new().into_iter(),
            task,
        }
    }
}

/// Reads every page and sends it on `tx`; ends (dropping `tx`) after the last page or the
/// first error.
async fn read_pages(
    mut reader: PageReader,
    progress: Arc<PageProgress>,
    tx: mpsc::Sender<Result<Vec<SourceEvent>, SourceError>>,
) {
    let started = Instant::now();
    let mut rows_done = reader.rows_done;
    let mut page_no = 0u64;
    let mut read = 0u64;
    loop {
        let rows = match reader
            .shape
            .page(
                &reader.client,
                reader.filter.as_deref(),
                reader.after.as_deref(),
                &reader.end,
                reader.page_size,
            )
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                let _ = tx.send(Err(source_error(e))).await;
                return;
            }
        };
        let Some((last_key, _)) = rows.last() else {
            progress.exhausted.store(true, Ordering::Relaxed);
            return;
        };
        let last_key = last_key.clone();
        let full = rows.len() == reader.page_size;
        page_no += 1;
        let count = rows.len() as u64;
        let mut inserts = Vec::with_capacity(rows.len());
        for (_, insert) in rows {
            let known = reader.shape.event_id_of(&insert).is_some_and(|id| {
                let id = id_digest(id);
                reader.skip.contains(&id) || reader.live.contains(&id)
            });
            if known {
                progress.skipped.fetch_add(1, Ordering::Relaxed);
            } else {
                inserts.push(insert);
            }
        }
        rows_done += i64::try_from(count).unwrap_or(i64::MAX);
        progress.note_page(page_no, last_key.clone(), rows_done);
        let events = reader
            .shape
            .page_transaction(page_no, inserts, page_no == 1, pg_now_micros());
        // Before the hand-over: the frontier cannot reach a page `last_page` does not count.
        progress.last_page.store(page_no, Ordering::Relaxed);
        if tx.send(Ok(events)).await.is_err() {
            return;
        }
        read += count;
        progress.read.fetch_add(count, Ordering::Relaxed);
        reader.after = Some(last_key);
        if !full {
            progress.exhausted.store(true, Ordering::Relaxed);
            return;
        }
        if reader.rate > 0 {
            let due = started + Duration::from_secs_f64(read as f64 / reader.rate as f64);
            tokio::time::sleep_until(due).await;
        }
    }
}

impl ChangeSource for PageSource {
    async fn next(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        loop {
            if let Some(event) = self.current.next() {
                return Ok(Some(event));
            }
            match self.rx.recv().await {
                Some(Ok(page)) => self.current = page.into_iter(),
                Some(Err(e)) => return Err(e),
                None => return Ok(None),
            }
        }
    }

    fn confirm(&mut self, _lsn: Lsn) {}
}

/// Stores the cursor: the last key of the newest page behind the ack frontier.
#[derive(Debug)]
pub struct CursorStore {
    client: tokio_postgres::Client,
    id: CursorId,
    progress: Arc<PageProgress>,
}

impl CursorStore {
    /// The store of cursor `id`, on `client` ([`super::prepare_cursor_session`]).
    #[must_use]
    pub fn new(client: tokio_postgres::Client, id: CursorId, progress: Arc<PageProgress>) -> Self {
        Self {
            client,
            id,
            progress,
        }
    }

    /// Marks the backfill finished: every row was acknowledged ([`PageProgress::complete_at`]).
    ///
    /// # Errors
    /// The update failed.
    pub async fn finish(&self) -> Result<(), BackfillError> {
        finish_cursor(&self.client, &self.id).await
    }
}

impl CheckpointStore for CursorStore {
    async fn load(&mut self) -> Result<Option<Lsn>, StoreError> {
        Ok(None)
    }

    async fn save(&mut self, lsn: Lsn) -> Result<(), StoreError> {
        let Some((key, rows_done)) = self.progress.take_page(lsn.0) else {
            return Err(StoreError::new(
                ErrorClass::Fatal,
                format!("backfill page {} is unknown", lsn.0),
            ));
        };
        save_cursor(&self.client, &self.id, &key, rows_done)
            .await
            .map_err(|e| {
                let class = if relay_postgres::is_transient_query_error(&e) {
                    ErrorClass::Transient
                } else {
                    ErrorClass::Fatal
                };
                StoreError::new(
                    class,
                    format!("cannot store the backfill cursor at key {key}"),
                )
                .with_source(e)
            })?;
        self.progress.set_stored(key, rows_done);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
