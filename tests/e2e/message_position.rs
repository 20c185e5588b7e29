//! Where the checkpoint stops after a non-transactional logical message, against a real
//! PostgreSQL: pgoutput reports the message at the end of its WAL record, which is where the next
//! record starts, often the commit record of the transaction the message was emitted in. A
//! checkpoint past the message's LSN would make a restart skip that transaction (PostgreSQL
//! skips every transaction whose commit record starts before the resume point).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);
/// Rows of the transaction the message is emitted in: with one publish in flight at a time
/// they take long enough that a checkpoint is stored while most are unacknowledged.
const ROWS: usize = 3_000;

/// What one attempt found before and at the kill.
struct Killed {
    message_lsn: u64,
    checkpoint_at_kill: u64,
    rows_stored_at_kill: usize,
    row_ids: Vec<String>,
}

/// One attempt: a relay publishing one message at a time; in one transaction `ROWS` outbox rows
/// and then a non-transactional message; kill -9 once a checkpoint at or past the message was
/// stored. `None` when the scenario's precondition did not hold (another WAL record between the
/// message and the commit record, or the transaction finished before the kill).
async fn kill_after_the_message(env: &Env, relay: &mut Relay) -> Result<Option<Killed>> {
    let js = env.jetstream().await?;
    let mut c = env.db().await?;
    let tx = c.transaction().await?;
    let rows = tx
        .query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Order', '1', 'Placed', '{}'::jsonb \
             FROM generate_series(1, $1::int) RETURNING id::text",
            &[&(ROWS as i32)],
        )
        .await?;
    let row_ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let message_lsn = tx
        .query_one(
            "SELECT (pg_logical_emit_message(false, 'outbox', \
             '{\"id\": \"nontx-1\", \"subject\": \"outbox.nontx.n1\", \"payload\": {}}') - '0/0')::bigint",
            &[],
        )
        .await?
        .get::<_, i64>(0) as u64;
    tx.commit().await?;

    let deadline = Instant::now() + WAIT;
    let checkpoint_at_kill = loop {
        let checkpoint = env.checkpoint().await?.unwrap_or(0);
        if checkpoint >= message_lsn {
            relay.kill9();
            break checkpoint;
        }
        if Instant::now() > deadline {
            bail!(
                "the checkpoint never reached the message at {message_lsn:X}; log:\n{}",
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let stored = read_stream(&js).await?;
    let rows_stored_at_kill = stored.iter().filter(|m| m.id() != "nontx-1").count();
    // The transaction's commit record must start where the message's record ends.
    let commit_lsn = stored
        .iter()
        .find(|m| m.id() != "nontx-1")
        .and_then(|m| parse_lsn(m.header("Outbox-Commit-Lsn")));
    println!(
        "message at {message_lsn:X}, the transaction's commit record at {commit_lsn:X?}, checkpoint at the kill {checkpoint_at_kill:X}, {rows_stored_at_kill} of {ROWS} rows stored"
    );
    if commit_lsn != Some(message_lsn) || rows_stored_at_kill >= ROWS {
        return Ok(None);
    }
    Ok(Some(Killed {
        message_lsn,
        checkpoint_at_kill,
        rows_stored_at_kill,
        row_ids,
    }))
}

/// Kill -9 while the transaction right behind an acknowledged non-transactional message is
/// being published, with a checkpoint already stored at the message: the restart must publish
/// the whole transaction (a checkpoint one byte past the message would skip it), and the
/// checkpoint must never have passed the message before the transaction was acknowledged.
#[tokio::test(flavor = "multi_thread")]
async fn a_kill_after_a_non_transactional_message_never_skips_the_transaction_behind_it()
-> Result<()> {
    let extra =
        "max_in_flight = 1\n\n[[messages]]\nprefix = \"outbox\"\nallow_non_transactional = true\n";
    // Another backend's WAL record can land between the message and the commit record, or the
    // transaction can finish before the kill: then the scenario is set up again.
    for attempt in 1..=3 {
        let env = Env::start().await?;
        let config = env.config(extra);
        let mut relay = Relay::start_streaming(&config).await?;
        let Some(killed) = kill_after_the_message(&env, &mut relay).await? else {
            println!("attempt {attempt}: precondition not reached, setting the scenario up again");
            continue;
        };
        let relay = Relay::start_streaming(&config).await?;
        let db = env.db().await?;
        let sentinel = insert_event(&db, "Order", "After", "{}").await?;
        let js = env.jetstream().await?;
        let got = wait_for_id(&js, &sentinel, &relay).await?;
        let ids: Vec<&str> = got.iter().map(Received::id).collect();
        let unique: HashSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), ids.len(), "a duplicate was stored");
        let missing: Vec<&String> = killed
            .row_ids
            .iter()
            .filter(|id| !unique.contains(id.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{} of the transaction's {ROWS} rows never arrived after the restart (checkpoint at the kill {:X}); log:\n{}",
            missing.len(),
            killed.checkpoint_at_kill,
            relay.log()
        );
        assert!(unique.contains("nontx-1"));
        // The checkpoint stood at the message, not past its transaction's commit record, while
        // most of the transaction was unacknowledged.
        assert_eq!(
            killed.checkpoint_at_kill, killed.message_lsn,
            "the checkpoint passed the message's LSN while {} of {ROWS} rows were stored",
            killed.rows_stored_at_kill
        );
        let checkpoint = env
            .wait_checkpoint(killed.message_lsn + 1, WAIT)
            .await
            .context("the checkpoint never moved past the transaction")?;
        assert!(checkpoint > killed.message_lsn);
        return Ok(());
    }
    bail!("the scenario's precondition was not reached in three attempts")
}
