//! `[[outbox]] backfill = "on-create"`: when the relay creates its slot, the rows the table
//! already holds are published from the slot's exported snapshot, then the relay streams. The
//! slot's consistent point splits the rows: those committed before it come from the backfill
//! (marked `Outbox-Backfill: true`), those after from the stream, each exactly once; a kill -9
//! in the middle of the backfill resumes at its cursor.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::support::*;

/// The relay's configuration: the default mapping with the backfill at slot creation, a 1 s
/// duplicate window (so JetStream's dedupe cannot hide a second copy that the relay sent
/// seconds later), and `[relay]` lines `relay`.
fn config(env: &Env, relay: &str) -> std::path::PathBuf {
    env.config_full(
        "create_stream = true\nduplicate_window = \"1s\"",
        &format!("{relay}\n[[outbox]]\ntable = \"public.outbox\"\nbackfill = \"on-create\"\n"),
    )
}

/// Inserts `n` rows (random uuid keys) in one statement; returns their ids.
async fn seed(db: &tokio_postgres::Client, n: i64) -> Result<HashSet<String>> {
    let rows = db
        .query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Order', g::text, 'created', jsonb_build_object('n', g) \
             FROM generate_series(1, $1::bigint) g RETURNING id::text",
            &[&n],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Inserts a row every few milliseconds, each in its own transaction, until `stop`.
async fn spawn_inserter(
    env: &Env,
    stop: Arc<AtomicBool>,
) -> Result<tokio::task::JoinHandle<Result<Vec<String>>>> {
    let db = env.db().await?;
    Ok(tokio::spawn(async move {
        let mut ids = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            ids.push(insert_event(&db, "Live", "created", r#"{"live": true}"#).await?);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(ids)
    }))
}

/// The on-create cursor: (snapshot, consistent point, last key, end key, rows done, finished).
type Cursor = (
    Option<String>,
    Option<u64>,
    Option<String>,
    Option<String>,
    i64,
    bool,
);

async fn cursor(db: &tokio_postgres::Client) -> Result<Option<Cursor>> {
    Ok(db
        .query_opt(
            "SELECT snapshot, (consistent_lsn - '0/0')::bigint, last_key, end_key, rows_done, \
                    finished_at IS NOT NULL \
             FROM outbox_relay.backfill WHERE on_create AND table_name = 'public.outbox'",
            &[],
        )
        .await?
        .map(|r| {
            (
                r.get(0),
                r.get::<_, Option<i64>>(1).map(|l| l as u64),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
            )
        }))
}

/// Every row's id and whether the slot's exported `snapshot` sees its transaction (committed
/// before the consistent point). A fresh cluster: xid epoch 0, so `xmin` is the full id.
async fn seen_by_snapshot(
    db: &tokio_postgres::Client,
    snapshot: &str,
) -> Result<HashMap<String, bool>> {
    Ok(db
        .query(
            "SELECT id::text, pg_visible_in_snapshot(xmin::text::xid8, $1::text::pg_snapshot) \
             FROM outbox",
            &[&snapshot],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// Waits for every row in the stream, then checks: each id exactly once, nothing else; every
/// row the snapshot sees came from the backfill, every other row from the stream with a
/// commit LSN at or after the consistent point, and (when `exact`) only those from the
/// backfill; the backfill's messages all come before the stream's; the checkpoint and the
/// slot end past the last streamed commit. Returns the stream.
async fn check_split(
    env: &Env,
    relay: &Relay,
    rows: &HashMap<String, bool>,
    consistent: u64,
    exact: bool,
    within: Duration,
) -> Result<Vec<Received>> {
    let js = env.jetstream().await?;
    wait_for_messages(&js, rows.len(), within, Some(relay)).await?;
    // A second copy would come with the last ones: give it a moment to show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let messages = read_stream(&js).await?;
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for m in &messages {
        *copies.entry(m.id()).or_default() += 1;
    }
    let twice: Vec<_> = copies.iter().filter(|(_, n)| **n > 1).take(5).collect();
    ensure!(twice.is_empty(), "ids stored more than once: {twice:?}");
    let missing: Vec<_> = rows
        .keys()
        .filter(|id| !copies.contains_key(id.as_str()))
        .take(5)
        .collect();
    ensure!(missing.is_empty(), "rows never published: {missing:?}");
    ensure!(
        messages.len() == rows.len(),
        "the stream holds {} messages for {} rows",
        messages.len(),
        rows.len()
    );
    let mut last_backfilled = 0;
    let mut first_streamed = u64::MAX;
    let mut last_commit = 0;
    for m in &messages {
        let before = rows[m.id()];
        let backfilled = m.header("Outbox-Backfill") == "true";
        if backfilled {
            last_backfilled = last_backfilled.max(m.seq);
            assert_eq!(m.header("Outbox-Commit-Lsn"), "0/0", "{m:?}");
            if exact {
                ensure!(
                    before,
                    "{} was committed after the consistent point, yet backfilled",
                    m.id()
                );
            }
        } else {
            first_streamed = first_streamed.min(m.seq);
            ensure!(
                !before,
                "{} was committed before the consistent point, yet streamed: {m:?}",
                m.id()
            );
            let lsn = parse_lsn(m.header("Outbox-Commit-Lsn")).context("commit lsn")?;
            ensure!(
                lsn >= consistent,
                "{}: streamed commit {lsn:X} before the consistent point {consistent:X}",
                m.id()
            );
            last_commit = last_commit.max(lsn);
        }
    }
    ensure!(
        last_backfilled < first_streamed,
        "the stream's events wait for the backfill: last backfilled seq {last_backfilled}, first streamed {first_streamed}"
    );
    // Positions: the checkpoint and the slot move past the last streamed commit (and never
    // before the consistent point).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let checkpoint = env.checkpoint().await?.unwrap_or(0);
        let slot = env.slot_confirmed().await?.unwrap_or(0);
        if checkpoint > last_commit && slot > last_commit {
            ensure!(checkpoint >= consistent && slot >= consistent);
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "checkpoint {checkpoint:X} / slot {slot:X} never passed the last commit {last_commit:X}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(messages)
}

/// Rows inserted before, while and after the relay creates its slot: the consistent point
/// splits them into backfilled and streamed, every row exactly once, existing rows first.
#[tokio::test(flavor = "multi_thread")]
async fn existing_rows_then_the_stream_each_once() -> Result<()> {
    existing_rows_then_the_stream(10_000, Duration::from_secs(60)).await
}

/// `scripts/soak.sh` with BACKFILL_SOAK=1: the same with BACKFILL_ROWS (1,000,000) rows.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "minutes: scripts/soak.sh runs it with BACKFILL_SOAK=1"]
async fn soak_backfill_at_slot_creation() -> Result<()> {
    let rows = std::env::var("BACKFILL_ROWS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    existing_rows_then_the_stream(rows, Duration::from_secs(1800)).await
}

async fn existing_rows_then_the_stream(seeded: i64, within: Duration) -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let old = seed(&db, seeded).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let inserter = spawn_inserter(&env, stop.clone()).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let config = config(&env, "");
    let started = Instant::now();
    let relay = Relay::start(&config)?;
    relay.wait_log("replication started", within).await?;
    eprintln!(
        "{seeded} rows backfilled at slot creation, streaming after {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let live = inserter.await??;

    let (snapshot, consistent, _, _, done, finished) = cursor(&db).await?.context("cursor")?;
    let (snapshot, consistent) = (snapshot.context("snapshot")?, consistent.context("lsn")?);
    ensure!(finished, "the backfill finished before the relay streamed");
    let rows = seen_by_snapshot(&db, &snapshot).await?;
    ensure!(rows.len() == old.len() + live.len());
    ensure!(old.iter().all(|id| rows[id]), "the seeded rows are before");
    // Precondition: the concurrent inserts straddle the consistent point.
    let live_before = live.iter().filter(|id| rows[id.as_str()]).count();
    ensure!(
        live_before > 0 && live_before < live.len(),
        "inserts on both sides of the consistent point: {live_before} of {}",
        live.len()
    );
    ensure!(
        done as usize == old.len() + live_before,
        "rows done {done}, expected {} seeded + {live_before} live rows the snapshot sees; log:\n{}",
        old.len(),
        relay.log()
    );
    check_split(&env, &relay, &rows, consistent, true, within).await?;
    assert!(relay.log().contains("from its exported snapshot"));
    Ok(())
}

/// kill -9 in the middle of the backfill at slot creation (cursor stored, not finished, not
/// streaming yet), rows inserted while the relay is down, restart: the backfill resumes at its
/// cursor and completes; nothing missing, nothing twice.
#[tokio::test(flavor = "multi_thread")]
async fn killed_backfill_at_slot_creation_resumes() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let old = seed(&db, 20_000).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let inserter = spawn_inserter(&env, stop.clone()).await?;
    // Slowed (4,000 rows/s) so the kill lands in the middle.
    let config = config(&env, "backfill_rate = 4000");
    let mut first = Relay::start(&config)?;
    let at_kill = first
        .poll_while_running(
            Duration::from_secs(30),
            "the cursor at 2,000 rows",
            async || {
                Ok(match cursor(&db).await? {
                    Some((Some(_), Some(_), Some(last), Some(end), done, false))
                        if done >= 2_000 =>
                    {
                        Some((last, end, done))
                    }
                    _ => None,
                })
            },
        )
        .await?;
    first.kill9();
    let first_log = first.log();
    // Preconditions: killed mid-backfill, before streaming; the slot stays at its consistent
    // point.
    ensure!(!first_log.contains("replication started"), "{first_log}");
    let (snapshot, consistent, last, end, done, finished) = cursor(&db).await?.context("cursor")?;
    let (snapshot, consistent) = (snapshot.context("snapshot")?, consistent.context("lsn")?);
    ensure!(!finished && last.is_some() && done >= at_kill.2 && done < old.len() as i64);
    let between: bool = db
        .query_one("SELECT $1::text::uuid < $2::text::uuid", &[&last, &end])
        .await?
        .get(0);
    ensure!(between, "cursor {last:?} before the end {end:?}");
    ensure!(env.slot_confirmed().await? == Some(consistent));
    ensure!(env.checkpoint().await? == Some(consistent));

    // The on-demand command leaves an unfinished backfill at slot creation alone (78): it
    // would read the table outside the slot's snapshot.
    let mut command = Relay::start_with_args(&config, &["backfill", "--table", "outbox"])?;
    expect_exit(
        &mut command,
        78,
        Duration::from_secs(20),
        &["at slot creation", "is under way"],
    )
    .await?;

    // Rows committed while the relay is down (after the consistent point; with random keys,
    // many inside the rest of the backfill's key range).
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The rest of the backfill (about 18,000 rows at 4,000 rows/s), then the stream.
    let relay = Relay::start(&config)?;
    relay
        .wait_log("replication started", Duration::from_secs(90))
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let live = inserter.await??;

    let rows = seen_by_snapshot(&db, &snapshot).await?;
    ensure!(rows.len() == old.len() + live.len());
    let after = live.iter().filter(|id| !rows[id.as_str()]).count();
    ensure!(after > 0, "rows committed after the consistent point");
    check_split(
        &env,
        &relay,
        &rows,
        consistent,
        false,
        Duration::from_secs(60),
    )
    .await?;
    let log = relay.log();
    ensure!(
        log.contains("resuming the backfill at slot creation"),
        "resumed, not restarted:\n{log}"
    );
    // Precondition of "the stream's copy is skipped": the resumed range held rows committed
    // after the consistent point.
    ensure!(
        !log.contains("committed_after_consistent_point=Some(0)"),
        "rows of the resumed range the slot streams too:\n{log}"
    );
    let (_, _, _, _, done_at_end, finished) = cursor(&db).await?.context("cursor")?;
    ensure!(finished, "finished");
    ensure!(
        done_at_end > done,
        "rows done went on from {done} to {done_at_end}"
    );
    Ok(())
}

/// `outbox-relay setup` leaves the slot to the relay's first start (whose backfill needs the
/// snapshot the slot exports), which then publishes the existing rows.
#[tokio::test(flavor = "multi_thread")]
async fn setup_defers_the_slot_to_the_first_start() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let old = seed(&db, 300).await?;
    let config = config(&env, "");
    let mut setup = Relay::start_with_args(&config, &["setup", "--create-stream"])?;
    // (Its report, "deferred slot relay_slot", is on stdout, which the harness drops.)
    expect_exit(
        &mut setup,
        0,
        Duration::from_secs(30),
        &["created publication"],
    )
    .await?;
    ensure!(env.slot_confirmed().await?.is_none(), "no slot after setup");
    ensure!(
        env.checkpoint().await?.is_none(),
        "no checkpoint after setup"
    );
    let relay = Relay::start_streaming(&config).await?;
    ensure!(
        relay.log().contains("exported_snapshot=true"),
        "{}",
        relay.log()
    );
    let js = env.jetstream().await?;
    let messages = wait_for_messages(&js, old.len(), Duration::from_secs(30), Some(&relay)).await?;
    let backfilled: HashSet<&str> = messages
        .iter()
        .filter(|m| m.header("Outbox-Backfill") == "true")
        .map(|m| m.id())
        .collect();
    ensure!(backfilled.len() == old.len() && old.iter().all(|id| backfilled.contains(id.as_str())));
    let (_, consistent, ..) = cursor(&db).await?.context("cursor")?;
    ensure!(env.checkpoint().await? >= consistent && consistent.is_some());
    Ok(())
}
