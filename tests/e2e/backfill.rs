//! `outbox-relay backfill`: rows the outbox table held before the relay's slot existed are
//! published beside the running relay, once each, exactly as the relay publishes, resumably.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::support::*;

mod filter;
mod resume;
mod snapshot;
mod terminal;

/// Inserts `n` Debezium-shaped rows in one statement (before the slot exists: only a backfill
/// can publish them); returns their ids.
pub(crate) async fn seed(
    db: &tokio_postgres::Client,
    n: i64,
    kind: &str,
) -> Result<HashSet<String>> {
    let rows = db
        .query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Order', g::text, $2, jsonb_build_object('n', g) \
             FROM generate_series(1, $1::bigint) g RETURNING id::text",
            &[&n, &kind],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Inserts a few rows every few milliseconds until `stop`; returns their ids.
async fn spawn_inserter(
    env: &Env,
    stop: Arc<AtomicBool>,
) -> Result<tokio::task::JoinHandle<Result<Vec<String>>>> {
    let db = env.db().await?;
    Ok(tokio::spawn(async move {
        let mut ids = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..5 {
                ids.push(insert_event(&db, "Live", "created", r#"{"live": true}"#).await?);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(ids)
    }))
}

/// Runs `backfill` with `args` and waits for its exit (`code`, within `within`); returns its
/// log.
async fn backfill(
    config: &std::path::Path,
    args: &[&str],
    code: i32,
    within: Duration,
    needles: &[&str],
) -> Result<String> {
    let mut all = vec!["backfill"];
    all.extend_from_slice(args);
    let mut run = Relay::start_with_args(config, &all)?;
    expect_exit(&mut run, code, within, needles).await
}

/// How many copies of each event id the stream holds.
pub(crate) fn copies(messages: &[Received]) -> HashMap<&str, usize> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for m in messages {
        *counts.entry(m.id()).or_default() += 1;
    }
    counts
}

/// Waits until the stream holds every id of `ids`, then asserts each exactly once and nothing
/// else; returns the stream.
async fn expect_each_once(
    env: &Env,
    ids: &HashSet<String>,
    relay: &Relay,
) -> Result<Vec<Received>> {
    let js = env.jetstream().await?;
    let messages = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(relay)).await?;
    // A second copy would come with the last ones: give it a moment to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let messages = read_stream(&js).await.map(|m| {
        if m.len() > messages.len() {
            m
        } else {
            messages
        }
    })?;
    let counts = copies(&messages);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
    ensure!(twice.is_empty(), "ids stored more than once: {twice:?}");
    let missing: Vec<_> = ids
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .take(5)
        .collect();
    ensure!(missing.is_empty(), "ids never published: {missing:?}");
    ensure!(
        messages.len() == ids.len(),
        "stream holds {} messages for {} rows",
        messages.len(),
        ids.len()
    );
    Ok(messages)
}

/// The stored cursor: (last key, end key, rows done, finished).
async fn cursor(
    db: &tokio_postgres::Client,
) -> Result<Option<(Option<String>, Option<String>, i64, bool)>> {
    Ok(db
        .query_opt(
            "SELECT last_key, end_key, rows_done, finished_at IS NOT NULL FROM outbox_relay.backfill",
            &[],
        )
        .await?
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))))
}

/// `this run read N rows` from a backfill's summary.
fn rows_read(log: &str) -> Option<u64> {
    let at = log.rfind("this run read ")? + "this run read ".len();
    log[at..].split_whitespace().next()?.parse().ok()
}

/// The stream's duplicate window (`[nats] duplicate_window` default, the test streams').
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The acceptance case, with `rows` pre-existing rows: the relay runs and rows keep being
/// inserted while the backfill runs. Pre-existing rows end up in the stream exactly once, from
/// the backfill, marked. Rows inserted during the backfill come from the relay: the backfill
/// reads one snapshot, taken when it began. The few committed between the backfill's reading of
/// the last key and its snapshot are in both; the backfill skips those the relay published
/// first (it watches the relay's messages until the relay's checkpoint passes the snapshot),
/// and JetStream drops a second copy within the duplicate window. When the whole backfill
/// takes longer than the window, a copy of such a row may still be stored twice (docs/replay.md,
/// "Duplicates"), and never anything else twice.
async fn backfill_beside_the_live_relay(rows: i64, within: Duration) -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let old = seed(&db, rows, "created").await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let inserter = spawn_inserter(&env, stop.clone()).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let log = backfill(
        &config,
        &["--table", "outbox", "--progress-interval", "1s"],
        0,
        within,
        &["finished:"],
    )
    .await?;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let live: HashSet<String> = inserter.await??.into_iter().collect();
    ensure!(
        live.len() >= 10,
        "live inserts ran during the backfill: {}",
        live.len()
    );
    assert!(log.contains("starting from the first row"), "{log}");
    assert!(log.contains("rows/s"), "progress and summary: {log}");

    let all: HashSet<String> = old.union(&live).cloned().collect();
    let messages = if took < DUPLICATE_WINDOW {
        expect_each_once(&env, &all, &relay).await?
    } else {
        let js = env.jetstream().await?;
        wait_for_messages(&js, all.len(), Duration::from_secs(300), Some(&relay)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let messages = read_stream(&js).await?;
        let counts = copies(&messages);
        let missing = all
            .iter()
            .filter(|id| !counts.contains_key(id.as_str()))
            .count();
        ensure!(missing == 0, "{missing} rows never published");
        ensure!(
            counts.len() == all.len(),
            "messages of no row in the stream"
        );
        let marked = copies(
            &messages
                .iter()
                .filter(|m| m.header("Outbox-Backfill") == "true")
                .cloned()
                .collect::<Vec<_>>(),
        )
        .into_iter()
        .map(|(id, n)| (id.to_owned(), n))
        .collect::<HashMap<String, usize>>();
        let mut twice = 0;
        for (id, n) in &counts {
            if *n == 1 {
                continue;
            }
            ensure!(*n == 2 && live.contains(*id), "{id} stored {n} times");
            ensure!(
                marked.get(*id) == Some(&1),
                "{id}: one copy from the relay, one from the backfill"
            );
            twice += 1;
        }
        eprintln!(
            "the backfill took {took:?}, longer than the duplicate window: {twice} of {} rows inserted meanwhile were stored twice (once from the relay, once from the backfill)",
            live.len()
        );
        messages
    };
    for m in &messages {
        if old.contains(m.id()) {
            assert_eq!(m.header("Outbox-Backfill"), "true", "{m:?}");
            assert_eq!(m.header("Outbox-Commit-Lsn"), "0/0", "{m:?}");
            assert_eq!(m.header("Outbox-Xid"), "0", "{m:?}");
            assert_eq!(m.header("Outbox-Table"), "public.outbox");
            assert_eq!(m.subject, "outbox.Order.created");
        }
    }
    let (_, _, done, finished) = cursor(&db).await?.context("cursor row")?;
    assert!(finished, "cursor marked finished");
    assert!(done >= rows, "rows done {done} of at least {rows}");
    eprintln!("backfill of {rows} rows beside the relay took {took:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn backfill_beside_the_live_relay_publishes_every_row_once() -> Result<()> {
    let started = Instant::now();
    backfill_beside_the_live_relay(20_000, Duration::from_secs(45)).await?;
    // Precondition of "exactly once": the backfill took less than the duplicate window.
    assert!(started.elapsed() < DUPLICATE_WINDOW);
    Ok(())
}

/// `scripts/soak.sh` with BACKFILL_SOAK=1: the same with BACKFILL_ROWS (1,000,000) rows.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "minutes: scripts/soak.sh runs it with BACKFILL_SOAK=1"]
async fn soak_backfill_of_a_large_table() -> Result<()> {
    let rows = std::env::var("BACKFILL_ROWS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    backfill_beside_the_live_relay(rows, Duration::from_secs(1800)).await
}

/// A row that cannot be routed stops the backfill with 65 naming its event id, the cursor
/// before it; with `[relay] dead_letter_subject` the row goes there and the backfill goes on.
#[tokio::test(flavor = "multi_thread")]
async fn unroutable_row_stops_the_backfill_before_it_or_is_dead_lettered() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let mut good = seed(&db, 3_000, "created").await?;
    // An empty `type` cannot form a subject token.
    let bad: String = db
        .query_one(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES (gen_random_uuid(), 'Order', 'x', '', '{}') RETURNING id::text",
            &[],
        )
        .await?
        .get(0);
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    backfill(
        &config,
        &["--table", "outbox", "--page-size", "100"],
        65,
        Duration::from_secs(30),
        &[bad.as_str(), "the cursor stays at"],
    )
    .await?;
    let (last, _, _, finished) = cursor(&db).await?.context("cursor row")?;
    assert!(!finished);
    if let Some(last) = &last {
        let before: bool = db
            .query_one("SELECT $1::text::uuid < $2::text::uuid", &[last, &bad])
            .await?
            .get(0);
        assert!(before, "cursor {last} stays before the bad row {bad}");
    }

    let dlq = env.config("dead_letter_subject = \"outbox.dead.letters\"");
    backfill(
        &dlq,
        &["--table", "outbox", "--page-size", "100"],
        0,
        Duration::from_secs(30),
        &["resuming at", "finished:", "1 dead-lettered"],
    )
    .await?;
    let js = env.jetstream().await?;
    let messages =
        wait_for_messages(&js, good.len() + 1, Duration::from_secs(30), Some(&relay)).await?;
    let dead: Vec<&Received> = messages
        .iter()
        .filter(|m| m.subject == "outbox.dead.letters")
        .collect();
    assert_eq!(dead.len(), 1, "one dead letter");
    assert!(String::from_utf8_lossy(&dead[0].payload).contains(&bad));
    assert!(
        dead[0].header("Outbox-Dlq-Reason").contains("type"),
        "{:?}",
        dead[0]
    );
    good.insert(dead[0].id().to_owned());
    expect_each_once(&env, &good, &relay).await?;
    Ok(())
}

/// A backfilled message is the relay's message for the same row: same subject, payload (a
/// whole-row payload of many types, rendered by the types' output functions as pgoutput does)
/// and headers, but for the commit headers and `Outbox-Backfill`.
#[tokio::test(flavor = "multi_thread")]
async fn backfilled_message_is_the_relays_message() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute(
        "CREATE TABLE typed_outbox (id bigint PRIMARY KEY, kind text NOT NULL, gone int, \
           flag boolean, code char(5), amount numeric(12,3), at timestamptz, raw bytea, \
           ip inet, f float8, tags text[], doc jsonb, span interval, \
           twice bigint GENERATED ALWAYS AS (id * 2) STORED); \
         ALTER TABLE typed_outbox DROP COLUMN gone;",
    )
    .await?;
    let config = env.config_full(
        "create_stream = true\nduplicate_window = \"1s\"",
        r#"
[[outbox]]
table = "public.typed_outbox"
event_id = "id"
subject = "outbox.typed.{kind}"
payload = "*"
headers = { "Outbox-Event-Type" = "kind", "Outbox-Flag" = "flag" }
"#,
    );
    let relay = Relay::start_streaming(&config).await?;
    db.batch_execute(
        "INSERT INTO typed_outbox (id, kind, flag, code, amount, at, raw, ip, f, tags, doc, span) VALUES \
         (1, 'a.b', true, 'ab', 1.5, '2026-01-02 03:04:05.678901+02', '\\x00ff', '10.0.0.1', 0.1, \
          '{x,\"y z\"}', '{\"b\": 1, \"a\": [1, 2]}', '1 day 02:03:04'), \
         (2, 'n', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    )
    .await?;
    let js = env.jetstream().await?;
    wait_for_messages(&js, 2, Duration::from_secs(30), Some(&relay)).await?;
    // Past the duplicate window, so the backfill's copies are stored beside the relay's.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    backfill(
        &config,
        &["--table", "typed_outbox", "--skip-check-limit", "0"],
        0,
        Duration::from_secs(30),
        &["finished:"],
    )
    .await?;
    let messages = wait_for_messages(&js, 4, Duration::from_secs(30), Some(&relay)).await?;
    // What only the live copy's commit gives it, and the commit-order condition (the live
    // relay names the event before it while that one is in flight; a backfill makes none).
    let commit = [
        "Outbox-Commit-Lsn",
        "Outbox-Xid",
        "Outbox-Commit-Time",
        "Outbox-Tx-Index",
        "Outbox-Backfill",
        "Nats-Expected-Last-Msg-Id",
    ];
    for id in ["1", "2"] {
        let (live, filled): (Vec<&Received>, Vec<&Received>) = messages
            .iter()
            .filter(|m| m.id() == id)
            .partition(|m| m.header("Outbox-Backfill").is_empty());
        assert_eq!((live.len(), filled.len()), (1, 1), "{messages:#?}");
        let (live, filled) = (live[0], filled[0]);
        assert_eq!(filled.subject, live.subject);
        assert_eq!(
            String::from_utf8_lossy(&filled.payload),
            String::from_utf8_lossy(&live.payload),
            "whole-row payload"
        );
        let strip = |m: &Received| {
            m.headers
                .iter()
                .filter(|(k, _)| !commit.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(filled), strip(live));
        assert_eq!(filled.header("Outbox-Backfill"), "true");
        assert_eq!(filled.header("Outbox-Commit-Lsn"), "0/0");
        assert_eq!(filled.header("Outbox-Xid"), "0");
        assert!(filled.header("Outbox-Commit-Time").ends_with('Z'));
    }
    let one = messages.iter().find(|m| m.id() == "1").context("row 1")?;
    let row: serde_json::Value = serde_json::from_slice(&one.payload)?;
    assert_eq!(row["flag"], serde_json::json!(true), "{row}");
    assert_eq!(row["code"], "ab   ", "char(5) keeps its padding: {row}");
    assert_eq!(row["raw"], "\\x00ff", "{row}");
    assert!(
        row.get("twice").is_none() && row.get("gone").is_none(),
        "{row}"
    );
    Ok(())
}

/// Pages walk the page key's index. With random keys (UUIDs) and no statistics yet, the planner
/// prices a sequential scan plus a top-N sort below an index scan for `key > last ORDER BY key LIMIT n`, and that
/// plan reads the whole table for every page: the backfill was quadratic (the backfill benchmark:
/// 200,000 rows at 20,000 rows/s, 1,000,000 far slower). The read session must not take it.
#[tokio::test(flavor = "multi_thread")]
async fn pages_walk_the_key_index_not_the_whole_table() -> Result<()> {
    use relay_backfill::{connect_reader, table_shape, walk_index};
    let env = Env::start().await?;
    let db = env.db().await?;
    // Not analyzed, as a table loaded just before (the benchmark's): the planner's default
    // selectivity for `key > last` makes the whole-table plan look cheaper. Autovacuum off so
    // that it cannot analyze the table during the test.
    db.batch_execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
        .await?;
    seed(&db, 100_000, "Seeded").await?;
    let middle: String = db
        .query_one(
            "SELECT id::text FROM outbox ORDER BY id OFFSET 50000 LIMIT 1",
            &[],
        )
        .await?
        .get(0);
    let last: String = db
        .query_one("SELECT id::text FROM outbox ORDER BY id DESC LIMIT 1", &[])
        .await?
        .get(0);
    let mut settings = relay_postgres::PostgresSettings::default();
    settings.url = env.pg.url(DB);
    let reader = connect_reader(&settings).await?;
    let shape = table_shape(&reader, "public", "outbox", "id", "relay_pub").await?;
    let sql = format!(
        "EXPLAIN {}",
        shape.page_sql(None, Some(&middle), &last, 1000)
    );
    let plan = |rows: Vec<tokio_postgres::SimpleQueryMessage>| -> String {
        rows.into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    // The precondition: the query alone takes the whole-table plan.
    let default_plan = plan(reader.simple_query(&sql).await?);
    let reader_plan = plan(reader.simple_query(&walk_index(&sql)).await?);
    // And only the page is planned that way: the session is as it was.
    let after_page = plan(reader.simple_query(&sql).await?);
    ensure!(
        after_page == default_plan,
        "the page's settings outlived it:\n{after_page}"
    );
    ensure!(
        !default_plan.contains("Index Scan using outbox_pkey"),
        "precondition: without walk_index a page reads the whole table; plan:\n{default_plan}"
    );
    ensure!(
        reader_plan.contains("Index Scan using outbox_pkey") && !reader_plan.contains("Seq Scan"),
        "the backfill's page reads the whole table; plan:\n{reader_plan}"
    );
    // With a filter, the page reads a subquery of the rows it keeps (the key range outside it):
    // pulled up, the same walk of the index.
    let filtered = format!(
        "EXPLAIN {}",
        shape.page_sql(Some("aggregateid <> '7'"), Some(&middle), &last, 1000)
    );
    let filtered_plan = plan(reader.simple_query(&walk_index(&filtered)).await?);
    ensure!(
        filtered_plan.contains("Index Scan using outbox_pkey")
            && !filtered_plan.contains("Seq Scan")
            && !filtered_plan.contains("Subquery Scan"),
        "a filtered page does not walk the index; plan:\n{filtered_plan}"
    );
    Ok(())
}
