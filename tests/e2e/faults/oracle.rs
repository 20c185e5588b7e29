//! The oracle: outbox rows are never deleted during a scenario, so the table is the truth.
//! Every committed event id is ok (exactly once in the stream), dup (more than once) or lost
//! (not in the stream); a stream message whose id is no committed row is a phantom. Order is
//! judged per aggregate (`aggregatetype`, `aggregateid`): its events in commit order (the
//! transaction's start time, one writer per aggregate, then the row's `g` within it) must have
//! their first copies in the stream in that order; an event whose first copy is stored before
//! that of an event of its aggregate committed earlier counts as reordered.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::support::*;

/// One scenario's outcome.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub scenario: String,
    pub written: usize,
    pub ok: usize,
    pub dup: usize,
    pub lost: usize,
    pub phantom: usize,
    /// Events stored after an event of their aggregate that was committed later.
    pub reordered: usize,
    pub pass: bool,
    pub note: String,
}

impl Verdict {
    /// Appends the row to the suite's report and prints it.
    pub fn report(&self) {
        // A run in another publish mode or path names it on every row.
        let scenario = match super::scenarios::run_name() {
            Some(run) => format!("{} [{run}]", self.scenario),
            None => self.scenario.clone(),
        };
        let line = format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            scenario,
            self.written,
            self.ok,
            self.dup,
            self.lost,
            self.phantom,
            self.reordered,
            if self.pass { "PASS" } else { "FAIL" },
            self.note
        );
        eprintln!("fault-suite: {line}");
        let path = std::env::var_os("FAULT_REPORT")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../target/fault-suite.tsv"
                ))
            });
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }

    /// Folds a precondition (or another claim of the scenario) into the verdict: when it does not
    /// hold the scenario fails, and the note says which claim that was.
    pub fn require(&mut self, holds: bool, claim: impl std::fmt::Display) {
        if !holds {
            self.pass = false;
            self.note = format!("NOT MET: {claim}; {}", self.note);
        }
    }

    /// Fails the test unless the verdict passed.
    pub fn assert(&self) {
        self.report();
        assert!(self.pass, "scenario failed: {self:?}");
    }

    /// As [`Self::assert`], and on failure prints the end of the relay's log first, so a
    /// failure in CI can be diagnosed from its output alone.
    pub fn assert_with_log(&self, relay_log: &str) {
        if !self.pass {
            // The verdict first: CI output keeps the start and the end of a failure's text.
            eprintln!("scenario failed: {self:?}");
            let lines: Vec<&str> = relay_log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(80)..];
            eprintln!("--- last {} lines of the relay log ---", tail.len());
            for line in tail {
                eprintln!("{line}");
            }
        }
        self.assert();
    }
}

/// Committed event ids, from the outbox table.
pub async fn committed_ids(env: &Env) -> Result<HashSet<String>> {
    let rows = env
        .db()
        .await?
        .query("SELECT id::text FROM outbox", &[])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Waits until every committed event is in the stream (or `timeout`), then classifies.
pub async fn classify(
    env: &Env,
    scenario: &str,
    allow_dup: bool,
    timeout: Duration,
    note: &str,
) -> Result<Verdict> {
    let js = env.jetstream().await?;
    let committed = committed_ids(env).await?;
    let deadline = Instant::now() + timeout;
    // Cheap first: wait for the message count before reading every message (once, usually).
    let _ = wait_stream_count(env, committed.len(), timeout).await;
    let (counts, messages) = loop {
        let messages = read_stream(&js).await?;
        let mut counts: HashMap<String, usize> = HashMap::new();
        for m in &messages {
            *counts.entry(m.id().to_owned()).or_default() += 1;
        }
        let complete = committed.iter().all(|id| counts.contains_key(id));
        if complete || Instant::now() > deadline {
            break (counts, messages);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut v = Verdict::from_counts(scenario, &committed, &counts, allow_dup, note);
    v.judge_order(&env.db().await?, &messages).await?;
    if v.lost > 0 {
        // Name a few, with their insert time, to tell a relay bug from a test that wrote
        // before the slot existed.
        let lost: Vec<&String> = committed
            .iter()
            .filter(|id| !counts.contains_key(*id))
            .take(5)
            .collect();
        for id in lost {
            let when: Option<String> = env
                .db()
                .await?
                .query_opt(
                    "SELECT created_at::text FROM outbox WHERE id = $1::text::uuid",
                    &[id],
                )
                .await?
                .map(|r| r.get(0));
            eprintln!("fault-suite: {scenario}: lost {id} (inserted {when:?})");
        }
    }
    Ok(v)
}

impl Verdict {
    /// Classifies stream copies per event id against the committed ids.
    pub fn from_counts(
        scenario: &str,
        committed: &HashSet<String>,
        counts: &HashMap<String, usize>,
        allow_dup: bool,
        note: &str,
    ) -> Self {
        let mut v = Verdict {
            scenario: scenario.to_owned(),
            written: committed.len(),
            ok: 0,
            dup: 0,
            lost: 0,
            phantom: 0,
            reordered: 0,
            pass: false,
            note: note.to_owned(),
        };
        for id in committed {
            match counts.get(id) {
                None => v.lost += 1,
                Some(1) => v.ok += 1,
                Some(_) => v.dup += 1,
            }
        }
        v.phantom = counts.keys().filter(|id| !committed.contains(*id)).count();
        v.pass = v.lost == 0 && v.phantom == 0 && (allow_dup || v.dup == 0) && v.written > 0;
        v
    }
}

impl Verdict {
    /// Judges order per aggregate (see the module's documentation) against the committed rows,
    /// from the stream's `messages` in stream order; fails the verdict on any reordered event
    /// where the publish mode promises order.
    pub async fn judge_order(
        &mut self,
        db: &tokio_postgres::Client,
        messages: &[Received],
    ) -> Result<()> {
        let mut first: HashMap<&str, u64> = HashMap::new();
        for m in messages {
            first.entry(m.id()).or_insert(m.seq);
        }
        let rows = db
            .query(
                "SELECT id::text, aggregatetype || '/' || aggregateid, \
                        (extract(epoch FROM created_at) * 1000000)::bigint, \
                        CASE WHEN jsonb_typeof(payload -> 'g') = 'number' \
                             THEN (payload ->> 'g')::bigint ELSE 0 END \
                 FROM outbox",
                &[],
            )
            .await?;
        // aggregate -> (commit key: transaction start µs and `g`, first stream sequence) of its
        // stored events.
        type CommitKey = (i64, i64);
        let mut aggregates: HashMap<String, Vec<(CommitKey, u64)>> = HashMap::new();
        for row in &rows {
            let id: String = row.get(0);
            if let Some(seq) = first.get(id.as_str()) {
                aggregates
                    .entry(row.get(1))
                    .or_default()
                    .push(((row.get(2), row.get(3)), *seq));
            }
        }
        let mut reordered = 0;
        let mut example = None;
        for (aggregate, mut events) in aggregates {
            // Events of one key (one transaction without `g`) have no order to judge: sorted
            // by sequence they never count.
            events.sort();
            let mut latest = 0;
            for (key, seq) in events {
                if seq < latest {
                    reordered += 1;
                    example.get_or_insert(format!(
                        "{aggregate}: the event committed at {key:?} is at sequence {seq}, before one committed earlier at {latest}"
                    ));
                }
                latest = latest.max(seq);
            }
        }
        self.reordered = reordered;
        // Every publish mode promises commit order (docs/guarantees.md, "Commit order").
        if reordered > 0 {
            self.pass = false;
            self.note = format!(
                "{reordered} reordered (e.g. {}); {}",
                example.unwrap_or_default(),
                self.note
            );
        }
        Ok(())
    }
}

/// Background writers: transactions of 1-`max_rows` outbox rows mixed with writes to another
/// table and some rolled-back transactions. Connection errors (a server restart) are waited out;
/// only committed rows count, because the oracle reads the table.
pub struct Load {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl Load {
    pub async fn start(env: &Env, writers: usize, max_rows: u32, pause: Duration) -> Result<Self> {
        env.db()
            .await?
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS side_effects (id bigserial PRIMARY KEY, note text)",
            )
            .await?;
        let (stop, _) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for w in 0..writers {
            let url = env.pg.url(DB);
            let mut stopped = stop.subscribe();
            tasks.push(tokio::spawn(async move {
                let mut committed = 0u64;
                let mut n: u64 = 0x2545F4914F6CDD1D ^ (w as u64 + 1);
                while !*stopped.borrow() {
                    let Ok((mut client, conn)) =
                        tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                    else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    tokio::spawn(conn);
                    while !*stopped.borrow() {
                        n ^= n << 13;
                        n ^= n >> 7;
                        n ^= n << 17;
                        let rows = (n % u64::from(max_rows)) as i32 + 1;
                        let rollback = n.is_multiple_of(13);
                        let result = async {
                            let tx = client.transaction().await?;
                            tx.execute(
                                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                                 SELECT gen_random_uuid(), 'Load', $1, 'Written', jsonb_build_object('g', g) \
                                 FROM generate_series(1, $2) g",
                                &[&format!("w{w}"), &rows],
                            )
                            .await?;
                            tx.execute("INSERT INTO side_effects (note) VALUES ('x')", &[]).await?;
                            if rollback {
                                tx.rollback().await
                            } else {
                                tx.commit().await
                            }
                        }
                        .await;
                        match result {
                            Ok(()) if !rollback => committed += rows as u64,
                            Ok(()) => {}
                            Err(_) => break, // reconnect
                        }
                        tokio::select! {
                            () = tokio::time::sleep(pause) => {}
                            _ = stopped.changed() => {}
                        }
                    }
                }
                committed
            }));
        }
        Ok(Self { stop, tasks })
    }

    /// Stops the writers; returns how many rows they committed (as far as they know).
    pub async fn stop(self) -> u64 {
        let _ = self.stop.send(true);
        let mut total = 0;
        for t in self.tasks {
            total += t.await.unwrap_or(0);
        }
        total
    }
}

/// Waits until the stream holds at least `n` messages.
pub async fn wait_stream_count(env: &Env, n: usize, timeout: Duration) -> Result<()> {
    let js = env.jetstream().await?;
    let deadline = Instant::now() + timeout;
    loop {
        let count = stream_count(&js).await?;
        if count >= n {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "stream at {count} of {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
