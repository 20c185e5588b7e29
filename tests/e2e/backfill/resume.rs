//! A backfill killed (kill -9) or stopped (SIGTERM) resumes at its stored cursor.

use super::*;

/// A backfill slowed to 2,000 rows/s, so that a kill or a stop lands in its middle.
const SLOW_BACKFILL: &[&str] = &[
    "backfill",
    "--table",
    "outbox",
    "--rate",
    "2000",
    "--page-size",
    "200",
];

/// kill -9 in the middle: the cursor is stored (between the first and last key), and the next
/// run resumes there instead of starting over; so does a run after one stopped by SIGTERM (exit
/// 130); the last completes with every row once.
/// How long each step of the scenario may take.
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn killed_backfill_resumes_at_its_cursor() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let rows = 20_000;
    let old = seed(&db, rows, "created").await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;

    // Slowed down (2,000 rows/s) so the kill lands in the middle.
    let mut first = Relay::start_with_args(&config, SLOW_BACKFILL)?;
    let at_kill = first
        .poll_while_running(WAIT, "the cursor at 2,000 rows", async || {
            Ok(match cursor(&db).await? {
                Some((Some(last), Some(end), done, _)) if done >= 2_000 => Some((last, end, done)),
                _ => None,
            })
        })
        .await?;
    first.kill9();
    let (last, end, done) = at_kill;
    // Precondition: the kill landed strictly between the first and the last key.
    let between: bool = db
        .query_one(
            "SELECT $1::text::uuid > (SELECT id FROM outbox ORDER BY id LIMIT 1) AND $1::text::uuid < $2::text::uuid",
            &[&last, &end],
        )
        .await?
        .get(0);
    assert!(between, "cursor {last} between the first key and {end}");
    assert!(done < rows, "killed before the end: {done} rows done");
    let (last_after, _, done_after, finished) = cursor(&db).await?.context("cursor row")?;
    assert!(!finished);
    assert!(done_after >= done && last_after.is_some());

    // A second run, stopped by SIGTERM: it resumes, stores its cursor further on, exits 130.
    let mut second = Relay::start_with_args(&config, SLOW_BACKFILL)?;
    second
        .poll_while_running(WAIT, "the cursor 2,000 rows further", async || {
            let done = cursor(&db).await?.map_or(0, |c| c.2);
            Ok((done >= done_after + 2_000).then_some(()))
        })
        .await?;
    second.signal(nix::sys::signal::Signal::SIGTERM);
    expect_exit(
        &mut second,
        130,
        Duration::from_secs(20),
        &["resuming at", "stopped on request"],
    )
    .await?;
    let (_, _, done_after, finished) = cursor(&db).await?.context("cursor row")?;
    assert!(
        !finished && done_after < rows,
        "stopped before the end: {done_after}"
    );
    // `status` shows where the stopped backfill is.
    let shown = backfill_status(&config).await?;
    ensure!(
        shown["table"] == "public.outbox"
            && shown["state"] == "running"
            && shown["rows_done"].as_i64() == Some(done_after)
            && shown["finished_at"].is_null(),
        "status while stopped at {done_after}: {shown}"
    );

    // The third run resumes (without reading the stream's ids, which would hide a restart
    // from scratch) and reads only what was left.
    let log = backfill(
        &config,
        &["--table", "outbox", "--skip-check-limit", "0"],
        0,
        Duration::from_secs(40),
        &["resuming at", "finished:"],
    )
    .await?;
    let read = rows_read(&log).context("summary line")?;
    assert!(
        read <= (rows - done_after) as u64,
        "third run read {read} rows; {done_after} of {rows} were done: it started over\n{log}"
    );
    expect_each_once(&env, &old, &relay).await?;
    let (_, _, _, finished) = cursor(&db).await?.context("cursor row")?;
    assert!(finished);
    let shown = backfill_status(&config).await?;
    ensure!(
        shown["state"] == "finished" && shown["rows_done"].as_i64() >= Some(rows),
        "status once finished: {shown}"
    );
    // Finished: another run does nothing.
    backfill(
        &config,
        &["--table", "outbox"],
        0,
        Duration::from_secs(20),
        &["--restart runs it again"],
    )
    .await?;
    Ok(())
}

/// The one backfill `status --json` reports.
async fn backfill_status(config: &std::path::Path) -> Result<serde_json::Value> {
    let out = relay_cmd(config, &["status", "--json"]).await?;
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("status --json: {}", String::from_utf8_lossy(&out.stderr)))?;
    let backfills = doc["backfills"].as_array().context("status: backfills")?;
    ensure!(backfills.len() == 1, "status: {}", doc["backfills"]);
    Ok(backfills[0].clone())
}
