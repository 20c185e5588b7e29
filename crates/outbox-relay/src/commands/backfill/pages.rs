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
use relay_core::id_digest::{IdDigest, id_digest};
use relay_core::stage::{
    ChangeSource, CheckpointStore, ErrorClass, SourceError, SourceEvent, StoreError,
};
use relay_postgres::backfill::{self, BackfillError, CursorId, TableShape};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What the source, the store and the progress report share.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Page number → its last key and the rows done once it is (over every run).
    pages: Mutex<BTreeMap<u64, (String, i64)>>,
    /// The stored cursor: last key and rows done.
    stored: Mutex<(Option<String>, i64)>,
    /// Rows read this run.
    pub(super) read: AtomicU64,
    /// Rows not published because the stream already holds their event id.
    pub(super) skipped: AtomicU64,
    /// Number of the last page handed to the pipeline.
    pub(super) last_page: AtomicU64,
    /// Every page was read.
    pub(super) exhausted: AtomicBool,
}

impl Progress {
    pub(super) fn new(last_key: Option<String>, rows_done: i64) -> Self {
        Self {
            stored: Mutex::new((last_key, rows_done)),
            ..Self::default()
        }
    }

    /// The stored cursor: last key and rows done.
    pub(super) fn stored(&self) -> (Option<String>, i64) {
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What the page reader needs.
pub(super) struct PageReader {
    pub(super) client: Arc<tokio_postgres::Client>,
    pub(super) shape: TableShape,
    pub(super) filter: Option<String>,
    pub(super) after: Option<String>,
    pub(super) end: String,
    pub(super) page_size: usize,
    /// Rows per second at most (0: no limit).
    pub(super) rate: u64,
    /// Rows done before this run.
    pub(super) rows_done: i64,
    /// Fingerprints of the event ids the stream already holds for this table.
    pub(super) skip: HashSet<IdDigest>,
    /// Fingerprints of the event ids the relay published for it since.
    pub(super) live: super::publish::LiveIds,
}

/// Pages read ahead of the one being published: the next SELECT runs while JetStream
/// acknowledges the current page, so neither waits for the other.
const PAGES_AHEAD: usize = 2;

/// The table's rows as pgoutput transactions, one per page.
#[derive(Debug)]
pub(super) struct PageSource {
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
    pub(super) fn start(reader: PageReader, progress: Arc<Progress>) -> Self {
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
    progress: Arc<Progress>,
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
                reader.skip.contains(&id)
                    || reader
                        .live
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .contains(&id)
            });
            if known {
                progress.skipped.fetch_add(1, Ordering::Relaxed);
            } else {
                inserts.push(insert);
            }
        }
        rows_done += i64::try_from(count).unwrap_or(i64::MAX);
        // Known before the Commit is sent, so before the frontier can reach the page.
        progress
            .pages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(page_no, (last_key.clone(), rows_done));
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
pub(super) struct CursorStore {
    pub(super) client: tokio_postgres::Client,
    pub(super) id: CursorId,
    pub(super) progress: Arc<Progress>,
}

impl CheckpointStore for CursorStore {
    async fn load(&mut self) -> Result<Option<Lsn>, StoreError> {
        Ok(None)
    }

    async fn save(&mut self, lsn: Lsn) -> Result<(), StoreError> {
        let page = {
            let mut pages = self
                .progress
                .pages
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let page = pages.get(&lsn.0).cloned();
            // Pages before it are behind the cursor for good.
            pages.retain(|n, _| *n > lsn.0);
            page
        };
        let Some((key, rows_done)) = page else {
            return Err(StoreError::new(
                ErrorClass::Fatal,
                format!("backfill page {} is unknown", lsn.0),
            ));
        };
        backfill::save_cursor(&self.client, &self.id, &key, rows_done)
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
        *self
            .progress
            .stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (Some(key), rows_done);
        Ok(())
    }
}
