//! Rows too large for the NATS server (docs/bad-rows.md, "Too large for NATS"): a subject that
//! makes the publish control line longer than the server's `max_control_line`, a header block
//! over JetStream's 64 KiB, a payload over `max_payload`. Each used to make the server close the
//! connection (or refuse the PubAck) on every re-send, forever; now the row fails closed before
//! its transaction (exit 65) or goes to the dead-letter subject. And a publish the server keeps
//! answering by closing the connection is given up on after `[nats] max_server_closes` tries.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use relay_core::message::OutboundMessage;
use relay_core::route::MessageLimits;
use relay_core::stage::{PublishErrorKind, Publisher};
use relay_nats::JetStreamPublisher;

use crate::support::*;

const EX_DATAERR: i32 = 65;
/// Long enough for a relay that stops on its own, far shorter than an endless retry loop.
const WAIT: Duration = Duration::from_secs(45);
/// A subject column value that makes `outbox.l.<value>` longer than the 4 KB control line.
const LONG: usize = 5_000;

const MAPPING: &str = r#"
[[outbox]]
table = "public.limits_outbox"
event_id = "id"
subject = "outbox.l.{kind}"
payload = "payload"
headers = { "Note" = "note" }

[[outbox]]
table = "public.outbox"
"#;

async fn create_table(db: &tokio_postgres::Client) -> Result<()> {
    db.batch_execute(
        "CREATE TABLE limits_outbox (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id text NOT NULL,
            kind text NOT NULL,
            note text,
            payload text
        )",
    )
    .await?;
    Ok(())
}

/// One row in its own transaction.
async fn insert(
    db: &tokio_postgres::Client,
    id: &str,
    kind: &str,
    note: Option<&str>,
) -> Result<()> {
    db.execute(
        "INSERT INTO limits_outbox (id, kind, note, payload) VALUES ($1, $2, $3, '{}')",
        &[&id, &kind, &note],
    )
    .await?;
    Ok(())
}

/// Stops at the bad row within `WAIT`, exit 65 naming `needles`; the checkpoint and the slot
/// stay at or before the bad transaction's commit; the later row is not in the stream.
async fn assert_stopped_before(
    env: &Env,
    relay: &mut Relay,
    bad_id: &str,
    later_id: &str,
    needles: &[&str],
) -> Result<()> {
    let started = Instant::now();
    let log = expect_exit(relay, EX_DATAERR, WAIT, needles).await?;
    let reason = log.lines().find(|l| l.contains("too large to publish"));
    println!(
        "{bad_id}: stopped after {:?}: {reason:?}",
        started.elapsed()
    );
    let event = format!("(event id {bad_id})");
    let (checkpoint, slot, _) = assert_not_confirmed_past(env, &log, &event).await?;
    assert!(checkpoint > 0 && slot > 0);
    let js = env.jetstream().await?;
    let got = read_stream(&js).await?;
    assert!(got.iter().all(|m| m.id() != bad_id), "{bad_id} published");
    assert!(
        got.iter().all(|m| m.id() != later_id),
        "{later_id} was published around the stuck row"
    );
    Ok(())
}

/// A 5,000-character subject value: without a dead-letter subject the relay stops before the
/// row's transaction (exit 65 naming table, event id, column and the limit) instead of having
/// its connection closed by the server on every re-send; with one, the row is dead-lettered
/// and later rows flow.
#[tokio::test(flavor = "multi_thread")]
async fn an_over_long_subject_fails_closed_or_is_dead_lettered() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    create_table(&db).await?;
    let js = env.jetstream().await?;
    let long = "k".repeat(LONG);

    let mut relay = Relay::start_streaming(&env.config(MAPPING)).await?;
    insert(&db, "before", "ok", None).await?;
    wait_for_id(&js, "before", &relay).await?;
    insert(&db, "ev-long-subject", &long, None).await?;
    insert(&db, "after", "ok", None).await?;
    assert_stopped_before(
        &env,
        &mut relay,
        "ev-long-subject",
        "after",
        &[
            "public.limits_outbox",
            "ev-long-subject",
            "column `kind`",
            "max_control_line",
            "4096",
            "stopped before this transaction",
        ],
    )
    .await?;

    // Resumed with a dead-letter subject: the row goes there, the later one is delivered, and
    // the relay keeps running.
    let dead_letter = env.config(&format!("dead_letter_subject = \"outbox.dlq\"\n{MAPPING}"));
    let mut relay = Relay::start(&dead_letter)?;
    let got = wait_for_id(&js, "after", &relay).await?;
    let dead: Vec<&Received> = got.iter().filter(|m| m.subject == "outbox.dlq").collect();
    assert_eq!(dead.len(), 1, "one dead letter: {:?}", dead);
    let reason = dead[0].header("Outbox-Dlq-Reason");
    for needle in ["ev-long-subject", "column `kind`", "max_control_line"] {
        assert!(reason.contains(needle), "reason {reason:?}");
    }
    let row: serde_json::Value = serde_json::from_slice(&dead[0].payload)?;
    assert_eq!(row["kind"].as_str(), Some(long.as_str()), "the raw row");
    insert(&db, "later", "ok", None).await?;
    wait_for_id(&js, "later", &relay).await?;
    assert!(relay.try_status()?.is_none(), "{}", relay.log());
    relay.signal(Signal::SIGTERM);
    assert_eq!(
        relay.wait_exit(WAIT).await?.code(),
        Some(0),
        "{}",
        relay.log()
    );
    Ok(())
}

/// Headers count against `max_payload`, not the control line (nats-server `processHeaderPub`),
/// so a 5,000-character header value is delivered byte-exact. A header block over JetStream's
/// 64 KiB (stream.go: `len(hdr) > math.MaxUint16`) is refused for good: fail closed naming the
/// column and the limit, or dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn large_header_values_are_delivered_or_refused_as_a_row() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    create_table(&db).await?;
    let js = env.jetstream().await?;
    let note = "n".repeat(LONG);
    let huge = "h".repeat(70_000);

    let mut relay = Relay::start_streaming(&env.config(MAPPING)).await?;
    insert(&db, "ev-long-note", "ok", Some(&note)).await?;
    let got = wait_for_id(&js, "ev-long-note", &relay).await?;
    let msg = got
        .iter()
        .find(|m| m.id() == "ev-long-note")
        .expect("delivered");
    assert_eq!(msg.header("Note"), note, "header value byte-exact");

    insert(&db, "ev-huge-note", "ok", Some(&huge)).await?;
    insert(&db, "after-huge", "ok", None).await?;
    assert_stopped_before(
        &env,
        &mut relay,
        "ev-huge-note",
        "after-huge",
        &[
            "public.limits_outbox",
            "ev-huge-note",
            "column `note`",
            "header `Note`",
            "65535",
        ],
    )
    .await?;

    let dead_letter = env.config(&format!("dead_letter_subject = \"outbox.dlq\"\n{MAPPING}"));
    let mut relay = Relay::start(&dead_letter)?;
    let got = wait_for_id(&js, "after-huge", &relay).await?;
    let dead = got
        .iter()
        .find(|m| m.subject == "outbox.dlq")
        .expect("dead letter");
    assert!(dead.header("Outbox-Dlq-Reason").contains("column `note`"));
    assert!(relay.try_status()?.is_none(), "{}", relay.log());
    relay.signal(Signal::SIGTERM);
    assert_eq!(
        relay.wait_exit(WAIT).await?.code(),
        Some(0),
        "{}",
        relay.log()
    );
    Ok(())
}

/// The relay believes the server accepts 8 KB control lines, the server accepts 4 KB: the
/// route check lets the 5,000-character subject through and the server closes the connection
/// on every send (`-ERR 'maximum control line exceeded'`). After `max_server_closes` such
/// closes in a row, each on a send of that message alone, the relay stops before the row's
/// transaction instead of re-sending it forever.
#[tokio::test(flavor = "multi_thread")]
async fn a_message_the_server_keeps_closing_the_connection_on_is_given_up() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    create_table(&db).await?;
    let js = env.jetstream().await?;
    let config = env.config_full(
        "create_stream = true\nmax_control_line = 8192\nmax_server_closes = 3",
        MAPPING,
    );
    let mut relay = Relay::start_streaming(&config).await?;
    insert(&db, "before", "ok", None).await?;
    wait_for_id(&js, "before", &relay).await?;
    insert(&db, "ev-closed", &"k".repeat(LONG), None).await?;
    insert(&db, "after", "ok", None).await?;
    let started = Instant::now();
    let log = expect_exit(
        &mut relay,
        EX_DATAERR,
        WAIT,
        &[
            "JetStream refused event ev-closed",
            "maximum control line exceeded",
            "3 times in a row",
        ],
    )
    .await?;
    let closes = log.matches("NATS closed the connection over what the relay sent");
    println!(
        "ev-closed: refused after {:?}, {} server closes",
        started.elapsed(),
        closes.count()
    );
    let got = read_stream(&js).await?;
    assert!(got.iter().all(|m| m.id() != "ev-closed"));
    // In commit order: the later row is never stored before the one the server refuses (it
    // waits behind it, and the refused one is re-sent alone each round).
    assert!(got.iter().all(|m| m.id() != "after"), "{log}");
    // Nothing was confirmed past it: with the right limit the next run meets the row again,
    // now refused by the route check.
    let mut relay = Relay::start(&env.config(MAPPING))?;
    assert_stopped_before(
        &env,
        &mut relay,
        "ev-closed",
        "after-never",
        &["ev-closed", "max_control_line"],
    )
    .await?;
    Ok(())
}

/// A message for the boundary test: `subject`, a `Note` header of `note` bytes, `payload` bytes.
fn boundary_message(subject: &str, note: usize, payload: usize) -> Arc<OutboundMessage> {
    Arc::new(OutboundMessage {
        subject: subject.into(),
        // Fixed width: the probe message must have the same header sizes as the real ones.
        event_id: format!("ev-{:05}-{note:06}-{payload:07}", subject.len()),
        headers: vec![("Note".into(), "n".repeat(note).into())],
        shared_headers: 0,
        payload: vec![b'x'; payload].into(),
        table: "public.outbox".into(),
        commit_lsn: relay_core::Lsn(1),
        commit_time_micros: 0,
    })
}

/// The same bytes the publisher sends, on a raw connection (no limit check of the relay's).
fn raw_headers(msg: &OutboundMessage) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Expected-Stream", STREAM);
    headers.insert("Nats-Msg-Id", msg.event_id.as_str());
    for (name, value) in &msg.headers {
        headers.insert(name.as_ref(), value.as_ref());
    }
    headers
}

/// The limit arithmetic against a real nats-server, to the byte: a control line of exactly
/// `max_control_line` bytes, a header block of exactly 65,535 bytes and headers plus payload of
/// exactly `max_payload` are stored; one byte more is refused by the relay before sending, and
/// the server itself refuses those same bytes sent raw (the control line by closing the
/// connection with `-ERR 'maximum control line exceeded'`, the header block with JetStream
/// error 10097).
#[tokio::test(flavor = "multi_thread")]
async fn the_limits_match_the_servers_to_the_byte() -> Result<()> {
    let nats = relay_testkit::NatsServer::start().await?;
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = errors.clone();
    let client = async_nats::ConnectOptions::new()
        .event_callback(move |event| {
            let seen = seen.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    seen.lock().expect("errors").push(e.to_string());
                }
            }
        })
        .connect(nats.url())
        .await?;
    let js = async_nats::jetstream::new(client.clone());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        ..Default::default()
    })
    .await?;
    let publisher =
        JetStreamPublisher::with_default_limits(client.clone(), STREAM, Duration::from_secs(5), 16);
    let limits = publisher.limits();
    assert_eq!(limits.max_payload, 1 << 20, "from the server's INFO");
    assert_eq!(limits.max_control_line, 4096);
    let stored = |msg: Arc<OutboundMessage>| {
        let publisher = publisher.clone();
        async move { publisher.send(&msg, None).await?.await }
    };

    // The control line.
    let probe = boundary_message("", 10, 10);
    let header = limits.header_block_len(&probe);
    let fixed = limits.control_line_len("outbox.x.".len(), header, header + 10);
    let exact = format!("outbox.x.{}", "a".repeat(4096 - fixed));
    let at_limit = boundary_message(&exact, 10, 10);
    assert_eq!(
        limits.control_line_len(exact.len(), header, header + 10),
        4096
    );
    stored(at_limit.clone())
        .await
        .map_err(|e| anyhow::anyhow!("at the limit: {e}"))?;
    let over = boundary_message(&format!("{exact}a"), 10, 10);
    let refused = publisher.send(&over, None).await.err().context("refused")?;
    assert_eq!(refused.kind, PublishErrorKind::Rejected);
    assert!(
        refused.message.contains("max_control_line of 4096"),
        "{refused}"
    );
    // The same lines raw, with a reply subject as long as the ack inbox.
    let reply = format!("_INBOX.{}", "r".repeat(limits.reply_len - "_INBOX.".len()));
    for (msg, closes) in [(&at_limit, false), (&over, true)] {
        client
            .publish_with_reply_and_headers(
                msg.subject.clone(),
                reply.clone(),
                raw_headers(msg),
                msg.payload.clone(),
            )
            .await?;
        client.flush().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let errors = errors.lock().expect("errors").clone();
        let closed = errors
            .iter()
            .any(|e| e.contains("maximum control line exceeded"));
        assert_eq!(closed, closes, "{} bytes: {errors:?}", msg.subject.len());
    }

    // JetStream's header block: 65,535 bytes stored, one more refused.
    let base = limits.header_block_len(&boundary_message("outbox.h", 0, 0));
    let note = MessageLimits::JETSTREAM_MAX_HEADER_BYTES - base;
    let at_limit = boundary_message("outbox.h", note, 0);
    assert_eq!(limits.header_block_len(&at_limit), 65_535);
    stored(at_limit)
        .await
        .map_err(|e| anyhow::anyhow!("header block at the limit: {e}"))?;
    let over = boundary_message("outbox.h", note + 1, 0);
    let refused = publisher.send(&over, None).await.err().context("refused")?;
    assert!(refused.message.contains("65535"), "{refused}");
    let raw = js
        .publish_with_headers(
            over.subject.clone(),
            raw_headers(&over),
            over.payload.clone(),
        )
        .await?
        .await;
    let raw = raw
        .err()
        .context("JetStream refuses the raw header block")?;
    assert!(raw.to_string().contains("10097"), "{raw}");

    // max_payload: headers plus payload.
    let base = limits.header_block_len(&boundary_message("outbox.p", 10, 0));
    let at_limit = boundary_message("outbox.p", 10, (1 << 20) - base);
    stored(at_limit)
        .await
        .map_err(|e| anyhow::anyhow!("max_payload at the limit: {e}"))?;
    let over = boundary_message("outbox.p", 10, (1 << 20) - base + 1);
    let refused = publisher.send(&over, None).await.err().context("refused")?;
    assert!(
        refused.message.contains("max_payload of 1048576"),
        "{refused}"
    );
    Ok(())
}
