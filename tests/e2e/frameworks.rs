//! The outbox tables application frameworks already have, relayed by `preset` alone: for each
//! framework its table as the framework creates it and rows written the way it writes them
//! (`tests/e2e/frameworks/<name>.sql`), in transactions of several sessions committed in the
//! reverse of their insert order; every row arrives once, in commit order, with the subject,
//! payload bytes and headers `tests/e2e/frameworks/<name>.expect.json` and docs/frameworks.md
//! give, and the slot and the checkpoint move past the last commit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use relay_core::subject::push_escaped_token;

use crate::support::*;

const EX_DATAERR: i32 = 65;

/// One message a consumer should receive.
#[derive(Debug, serde::Deserialize)]
struct Expected {
    event_id: String,
    subject_source: Option<String>,
    payload_hex: String,
    headers: BTreeMap<String, String>,
}

/// A framework's fixture: its DDL and its transactions' SQL.
struct Fixture {
    ddl: String,
    transactions: Vec<String>,
    expected: Vec<Expected>,
}

fn fixture(name: &str) -> Result<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/frameworks");
    let sql = std::fs::read_to_string(dir.join(format!("{name}.sql")))?;
    let (ddl, rows) = sql
        .split_once("-- @@ rows")
        .context("no `-- @@ rows` line")?;
    let mut transactions = Vec::new();
    let mut rest = rows;
    while let Some(start) = rest.find("\nBEGIN;") {
        let body = &rest[start + "\nBEGIN;".len()..];
        let end = body.find("\nCOMMIT;").context("BEGIN without COMMIT")?;
        transactions.push(body[..end].to_owned());
        rest = &body[end + "\nCOMMIT;".len()..];
    }
    ensure!(
        transactions.len() >= 2,
        "{name}: fewer than two transactions"
    );
    let expected = serde_json::from_str(&std::fs::read_to_string(
        dir.join(format!("{name}.expect.json")),
    )?)?;
    Ok(Fixture {
        ddl: ddl.to_owned(),
        transactions,
        expected,
    })
}

/// `prefix` then `source` as subject levels, each escaped by the token rule.
fn levels(prefix: &str, source: &str) -> String {
    let mut subject = prefix.to_owned();
    for (i, level) in source.split('.').enumerate() {
        if i > 0 || !prefix.is_empty() {
            subject.push('.');
        }
        push_escaped_token(&mut subject, level);
    }
    subject
}

/// The subject a framework's preset gives a row whose subject column holds `source`
/// (Watermill: the row's topic, from its table's name).
fn subject(framework: &str, source: &str) -> String {
    match framework {
        "cap" | "watermill" => levels("", source),
        "masstransit" => {
            let mut subject = "masstransit.".to_owned();
            push_escaped_token(&mut subject, source);
            subject
        }
        "debezium" => {
            let mut subject = "outbox.event.".to_owned();
            push_escaped_token(&mut subject, source);
            subject
        }
        "spring-modulith" => levels("modulith", source),
        other => levels(other, source),
    }
}

/// The `[[outbox]]` entries: the preset alone, plus what its recipe says the user sets.
fn outbox_config(framework: &str) -> String {
    match framework {
        "watermill" => ["orders.created", "billing.InvoiceIssued"]
            .map(|topic| {
                format!(
                    "[[outbox]]\npreset = \"watermill\"\ntable = 'public.\"watermill_{topic}\"'\nsubject = \"{topic}\"\n"
                )
            })
            .join("\n"),
        "spring-modulith" => {
            "[[outbox]]\npreset = \"spring-modulith\"\nrow_filter = \"listener_id = 'outbox-relay'\"\n"
                .to_owned()
        }
        other => format!("[[outbox]]\npreset = \"{other}\"\n"),
    }
}

/// Watermill's topic of the row with `event_id`: the table its INSERT names.
fn watermill_topic(transactions: &[String], event_id: &str) -> Option<String> {
    transactions
        .iter()
        .flat_map(|tx| tx.split(";\n"))
        .find(|statement| statement.contains(&format!("'{event_id}'")))
        .and_then(|statement| {
            let rest = statement.split("INSERT INTO \"watermill_").nth(1)?;
            Some(rest[..rest.find('"')?].to_owned())
        })
}

async fn relay_framework(framework: &str) -> Result<()> {
    let fixture = fixture(framework)?;
    let env = Env::start().await?;
    let db = env.db().await?;
    // Brighter's table is public.outbox, which the test database's migrations created in
    // Debezium's shape.
    db.batch_execute("DROP TABLE IF EXISTS public.outbox CASCADE")
        .await?;
    db.batch_execute(&fixture.ddl)
        .await
        .with_context(|| format!("{framework}: the framework's DDL"))?;

    // Each expected message with its subject and the transaction that writes it.
    let mut expected = Vec::new();
    for e in &fixture.expected {
        let tx = fixture
            .transactions
            .iter()
            .position(|tx| tx.contains(&e.event_id))
            .with_context(|| format!("{framework}: no transaction writes {}", e.event_id))?;
        let source = match framework {
            "watermill" => watermill_topic(&fixture.transactions, &e.event_id),
            _ => e.subject_source.clone(),
        }
        .with_context(|| format!("{framework}: no subject source for {}", e.event_id))?;
        expected.push((tx, subject(framework, &source), e));
    }
    let first_levels: BTreeSet<String> = expected
        .iter()
        .map(|(_, subject, _)| subject.split('.').next().unwrap_or_default().to_owned())
        .collect();
    let stream_subjects = first_levels
        .iter()
        .map(|level| format!("\"{level}.>\""))
        .collect::<Vec<_>>()
        .join(", ");
    let config = env.config_full(
        &format!("create_stream = true\nstream_subjects = [{stream_subjects}]"),
        &format!("\n{}", outbox_config(framework)),
    );
    let relay = Relay::start_streaming(&config).await?;

    // Every transaction open at once on its own session, committed last-written first.
    let mut sessions = Vec::new();
    for (i, body) in fixture.transactions.iter().enumerate() {
        let session = env.db().await?;
        session
            .batch_execute(&format!("BEGIN;{body}"))
            .await
            .with_context(|| format!("{framework}: transaction {i}"))?;
        sessions.push(session);
    }
    for session in sessions.iter().rev() {
        session.batch_execute("COMMIT").await?;
    }
    let last_commit = env.current_wal().await?;
    expected.sort_by_key(|(tx, _, _)| std::cmp::Reverse(*tx));

    let js = env.jetstream().await?;
    let got = wait_for_messages(&js, expected.len(), Duration::from_secs(60), Some(&relay)).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got_after = read_stream(&js).await?;
    assert_eq!(
        got_after.len(),
        expected.len(),
        "{framework}: each row once, nothing else; log:\n{}",
        relay.log()
    );
    for (i, (m, (_, subject, e))) in got.iter().zip(&expected).enumerate() {
        let at = format!("{framework}: message {i} ({})", e.event_id);
        assert_eq!(m.id(), e.event_id, "{at}: commit order");
        assert_eq!(&m.subject, subject, "{at}: subject");
        assert_eq!(hex(&m.payload), e.payload_hex, "{at}: payload bytes");
        for (name, value) in &e.headers {
            assert_eq!(
                m.header(name),
                value,
                "{at}: header {name}: {:?}",
                m.headers
            );
        }
        if framework == "watermill" {
            assert_eq!(m.header("_watermill_message_uuid"), e.event_id, "{at}");
        }
    }
    // Positions: the checkpoint and the slot move past the last commit.
    let checkpoint = env.wait_checkpoint(last_commit, WAIT).await?;
    let deadline = std::time::Instant::now() + WAIT;
    while env.slot_confirmed().await?.unwrap_or(0) < last_commit {
        ensure!(
            std::time::Instant::now() < deadline,
            "{framework}: the slot stayed before {last_commit:X}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "{framework}: {} messages from {} transactions committed in reverse order, in commit order; checkpoint {checkpoint:X} past the last commit {last_commit:X}",
        got.len(),
        fixture.transactions.len()
    );
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const WAIT: Duration = Duration::from_secs(30);

macro_rules! framework_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread")]
        async fn $test() -> Result<()> {
            relay_framework($name).await
        }
    )*};
}

framework_tests! {
    cap_by_preset => "cap",
    masstransit_by_preset => "masstransit",
    eventuate_by_preset => "eventuate",
    watermill_by_preset => "watermill",
    spring_modulith_by_preset => "spring-modulith",
    debezium_by_preset => "debezium",
    wolverine_by_preset => "wolverine",
    brighter_by_preset => "brighter",
}

/// CAP rows each mapping refuses: an empty topic level, a wildcard topic, a header object that
/// is not one, a header the relay sets itself, a missing envelope member, an envelope that is
/// not JSON.
const HOSTILE_CAP_ROWS: &[(i64, &str, &str, &str)] = &[
    (2, "orders..created", r#"{"Headers":{},"Value":{}}"#, "Name"),
    (3, "orders.*", r#"{"Headers":{},"Value":{}}"#, "Name"),
    (
        4,
        "orders.created",
        r#"{"Headers":"cap-msg-id","Value":{}}"#,
        "Content",
    ),
    (
        5,
        "orders.created",
        r#"{"Headers":{"Nats-Msg-Id":"forged"},"Value":{}}"#,
        "Content",
    ),
    (6, "orders.created", r#"{"Headers":{}}"#, "Content"),
    (7, "orders.created", "not json", "Content"),
];

async fn insert_cap(
    db: &impl tokio_postgres::GenericClient,
    id: i64,
    name: &str,
    content: &str,
) -> Result<()> {
    db.execute(
        "INSERT INTO cap.published (\"Id\", \"Version\", \"Name\", \"Content\", \"Retries\", \"Added\", \"StatusName\") \
         VALUES ($1, 'v1', $2, $3, 0, localtimestamp, 'Scheduled')",
        &[&id, &name, &content],
    )
    .await?;
    Ok(())
}

/// With a dead-letter subject each hostile CAP row is parked there with a reason naming the
/// table, the row's id and the column, between the good rows, in commit order; without one
/// the first stops the relay (exit 65) naming the same, and nothing past it is confirmed.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_framework_rows_are_dead_lettered_or_stop_the_relay() -> Result<()> {
    let fixture = fixture("cap")?;
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute(&fixture.ddl).await?;
    let nats = "create_stream = true\nstream_subjects = [\"orders.>\", \"dlq.>\"]";
    let outbox = "\n[[outbox]]\npreset = \"cap\"\n";
    let parked = env.config_full(
        nats,
        &format!("dead_letter_subject = \"dlq.cap\"\n{outbox}"),
    );
    let relay = Relay::start_streaming(&parked).await?;
    let good = r#"{"Headers":{"cap-msg-id":"ID"},"Value":{"ok":true}}"#;
    let mut tx_db = env.db().await?;
    let tx = tx_db.transaction().await?;
    insert_cap(&tx, 1, "orders.created", &good.replace("ID", "1")).await?;
    for (id, name, content, _) in HOSTILE_CAP_ROWS {
        insert_cap(&tx, *id, name, content).await?;
    }
    insert_cap(&tx, 8, "orders.created", &good.replace("ID", "8")).await?;
    tx.commit().await?;
    let js = env.jetstream().await?;
    let got = wait_for_messages(&js, 8, Duration::from_secs(60), Some(&relay)).await?;
    assert_eq!(got.len(), 8, "{got:?}");
    assert_eq!(
        (got[0].id(), got[0].subject.as_str()),
        ("1", "orders.created")
    );
    assert_eq!(
        (got[7].id(), got[7].subject.as_str()),
        ("8", "orders.created")
    );
    for (m, (id, _, _, column)) in got[1..7].iter().zip(HOSTILE_CAP_ROWS) {
        assert_eq!(m.subject, "dlq.cap", "row {id} parked: {m:?}");
        let reason = m.header("Outbox-Dlq-Reason");
        for needle in [
            format!("event {id} in `cap.published`"),
            format!("`{column}`"),
        ] {
            assert!(reason.contains(&needle), "row {id}: {needle} in {reason:?}");
        }
        assert!(m.header("Nats-Msg-Id").starts_with("dlq:"), "{m:?}");
    }
    drop(relay);

    // Without a dead-letter subject: the relay stops at the first one.
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute(&fixture.ddl).await?;
    let mut relay = Relay::start_streaming(&env.config_full(nats, outbox)).await?;
    insert_cap(&db, 1, "orders.created", &good.replace("ID", "1")).await?;
    let js = env.jetstream().await?;
    wait_for_id(&js, "1", &relay).await?;
    let (id, name, content, column) = HOSTILE_CAP_ROWS[0];
    insert_cap(&db, id, name, content).await?;
    // The end of the refused row's transaction: confirming it would reach this.
    let refused_end = env.current_wal().await?;
    expect_exit(
        &mut relay,
        EX_DATAERR,
        WAIT,
        &[
            &format!("event {id} in `cap.published`"),
            &format!("`{column}`"),
        ],
    )
    .await?;
    let checkpoint = env.checkpoint().await?.context("checkpoint")?;
    let slot = env.slot_confirmed().await?.context("slot")?;
    assert!(
        checkpoint < refused_end && slot < refused_end,
        "checkpoint {checkpoint:X} / slot {slot:X} past the refused row's transaction (ends at {refused_end:X})"
    );
    assert_eq!(
        stream_count(&js).await?,
        1,
        "nothing of the refused row published"
    );
    Ok(())
}

/// `validate --connect` checks that the table has the preset's shape: the CAP table as CAP
/// creates it passes; with `Content` renamed it fails naming the column, the key and the
/// preset.
#[tokio::test(flavor = "multi_thread")]
async fn validate_checks_the_table_has_the_presets_shape() -> Result<()> {
    let fixture = fixture("cap")?;
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute(&fixture.ddl).await?;
    let config = env.config_full(
        "create_stream = true\nstream_subjects = [\"orders.>\"]",
        "\n[[outbox]]\npreset = \"cap\"\n",
    );
    let columns_line = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains("columns of cap.published"))
            .map(str::to_owned)
            .unwrap_or_else(|| {
                format!(
                    "no columns check in:\n{}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })
    };
    let out = relay_cmd(&config, &["validate", "--connect"]).await?;
    let line = columns_line(&out);
    assert!(line.starts_with("PASS"), "{line}");

    db.batch_execute("ALTER TABLE cap.published RENAME COLUMN \"Content\" TO \"Body\"")
        .await?;
    let out = relay_cmd(&config, &["validate", "--connect"]).await?;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = columns_line(&out);
    assert!(line.starts_with("FAIL"), "{report}");
    assert!(
        line.contains("`Content` (payload, from preset cap)")
            && line.contains("`Content` (headers_json, from preset cap)"),
        "{line}"
    );
    assert!(report.contains("shape preset cap expects"), "{report}");
    assert!(!out.status.success(), "validate fails");
    Ok(())
}
