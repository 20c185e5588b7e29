//! The backfill's read snapshot, and its watch of the relay's live messages until the relay
//! caught up with it.

use super::*;

/// The backfill reads the table as it was when it began (one snapshot for every page), and
/// watches the relay's live messages only until the relay's checkpoint passes that snapshot:
/// - rows committed before the backfill began that the relay publishes only after it began (the
///   relay was behind) are stored once even when the backfill reaches them after the duplicate
///   window: the watch saw them and the backfill skips them;
/// - rows committed after it began are the relay's: the pages never return them;
/// - the watch ends once the relay caught up, so the backfill stops receiving a copy of every
///   message it publishes.
///
/// (A 3 s window and a backfill slowed to take about 8 s.)
#[tokio::test(flavor = "multi_thread")]
async fn backfill_reads_one_snapshot_and_skips_what_the_lagging_relay_published() -> Result<()> {
    use nix::sys::signal::Signal;

    let env = Env::start().await?;
    let db = env.db().await?;
    let old = seed(&db, 8_000, "created").await?;
    let config = env.config_full("create_stream = true\nduplicate_window = \"3s\"", "");
    let relay = Relay::start_streaming(&config).await?;
    // The relay falls behind: these rows are committed before the backfill begins and published
    // by the relay only after.
    relay.pause()?;
    let lagging = seed(&db, 300, "lagging").await?;
    let lagging_commit = env.current_wal().await?;
    let run = {
        let config = config.clone();
        tokio::spawn(async move {
            backfill(
                &config,
                &["--table", "outbox", "--rate", "1000", "--page-size", "100"],
                0,
                Duration::from_secs(60),
                &["finished:"],
            )
            .await
        })
    };
    // The relay is stopped: a message in the stream is the backfill's, which began reading.
    let js = env.jetstream().await?;
    wait_for_messages(&js, 1, Duration::from_secs(30), None).await?;
    let checkpoint = env.checkpoint().await?.unwrap_or(0);
    ensure!(
        checkpoint < lagging_commit,
        "precondition: the relay had not published the lagging rows when the backfill began (checkpoint {checkpoint:X}, their commit before {lagging_commit:X})"
    );
    let after = seed(&db, 200, "after").await?;
    relay.signal(Signal::SIGCONT);
    let log = run.await??;

    // Old and lagging rows, not the rows committed after the snapshot.
    assert_eq!(rows_read(&log), Some(8_300), "{log}");
    assert!(
        log.contains("no longer watching its live messages"),
        "the watch ended once the relay caught up: {log}"
    );
    let at = log.rfind(" skipped ").context("summary")? + " skipped ".len();
    let skipped: u64 = log[at..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("skipped count")?;
    ensure!(
        (1..=300).contains(&skipped),
        "lagging rows the relay published first are skipped: {skipped}"
    );
    let all: HashSet<String> = old.union(&lagging).chain(&after).cloned().collect();
    expect_each_once(&env, &all, &relay).await?;
    // Positions: the relay confirmed past every row it published.
    let after_commit = env.current_wal().await?;
    let relay_at = env
        .wait_checkpoint(after_commit, Duration::from_secs(30))
        .await?;
    let slot = env.slot_confirmed().await?.context("slot")?;
    ensure!(
        slot <= relay_at,
        "slot {slot:X} not past the checkpoint {relay_at:X}"
    );
    Ok(())
}
