//! Signals from SQL: an `INSERT` into `outbox_relay.signal` starts a backfill in the running
//! relay, which writes its progress and outcome back into the row; a bad signal is a failed row
//! with its reason, never a stopped relay; a signal running when the relay was killed resumes at
//! its next start.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::backfill::{copies, seed};
use crate::support::*;

/// Inserts a signal; returns its id.
async fn signal(db: &tokio_postgres::Client, kind: &str, args: &str) -> Result<i64> {
    Ok(db
        .query_one(
            "INSERT INTO outbox_relay.signal (kind, args) VALUES ($1, $2::text::jsonb) RETURNING id",
            &[&kind, &args],
        )
        .await?
        .get(0))
}

/// A signal row as the relay left it.
#[derive(Debug, Clone)]
struct Row {
    state: String,
    progress: Option<serde_json::Value>,
    outcome: Option<String>,
    error: Option<String>,
    finished_at: Option<String>,
}

async fn row(db: &tokio_postgres::Client, id: i64) -> Result<Row> {
    let r = db
        .query_one(
            "SELECT state, progress::text, outcome, error, \
                    to_char(finished_at, 'YYYY-MM-DD HH24:MI:SS.US') \
             FROM outbox_relay.signal WHERE id = $1",
            &[&id],
        )
        .await?;
    let progress: Option<String> = r.get(1);
    Ok(Row {
        state: r.get(0),
        progress: progress.map(|p| serde_json::from_str(&p)).transpose()?,
        outcome: r.get(2),
        error: r.get(3),
        finished_at: r.get(4),
    })
}

/// Waits until signal `id` is finished (done or failed); returns every distinct row seen on the
/// way.
async fn follow(db: &tokio_postgres::Client, id: i64, relay: &Relay) -> Result<Vec<Row>> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen: Vec<Row> = Vec::new();
    loop {
        let now = row(db, id).await?;
        let changed = seen.last().is_none_or(|last| {
            (last.state.as_str(), &last.progress) != (now.state.as_str(), &now.progress)
        });
        if changed {
            seen.push(now.clone());
        }
        if now.finished_at.is_some() {
            return Ok(seen);
        }
        if Instant::now() > deadline {
            bail!("signal {id} not finished: {now:?}; log:\n{}", relay.log());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The backfill's stored cursor: (rows done, finished).
async fn cursor(db: &tokio_postgres::Client) -> Result<Option<(i64, bool)>> {
    Ok(db
        .query_opt(
            "SELECT rows_done, finished_at IS NOT NULL FROM outbox_relay.backfill",
            &[],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

const OLD_ROWS: i64 = 4000;

#[tokio::test]
async fn a_backfill_signal_publishes_the_old_rows_and_reports_its_progress_in_its_row() -> Result<()>
{
    let env = Env::start().await?;
    let db = env.db().await?;
    let old = seed(&db, OLD_ROWS, "old").await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;
    let live = insert_event(&db, "Live", "created", r#"{"live": 1}"#).await?;
    wait_for_id(&js, &live, &relay).await?;
    ensure!(
        stream_count(&js).await? == 1,
        "only the live row before the signal"
    );

    // The table holds the old rows and the live one (the backfill reads it too and leaves it
    // out: the stream has it). About four seconds of work at 1,000 rows/s; a second signal
    // while it runs.
    let in_table = OLD_ROWS + 1;
    let first = signal(
        &db,
        "backfill",
        r#"{"table": "outbox", "page_size": 200, "rate": 1000}"#,
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = signal(&db, "backfill", r#"{"table": "public.outbox"}"#).await?;
    let (first_rows, second_rows) =
        tokio::join!(follow(&db, first, &relay), follow(&db, second, &relay));
    let (first_rows, second_rows) = (first_rows?, second_rows?);

    let last = first_rows.last().context("rows seen")?;
    ensure!(last.state == "done", "first signal: {last:?}");
    let outcome = last.outcome.as_deref().unwrap_or_default();
    ensure!(
        outcome.contains(&format!("finished: {in_table} rows")),
        "outcome: {outcome}"
    );
    let progress = last.progress.as_ref().context("final progress")?;
    assert_eq!(progress["rows_done"], in_table, "{progress}");
    assert_eq!(progress["finished"], true, "{progress}");
    assert_eq!(progress["table"], "public.outbox", "{progress}");
    // Progress was written while it ran: a running row with some rows done, not all.
    let midway = first_rows.iter().any(|r| {
        r.state == "running"
            && r.progress.as_ref().is_some_and(|p| {
                p["rows_done"]
                    .as_i64()
                    .is_some_and(|n| n > 0 && n < in_table)
                    && p["rows_estimate"] == in_table
            })
    });
    ensure!(midway, "no progress seen midway: {first_rows:?}");

    // The second waited for the first, said so, and then found the table done.
    ensure!(
        second_rows.iter().any(|r| r.state == "requested"
            && r.progress
                .as_ref()
                .is_some_and(|p| p["waiting_behind"] == first)),
        "second signal never said it waits: {second_rows:?}"
    );
    let second_last = second_rows.last().context("second rows")?;
    ensure!(second_last.state == "done", "{second_last:?}");
    ensure!(
        second_last
            .outcome
            .as_deref()
            .is_some_and(|o| o.contains("had finished")),
        "{second_last:?}"
    );
    ensure!(
        second_last.finished_at > last.finished_at,
        "carried out in order: {last:?} then {second_last:?}"
    );

    // Every old row once, marked as a backfill; the cursor finished at the row count.
    let messages =
        wait_for_messages(&js, old.len() + 1, Duration::from_secs(30), Some(&relay)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = read_stream(&js).await?;
    let messages = if again.len() >= messages.len() {
        again
    } else {
        messages
    };
    let counts = copies(&messages);
    ensure!(
        old.iter().all(|id| counts.get(id.as_str()) == Some(&1)),
        "each old row exactly once"
    );
    ensure!(
        messages.len() == old.len() + 1,
        "nothing else: {}",
        messages.len()
    );
    for m in messages.iter().filter(|m| old.contains(m.id())) {
        assert_eq!(m.header("Outbox-Backfill"), "true", "{m:?}");
    }
    assert_eq!(cursor(&db).await?, Some((in_table, true)));

    // The relay streams on, and its checkpoint passes a row inserted after.
    let after = insert_event(&db, "Live", "created", r#"{"live": 2}"#).await?;
    wait_for_id(&js, &after, &relay).await?;
    let wal = env.current_wal().await?;
    env.wait_checkpoint(wal, Duration::from_secs(30)).await?;
    Ok(())
}

#[tokio::test]
async fn bad_signals_are_failed_rows_with_their_reason_and_the_relay_streams_on() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let config = env.config("");
    let mut relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;

    let cases = [
        ("snapshot", r#"{}"#, "unknown signal kind `snapshot`"),
        (
            "backfill",
            r#"{"tabel": "outbox"}"#,
            "unknown field `tabel`",
        ),
        ("backfill", r#"{}"#, "missing field `table`"),
        (
            "backfill",
            r#"{"table": "outbox", "page_size": 0}"#,
            "at least 1",
        ),
        ("restore", r#"{}"#, "missing field `from_lsn`"),
        // No replay_retention here: the slot keeps no WAL before its confirmed position.
        (
            "restore",
            r#"{"from_lsn": "0/1"}"#,
            "cannot restore from 0/1",
        ),
        (
            "replay",
            r#"{"from_lsn": "0/1"}"#,
            "missing field `consumer`",
        ),
        (
            "backfill",
            r#"{"table": "public.orders"}"#,
            "not configured as an outbox table",
        ),
        (
            "backfill",
            r#"{"table": "outbox", "where": "no_such_column > 1"}"#,
            "no_such_column",
        ),
    ];
    for (kind, args, reason) in cases {
        let id = signal(&db, kind, args).await?;
        let rows = follow(&db, id, &relay).await?;
        let last = rows.last().context("rows")?;
        ensure!(
            last.state == "failed",
            "{kind} {args}: {last:?}; log:\n{}",
            relay.log()
        );
        let error = last.error.as_deref().unwrap_or_default();
        ensure!(
            error.contains(reason),
            "{kind} {args}: error {error:?} lacks {reason:?}"
        );
    }
    ensure!(relay.try_status()?.is_none(), "the relay is still running");
    let id = insert_event(&db, "Live", "created", r#"{"after": "bad signals"}"#).await?;
    wait_for_id(&js, &id, &relay).await?;
    let wal = env.current_wal().await?;
    env.wait_checkpoint(wal, Duration::from_secs(30)).await?;
    Ok(())
}

/// A `where` that closes a parenthesis it did not open would take the page query's `OR` out of
/// the key range: the backfill would read the same page forever, and every later signal would
/// wait behind it. It is a failed row naming the filter and the fix; the next signal runs.
#[tokio::test]
async fn a_filter_leaving_its_parentheses_is_a_failed_signal_and_the_next_one_runs() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    seed(&db, 50, "old").await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;

    let escaping = signal(
        &db,
        "backfill",
        r#"{"table": "outbox", "where": "aggregateid = '1') OR (true", "page_size": 10}"#,
    )
    .await?;
    let valid = signal(
        &db,
        "backfill",
        r#"{"table": "outbox", "where": "aggregateid = '2' OR aggregateid = '3'", "page_size": 10}"#,
    )
    .await?;
    let rows = follow(&db, escaping, &relay).await?;
    let last = rows.last().context("rows")?;
    ensure!(last.state == "failed", "{last:?}; log:\n{}", relay.log());
    let error = last.error.as_deref().unwrap_or_default();
    ensure!(
        error.contains("`aggregateid = '1') OR (true` closes a parenthesis it did not open")
            && error.contains("give one condition"),
        "error {error:?}"
    );
    // The valid signal's backfill may have started since: no cursor is the escaping filter's.
    let escaping_cursors: i64 = db
        .query_one(
            "SELECT count(*) FROM outbox_relay.backfill WHERE filter LIKE '%OR (true%'",
            &[],
        )
        .await?
        .get(0);
    ensure!(
        escaping_cursors == 0,
        "the refused filter started no backfill"
    );

    let rows = follow(&db, valid, &relay).await?;
    let last = rows.last().context("rows")?;
    ensure!(last.state == "done", "{last:?}; log:\n{}", relay.log());
    let outcome = last.outcome.as_deref().unwrap_or_default();
    ensure!(outcome.contains("finished: 2 rows"), "outcome: {outcome}");
    let wanted: Vec<String> = db
        .query(
            "SELECT id::text FROM outbox WHERE aggregateid IN ('2', '3')",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let messages = wait_for_messages(&js, 2, Duration::from_secs(30), Some(&relay)).await?;
    let mut published: Vec<&str> = messages.iter().map(Received::id).collect();
    published.sort_unstable();
    let mut wanted: Vec<&str> = wanted.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    ensure!(
        published == wanted,
        "only the valid signal's rows: {published:?}"
    );

    // The relay streams on.
    let after = insert_event(&db, "Live", "created", r#"{"after": "escaping filter"}"#).await?;
    wait_for_id(&js, &after, &relay).await?;
    Ok(())
}

#[tokio::test]
async fn a_signal_running_when_the_relay_is_killed_resumes_at_its_next_start() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let old = seed(&db, OLD_ROWS, "old").await?;
    let config = env.config("");
    let mut relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;
    let id = signal(
        &db,
        "backfill",
        r#"{"table": "outbox", "page_size": 100, "rate": 800, "restart": true}"#,
    )
    .await?;

    // Kill it once the cursor holds some rows and not all.
    wait_until("the backfill under way", &relay, async || {
        Ok(cursor(&db)
            .await?
            .is_some_and(|(done, _)| done > 0 && done < OLD_ROWS / 2))
    })
    .await?;
    relay.kill9();
    let (done_at_kill, finished) = cursor(&db).await?.context("cursor")?;
    ensure!(
        !finished && done_at_kill < OLD_ROWS,
        "killed midway: {done_at_kill}"
    );
    let at_kill = row(&db, id).await?;
    ensure!(at_kill.state == "running", "{at_kill:?}");

    let relay = Relay::start_streaming(&config).await?;
    let rows = follow(&db, id, &relay).await?;
    let last = rows.last().context("rows")?;
    ensure!(last.state == "done", "{last:?}");
    assert!(
        relay.log().contains("resuming at"),
        "resumed at the cursor, not started over (restart is for the first claim only)"
    );
    let messages = wait_for_messages(&js, old.len(), Duration::from_secs(30), Some(&relay)).await?;
    let counts = copies(&messages);
    ensure!(
        old.iter().all(|id| counts.contains_key(id.as_str())),
        "every old row published"
    );
    // The rows in flight at the kill are re-sent and dropped by JetStream as duplicates.
    ensure!(counts.values().all(|n| *n == 1), "no row stored twice");
    assert_eq!(cursor(&db).await?, Some((OLD_ROWS, true)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_signal_moves_a_consumer_back_to_an_events_commit() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(insert_event(&db, "Order", "created", &format!(r#"{{"n": {n}}}"#)).await?);
    }
    let messages = wait_for_messages(&js, 5, Duration::from_secs(30), Some(&relay)).await?;
    js.get_stream(STREAM)
        .await?
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("billing".into()),
            ..Default::default()
        })
        .await?;
    ensure!(fetch_acked(&js, "billing", 5).await? == vec![1, 2, 3, 4, 5]);
    // Precondition: billing has acknowledged everything.
    let third = &messages[2];
    let lsn = third.header("Outbox-Commit-Lsn").to_owned();
    let version = js.client().server_info().version;
    let in_place = relay_nats::supports_consumer_reset(&version);

    let args = format!(r#"{{"consumer": "billing", "from_lsn": "{lsn}"}}"#);
    let id = signal(&db, "replay", &args).await?;
    let rows = follow(&db, id, &relay).await?;
    let mut last = rows.last().context("rows")?.clone();
    if !in_place {
        // nats-server before 2.14 cannot move it in place: refused until asked to re-create.
        ensure!(last.state == "failed", "{last:?}");
        ensure!(
            last.error
                .as_deref()
                .is_some_and(|e| e.contains("\"recreate\": true")),
            "{last:?}"
        );
        let args = format!(r#"{{"consumer": "billing", "from_lsn": "{lsn}", "recreate": true}}"#);
        let id = signal(&db, "replay", &args).await?;
        last = follow(&db, id, &relay)
            .await?
            .last()
            .context("rows")?
            .clone();
    }
    ensure!(last.state == "done", "{last:?}");
    let outcome = last.outcome.as_deref().unwrap_or_default();
    let did = if in_place {
        "reset durable consumer billing in place"
    } else {
        "deleted and re-created durable consumer billing"
    };
    ensure!(outcome.contains(did), "{outcome}");
    let progress = last.progress.as_ref().context("the range")?;
    assert_eq!(progress["from_sequence"], third.seq, "{progress}");
    assert_eq!(progress["messages"], 3, "{progress}");
    // Billing gets the third event again, then the rest.
    ensure!(fetch_acked(&js, "billing", 5).await? == vec![3, 4, 5]);
    let again = read_stream(&js).await?;
    ensure!(again.len() == 5, "nothing re-published: {}", again.len());
    ensure!(ids[2] == third.id(), "the third event");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restore_signal_brings_back_purged_events_from_the_wal() -> Result<()> {
    use crate::restore::{
        checkpoint_past, events, exactly_once_in_order, insert, retention_config,
    };
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let mut db = env.db().await?;
    let config = retention_config(&env);
    let relay = Relay::start_streaming(&config).await?;
    let window = insert(&mut db, 12, 3, "w").await?;
    let stored = wait_for_messages(&js, 12, Duration::from_secs(30), Some(&relay)).await?;
    let evs = events(&stored);
    let last = evs.iter().map(|e| e.lsn).max().unwrap_or_default();
    let checkpoint = checkpoint_past(&env, last).await?;
    js.get_stream(STREAM).await?.purge().await?;
    ensure!(stream_count(&js).await? == 0, "purged");
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let from = &evs[0].lsn_text;
    let id = signal(&db, "restore", &format!(r#"{{"from_lsn": "{from}"}}"#)).await?;
    let rows = follow(&db, id, &relay).await?;
    let done = rows.last().context("rows")?;
    ensure!(done.state == "done", "{done:?}");
    let outcome = done.outcome.as_deref().unwrap_or_default();
    ensure!(outcome.contains("published 12"), "{outcome}");
    let stored = wait_for_messages(&js, 12, Duration::from_secs(30), Some(&relay)).await?;
    exactly_once_in_order(&stored, &window);
    // The main slot and the stored checkpoint did not move back; the copy is gone.
    ensure!(env.checkpoint().await?.unwrap_or_default() >= checkpoint);
    let copies: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE '%restore%'",
            &[],
        )
        .await?
        .get(0);
    ensure!(copies == 0, "the restore's copy of the slot dropped");
    // The relay streams on.
    let after = insert_event(&db, "Order", "Created", "{}").await?;
    wait_for_id(&js, &after, &relay).await?;
    Ok(())
}
