//! The table-free outbox: events emitted with `pg_logical_emit_message` (through
//! `outbox_relay.emit_event`, migrations/0005) and published for a `[[messages]]` prefix.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::Signal;

use crate::faults::oracle::Verdict;
use crate::support::*;

const EX_DATAERR: i32 = 65;
const WAIT: Duration = Duration::from_secs(30);
/// One `[[messages]]` entry for the prefix `outbox` (at the end of a config).
const MESSAGES: &str = "\n[[messages]]\nprefix = \"outbox\"\n";

/// An LSN as PostgreSQL prints it.
fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// `outbox_relay.emit_event(...)` in `client`'s transaction; returns the message's LSN.
async fn emit_event(
    client: &impl tokio_postgres::GenericClient,
    id: &str,
    subject: &str,
    payload: &str,
    headers: &str,
) -> Result<u64> {
    let row = client
        .query_one(
            "SELECT (outbox_relay.emit_event('outbox', $1, $2, $3::text::jsonb, $4::text::jsonb) - '0/0')::bigint",
            &[&id, &subject, &payload, &headers],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// `pg_logical_emit_message(transactional, prefix, content)`; returns the message's LSN.
async fn emit_raw(
    client: &impl tokio_postgres::GenericClient,
    transactional: bool,
    prefix: &str,
    content: &str,
) -> Result<u64> {
    let row = client
        .query_one(
            "SELECT (pg_logical_emit_message($1, $2, $3::text) - '0/0')::bigint",
            &[&transactional, &prefix, &content],
        )
        .await?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// Rows and messages of one transaction arrive in the order they were written, numbered by one
/// `Outbox-Tx-Index`, with the transaction's headers; a message of another prefix is skipped
/// and counted; a rolled-back transaction's message never arrives.
#[tokio::test(flavor = "multi_thread")]
async fn messages_and_rows_of_one_transaction_arrive_in_order_with_their_headers() -> Result<()> {
    let env = Env::start().await?;
    let (http, addr) = http_listen();
    let relay = Relay::start_streaming(&env.config(&format!("{MESSAGES}{http}"))).await?;
    let js = env.jetstream().await?;

    let mut a = env.db().await?;
    let tx = a.transaction().await?;
    let xid: String = tx
        .query_one("SELECT (txid_current() % 4294967296)::text", &[])
        .await?
        .get(0);
    let r1 = insert_event(&tx, "Order", "Created", r#"{"row": 1}"#).await?;
    let m1_lsn = emit_event(
        &tx,
        "m-1",
        "outbox.msg.created",
        r#"{"n": 1, "text": "ünï 😀"}"#,
        r#"{"Outbox-Event-Type": "created", "Tenant": "t-7"}"#,
    )
    .await?;
    emit_raw(&tx, true, "someone-else", "not ours, not even JSON").await?;
    let r2 = insert_event(&tx, "Order", "Paid", r#"{"row": 2}"#).await?;
    emit_raw(
        &tx,
        true,
        "outbox",
        r#"{"id": "m-2", "subject": "outbox.msg.raw", "payload": "plain text body"}"#,
    )
    .await?;
    tx.commit().await?;

    // Rolled back: its transactional message is never decoded.
    let tx = a.transaction().await?;
    emit_event(&tx, "m-rolled-back", "outbox.msg.never", "{}", "{}").await?;
    insert_event(&tx, "Order", "Never", "{}").await?;
    tx.rollback().await?;

    emit_event(&a, "m-last", "outbox.msg.last", "null", "{}").await?;
    let got = wait_for_id(&js, "m-last", &relay).await?;
    let ids: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(ids, [r1.as_str(), "m-1", r2.as_str(), "m-2", "m-last"]);

    let tx_msgs = &got[..4];
    let commit_lsn = tx_msgs[0].header("Outbox-Commit-Lsn");
    for (i, m) in tx_msgs.iter().enumerate() {
        assert_eq!(m.header("Outbox-Commit-Lsn"), commit_lsn, "{m:?}");
        assert_eq!(m.header("Outbox-Xid"), xid, "{m:?}");
        assert_eq!(m.header("Outbox-Tx-Index"), i.to_string(), "{m:?}");
        assert_eq!(m.header("Nats-Expected-Stream"), STREAM, "{m:?}");
        assert!(!m.header("Outbox-Commit-Time").is_empty(), "{m:?}");
    }
    assert!(parse_lsn(commit_lsn).expect("lsn") > m1_lsn);
    let (m1, m2) = (&got[1], &got[3]);
    assert_eq!(m1.subject, "outbox.msg.created");
    assert_eq!(m1.header("Outbox-Message-Prefix"), "outbox");
    assert_eq!(m1.header("Outbox-Event-Type"), "created");
    assert_eq!(m1.header("Tenant"), "t-7");
    assert!(!m1.headers.contains_key("Outbox-Table"), "{m1:?}");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&m1.payload)?,
        serde_json::json!({"n": 1, "text": "ünï 😀"})
    );
    assert_eq!(m2.subject, "outbox.msg.raw");
    assert_eq!(m2.payload, b"plain text body");
    assert_eq!(got[0].header("Outbox-Table"), "public.outbox");
    assert!(got[4].payload.is_empty(), "a null payload is an empty body");
    assert!(got.iter().all(|m| m.id() != "m-rolled-back"));
    let skipped = wait_metric(
        &addr,
        "outbox_relay_messages_skipped_total",
        Duration::from_secs(10),
        |n| n >= 1.0,
    )
    .await;
    assert_eq!(skipped, Some(1.0), "{}", relay.log());
    Ok(())
}

/// A non-transactional message is delivered even when its transaction rolls back: refused by
/// default (exit 65 naming prefix and LSN, nothing confirmed past it, the committed transaction
/// before it confirmed), published in its place in commit order once allowed, and then
/// confirmed past.
#[tokio::test(flavor = "multi_thread")]
async fn a_non_transactional_message_is_refused_by_default_and_delivered_when_allowed() -> Result<()>
{
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let db = env.db().await?;
    let mut relay = Relay::start_streaming(&env.config(MESSAGES)).await?;
    let before = insert_event(&db, "Order", "Before", "{}").await?;
    let got = wait_for_id(&js, &before, &relay).await?;
    let before_commit = parse_lsn(got[0].header("Outbox-Commit-Lsn")).expect("lsn");

    let mut c = env.db().await?;
    let tx = c.transaction().await?;
    let lsn = emit_raw(
        &tx,
        false,
        "outbox",
        r#"{"id": "n-1", "subject": "outbox.nontx.n1", "payload": {"rolled": "back"}}"#,
    )
    .await?;
    tx.rollback().await?;
    let after = insert_event(&db, "Order", "After", "{}").await?;

    let log = expect_exit(
        &mut relay,
        EX_DATAERR,
        WAIT,
        &[
            "prefix `outbox`",
            &format!("at LSN {}", lsn_text(lsn)),
            "non-transactional",
            "allow_non_transactional",
            "Every restart stops at this same message",
            "dead_letter_subject",
        ],
    )
    .await?;
    // The cause and the fixes lead, not "fix the mapping".
    let first_error = log
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(
        first_error.contains("non-transactional logical message")
            && first_error.contains("allow_non_transactional"),
        "{log}"
    );
    assert!(!log.contains("fix the mapping"), "{log}");
    let checkpoint = env.checkpoint().await?.context("checkpoint")?;
    let slot = env.slot_confirmed().await?.context("slot")?;
    println!(
        "refused at {}: checkpoint {}, slot {}, commit before it {}",
        lsn_text(lsn),
        lsn_text(checkpoint),
        lsn_text(slot),
        lsn_text(before_commit)
    );
    assert!(
        checkpoint <= lsn && slot <= lsn,
        "checkpoint {} / slot {} past the refused message at {}:\n{log}",
        lsn_text(checkpoint),
        lsn_text(slot),
        lsn_text(lsn)
    );
    assert!(
        checkpoint > before_commit && slot > before_commit,
        "the transaction before it is confirmed: checkpoint {} slot {} commit {}",
        lsn_text(checkpoint),
        lsn_text(slot),
        lsn_text(before_commit)
    );
    let got = read_stream(&js).await?;
    assert_eq!(got.iter().map(Received::id).collect::<Vec<_>>(), [&before]);

    let allowed =
        env.config("\n[[messages]]\nprefix = \"outbox\"\nallow_non_transactional = true\n");
    let mut relay = Relay::start(&allowed)?;
    let got = wait_for_id(&js, &after, &relay).await?;
    let ids: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(ids, [before.as_str(), "n-1", after.as_str()]);
    let n1 = &got[1];
    assert_eq!(n1.header("Outbox-Xid"), "0");
    assert_eq!(n1.header("Outbox-Commit-Lsn"), lsn_text(lsn));
    assert_eq!(n1.header("Outbox-Tx-Index"), "0");
    assert_eq!(n1.header("Outbox-Message-Prefix"), "outbox");
    assert_eq!(n1.subject, "outbox.nontx.n1");
    env.wait_checkpoint(lsn + 1, WAIT)
        .await
        .context("never confirmed past the message")?;
    relay.signal(Signal::SIGTERM);
    assert_eq!(
        relay.wait_exit(WAIT).await?.code(),
        Some(0),
        "{}",
        relay.log()
    );
    Ok(())
}

/// A message whose content is no envelope is a bad row: the relay stops before its transaction
/// (exit 65 naming prefix, LSN and the problem; nothing of the transaction published), and with
/// a dead-letter subject the raw content goes there and the rest flows.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_envelope_fails_closed_or_is_dead_lettered() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let db = env.db().await?;
    let mut relay = Relay::start_streaming(&env.config(MESSAGES)).await?;
    let first = insert_event(&db, "Order", "First", "{}").await?;
    wait_for_id(&js, &first, &relay).await?;

    let mut c = env.db().await?;
    let tx = c.transaction().await?;
    let row = insert_event(&tx, "Order", "SameTx", "{}").await?;
    let bad = emit_raw(&tx, true, "outbox", "{not json").await?;
    tx.commit().await?;
    let after = insert_event(&db, "Order", "After", "{}").await?;

    let log = expect_exit(
        &mut relay,
        EX_DATAERR,
        WAIT,
        &[
            "prefix `outbox`",
            &format!("at LSN {}", lsn_text(bad)),
            "not a JSON object",
            "stopped before this transaction",
        ],
    )
    .await?;
    let (checkpoint, slot, _) = assert_not_confirmed_past(&env, &log, "cannot route").await?;
    assert!(checkpoint > 0 && slot > 0, "a checkpoint and a slot");
    // Rows of the transaction before the message may have been sent (as with a bad row, the
    // relay publishes as it reads): they are re-sent after the restart and deduplicated.
    let got = read_stream(&js).await?;
    assert!(
        got.iter().all(|m| m.id() != after),
        "published past the bad message"
    );

    let dead_letter = env.config(&format!("dead_letter_subject = \"outbox.dlq\"\n{MESSAGES}"));
    let relay = Relay::start(&dead_letter)?;
    let got = wait_for_id(&js, &after, &relay).await?;
    let ids: Vec<&str> = got.iter().map(Received::id).collect();
    let dead_id = format!("dlq:message:outbox:{}", lsn_text(bad));
    assert_eq!(
        ids,
        [first.as_str(), row.as_str(), &dead_id, after.as_str()]
    );
    let dead = &got[2];
    assert_eq!(dead.subject, "outbox.dlq");
    assert_eq!(dead.payload, b"{not json", "the raw content");
    assert_eq!(dead.header("Outbox-Message-Prefix"), "outbox");
    assert_eq!(dead.header("Outbox-Tx-Index"), "1");
    assert!(
        dead.header("Outbox-Dlq-Reason")
            .contains("not a JSON object"),
        "{dead:?}"
    );
    Ok(())
}

/// Writers emitting messages (and now and then an outbox row) in transactions, some rolled
/// back; each committed message's id is also written to a table in the same transaction, which
/// is the oracle's truth.
async fn message_load(
    env: &Env,
    writers: usize,
) -> Result<(
    tokio::sync::watch::Sender<bool>,
    Vec<tokio::task::JoinHandle<()>>,
)> {
    env.db()
        .await?
        .batch_execute("CREATE TABLE emitted (id text PRIMARY KEY)")
        .await?;
    let (stop, _) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let url = env.pg.url(DB);
        let stopped = stop.subscribe();
        tasks.push(tokio::spawn(async move {
            let Ok((mut client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await
            else {
                return;
            };
            tokio::spawn(conn);
            let mut n: u64 = 0;
            while !*stopped.borrow() {
                n += 1;
                let rollback = n.is_multiple_of(13);
                let result = async {
                    let tx = client.transaction().await?;
                    for k in 0..(1 + n % 4) {
                        let id = format!("w{w}-{n}-{k}");
                        tx.execute("INSERT INTO emitted (id) VALUES ($1)", &[&id]).await?;
                        tx.execute(
                            "SELECT outbox_relay.emit_event('outbox', $1, 'outbox.load.w' || $2::text, jsonb_build_object('n', $3::bigint))",
                            &[&id, &(w as i64).to_string(), &(n as i64)],
                        )
                        .await?;
                    }
                    if n.is_multiple_of(5) {
                        tx.execute(
                            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                             VALUES (gen_random_uuid(), 'Load', $1, 'Row', '{}')",
                            &[&format!("w{w}")],
                        )
                        .await?;
                    }
                    if rollback {
                        tx.rollback().await
                    } else {
                        tx.commit().await
                    }
                }
                .await;
                if result.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }));
    }
    Ok((stop, tasks))
}

/// Fault scenario M1: ten kill -9 of the relay under message traffic (half as soon as
/// publishes are outstanding, half at random moments), then a last start: every committed
/// message (and row) exactly once by id, nothing of a rolled-back transaction.
#[tokio::test(flavor = "multi_thread")]
async fn kill9_loop_over_message_traffic_delivers_every_committed_message_once() -> Result<()> {
    let env = Env::start().await?;
    kill9_loop(
        &env,
        "create_stream = true",
        "M1 kill -9 loop over message traffic (10 kills)",
    )
    .await
}

/// The kill -9 loop of M1 with `nats_extra` in `[nats]`; reports the verdict as `scenario`.
pub(crate) async fn kill9_loop(env: &Env, nats_extra: &str, scenario: &str) -> Result<()> {
    const OUTSTANDING: &str = "outbox_relay_outstanding_acks";
    let (http, addr) = http_listen();
    let config = env.config_full(nats_extra, &format!("{MESSAGES}{http}"));
    // The slot must exist before the first write.
    Relay::start_streaming(&config).await?.kill9();
    let (stop, tasks) = message_load(env, 2).await?;
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut outstanding = Vec::new();
    for kill in 0..10 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut relay = Relay::start_streaming(&config).await?;
        let n = if kill % 2 == 0 {
            wait_metric(&addr, OUTSTANDING, Duration::from_secs(3), |n| n > 0.0).await
        } else {
            tokio::time::sleep(Duration::from_millis(seed % 600)).await;
            metric(&addr, OUTSTANDING).await.ok()
        };
        relay.kill9();
        outstanding.push(n.unwrap_or(0.0) as u64);
    }
    let _ = stop.send(true);
    for t in tasks {
        let _ = t.await;
    }
    let relay = Relay::start_streaming(&config).await?;

    // The truth: committed message ids and outbox row ids.
    let db = env.db().await?;
    let mut committed: HashSet<String> = db
        .query("SELECT id FROM emitted", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let messages = committed.len();
    committed.extend(
        db.query("SELECT id::text FROM outbox", &[])
            .await?
            .iter()
            .map(|r| r.get::<_, String>(0)),
    );
    let js = env.jetstream().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (counts, stored) = loop {
        let stored = read_stream(&js).await?;
        let mut counts: HashMap<String, usize> = HashMap::new();
        for m in &stored {
            *counts.entry(m.id().to_owned()).or_default() += 1;
        }
        if committed.iter().all(|id| counts.contains_key(id)) || Instant::now() > deadline {
            break (counts, stored);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let with_outstanding = outstanding.iter().filter(|&&n| n > 0).count();
    let mut v = Verdict::from_counts(
        scenario,
        &committed,
        &counts,
        false,
        &format!(
            "{messages} messages + {} rows committed; publishes outstanding at {with_outstanding}/10 kills (max {})",
            committed.len() - messages,
            outstanding.iter().max().unwrap_or(&0)
        ),
    );
    v.require(
        (0..10).step_by(2).all(|k| outstanding[k] > 0),
        format!("publishes outstanding at the 5 kills that wait for them: {outstanding:?}"),
    );
    v.judge_order(&db, &stored).await?;
    v.require(messages > 0, "messages committed");
    v.assert_with_log(&relay.log());
    Ok(())
}
