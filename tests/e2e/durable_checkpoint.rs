//! The stored checkpoint is durable whatever the server's `synchronous_commit`: the relay
//! confirms a position to the slot only after storing it, so a stored checkpoint that a crash
//! takes back would leave the slot ahead of it (exit 65) or re-send what was acknowledged.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::Signal;
use relay_core::Lsn;
use relay_testkit::PgOptions;

use crate::support::*;

/// The positions the relay logged as stored and confirmed (`checkpoint stored and confirmed
/// lsn=…`), in order.
fn reported_checkpoints(log: &str) -> Vec<Lsn> {
    log.lines()
        .filter(|l| l.contains("checkpoint stored and confirmed"))
        .filter_map(|l| {
            l.split("lsn=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// With `synchronous_commit = off` on the server (and a WAL writer that flushes only every
/// 10 s), a checkpoint the relay reported as stored survives `pg_ctl stop -m immediate`.
#[tokio::test(flavor = "multi_thread")]
async fn reported_checkpoint_survives_an_immediate_stop_with_synchronous_commit_off() -> Result<()>
{
    let mut env = Env::start_with_pg(PgOptions {
        settings: vec![
            ("synchronous_commit".into(), "off".into()),
            ("wal_writer_delay".into(), "10s".into()),
        ],
        ..Default::default()
    })
    .await?;
    let js = env.jetstream().await?;
    let relay = Relay::start_streaming(&env.config("")).await?;
    let db = env.db().await?;
    // The test's own commits are flushed, so the walsender sees the event at once.
    db.batch_execute("SET synchronous_commit = on").await?;
    let id = insert_event(&db, "Order", "Created", "{}").await?;
    let got = wait_for_id(&js, &id, &relay).await?;
    let commit: Lsn = got
        .iter()
        .find(|m| m.id() == id)
        .context("event")?
        .header("Outbox-Commit-Lsn")
        .parse()?;

    let deadline = Instant::now() + Duration::from_secs(20);
    while reported_checkpoints(&relay.log())
        .last()
        .is_none_or(|l| *l <= commit)
    {
        if Instant::now() > deadline {
            bail!(
                "no checkpoint past {commit} reported; log:\n{}",
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Freeze the relay so it stores nothing more, then crash PostgreSQL.
    relay.pause()?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reported = *reported_checkpoints(&relay.log())
        .last()
        .context("reported")?;
    let stored = Lsn(env.checkpoint().await?.context("stored")?);
    assert!(stored >= reported, "stored {stored} < reported {reported}");
    env.pg.crash().await?;
    env.pg.start_again().await?;
    let after = Lsn(env.checkpoint().await?.context("after restart")?);
    println!(
        "event committed at {commit}; reported {reported}; stored {stored}; after the crash {after}"
    );
    assert_eq!(
        after, stored,
        "the checkpoint the relay stored (and reported as {reported}) was lost by the crash"
    );
    relay.signal(Signal::SIGKILL);
    Ok(())
}
