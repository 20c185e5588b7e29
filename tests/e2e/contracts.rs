//! Event contracts (docs/contracts.md) against real servers: violating rows dead-lettered with
//! their reasons while valid ones arrive byte-exact and in order, a stop with nothing confirmed
//! without a dead-letter subject, the contract in its KV bucket under the key each event's
//! `Outbox-Schema` names, and bad schema files refused at start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use outbox_schema::{Contract, Limits};

use crate::support::*;

const EX_DATAERR: i32 = 65;
const EX_CONFIG: i32 = 78;
const WAIT: Duration = Duration::from_secs(40);

/// The fixture contract (`order-placed.json`, which refers to `shared/money.json`), copied into
/// `dir`; returns the root file.
fn order_contract(dir: &Path) -> Result<PathBuf> {
    let fixtures =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../outbox-schema/tests/fixtures/contracts");
    let to = dir.join("contracts");
    std::fs::create_dir_all(to.join("shared"))?;
    for file in ["order-placed.json", "shared/money.json"] {
        std::fs::copy(fixtures.join(file), to.join(file)).with_context(|| file.to_owned())?;
    }
    Ok(to.join("order-placed.json"))
}

/// A text payload column (kept byte for byte by PostgreSQL) and the event type.
async fn create_orders_outbox(db: &tokio_postgres::Client) -> Result<()> {
    db.batch_execute(
        "CREATE TABLE orders_outbox (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id text NOT NULL,
            type text NOT NULL,
            payload text
        )",
    )
    .await?;
    Ok(())
}

fn mapping(schema: &Path) -> String {
    mapping_of(&[("OrderPlaced", schema)])
}

/// The orders table with a contract per `(event type, file)`.
fn mapping_of(types: &[(&str, &Path)]) -> String {
    let mut text = String::from(
        "\n[[outbox]]\ntable = \"public.orders_outbox\"\nsubject = \"outbox.orders.{type}\"\nheaders = { \"Outbox-Event-Type\" = \"type\" }\n[outbox.contracts.types]\n",
    );
    for (event_type, file) in types {
        text.push_str(&format!("{event_type} = \"{}\"\n", file.display()));
    }
    text
}

const VALID_1: &str = "{\"order_id\":\"o-1\", \"customer\":\"c-7\",\n \"total\":{\"currency\":\"EUR\",\"cents\":1250}}";
const VALID_2: &str = r#"{"customer":"c-8","order_id":"o-2","total":{"cents":5,"currency":"USD"},"lines":[{"sku":"a"}]}"#;
const WRONG_TYPE: &str =
    r#"{"order_id":"o-3","customer":"c-7","total":{"cents":"1250","currency":"EUR"}}"#;
const NOT_JSON: &str = "order o-4, 12.50 EUR";

/// The event id a dead letter's reason names (`event <id> in `table`: …`).
fn dead_letter_event(message: &Received) -> &str {
    let reason = message.header("Outbox-Dlq-Reason");
    reason.split_whitespace().nth(1).unwrap_or_default()
}

/// Inserts `rows` (id, type, payload) in one transaction; returns the WAL insert position right
/// after its commit (past the commit, not the commit LSN).
async fn insert_orders(
    db: &mut tokio_postgres::Client,
    rows: &[(&str, &str, &str)],
) -> Result<u64> {
    let tx = db.transaction().await?;
    for (id, kind, payload) in rows {
        tx.execute(
            "INSERT INTO orders_outbox (id, type, payload) VALUES ($1, $2, $3)",
            &[id, kind, payload],
        )
        .await?;
    }
    tx.commit().await?;
    let lsn: String = db
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await?
        .get(0);
    parse_lsn(&lsn).context("lsn")
}

/// Rows that break their contract go to the dead-letter subject with the contract, pointer,
/// keyword, expected and found value in the reason; the rows around them arrive byte for byte,
/// in commit order, each naming the contract that the KV bucket holds; the checkpoint and the
/// slot move past the transaction.
#[tokio::test(flavor = "multi_thread")]
async fn violating_rows_are_dead_lettered_while_valid_ones_arrive_byte_exact_and_in_order()
-> Result<()> {
    let env = Env::start().await?;
    let mut db = env.db().await?;
    create_orders_outbox(&db).await?;
    let schema = order_contract(env.dir.path())?;
    let (http, addr) = http_listen();
    let config = env.config(&format!(
        "dead_letter_subject = \"outbox.dlq\"\n{}{http}",
        mapping(&schema)
    ));
    let relay = Relay::start_streaming(&config).await?;
    let commit = insert_orders(
        &mut db,
        &[
            ("e-1", "OrderPlaced", VALID_1),
            ("e-2", "OrderPlaced", WRONG_TYPE),
            ("e-3", "OrderShipped", NOT_JSON),
            ("e-4", "OrderPlaced", NOT_JSON),
            ("e-5", "OrderPlaced", VALID_2),
        ],
    )
    .await?;
    let js = env.jetstream().await?;
    let messages = wait_for_messages(&js, 5, WAIT, Some(&relay)).await?;
    let order: Vec<(&str, &str)> = messages
        .iter()
        .map(|m| {
            let id = if m.subject == "outbox.dlq" {
                dead_letter_event(m)
            } else {
                m.id()
            };
            (m.subject.as_str(), id)
        })
        .collect();
    assert_eq!(
        order,
        [
            ("outbox.orders.OrderPlaced", "e-1"),
            ("outbox.dlq", "e-2"),
            ("outbox.orders.OrderShipped", "e-3"),
            ("outbox.dlq", "e-4"),
            ("outbox.orders.OrderPlaced", "e-5"),
        ],
        "log:\n{}",
        relay.log()
    );
    // Byte for byte, as stored (spacing and member order kept).
    assert_eq!(messages[0].payload, VALID_1.as_bytes());
    assert_eq!(messages[4].payload, VALID_2.as_bytes());
    // An event type without a contract is published unchecked and unmarked.
    assert_eq!(messages[2].payload, NOT_JSON.as_bytes());
    assert_eq!(messages[2].header(outbox_contract::HEADER_SCHEMA), "");

    let key = messages[0]
        .header(outbox_contract::HEADER_SCHEMA)
        .to_owned();
    assert!(key.starts_with("order-placed."), "{key}");
    assert_eq!(messages[4].header(outbox_contract::HEADER_SCHEMA), key);
    let reason = messages[1].header("Outbox-Dlq-Reason");
    for part in [
        &key,
        "/total/cents",
        "`type`",
        "\"integer\"",
        "\"1250\"",
        "e-2",
    ] {
        assert!(
            reason.contains(part),
            "{part} missing from the reason: {reason}"
        );
    }
    let reason = messages[3].header("Outbox-Dlq-Reason");
    assert!(
        reason.contains("not JSON") && reason.contains(&key),
        "{reason}"
    );

    // The contract is in its bucket under the header's key; what a consumer compiles from it
    // judges the events as the relay did.
    let kv = js.get_key_value(outbox_contract::CONTRACTS_BUCKET).await?;
    let stored = kv
        .get(&key)
        .await?
        .context("the contract is in the bucket")?;
    let fetched = Contract::from_stored(&key, &stored)?;
    assert!(
        fetched
            .check(&messages[0].payload, &Limits::default())
            .is_ok()
    );
    assert!(
        fetched
            .check(WRONG_TYPE.as_bytes(), &Limits::default())
            .is_err()
    );
    let local = Contract::load(&schema, None)?;
    assert_eq!(local.key(), key, "the stored version is the file's");

    // Positions: past the transaction with the refused rows.
    env.wait_checkpoint(commit, WAIT).await?;
    wait_until("the slot confirmed the transaction", &relay, async || {
        Ok(env.slot_confirmed().await?.is_some_and(|lsn| lsn >= commit))
    })
    .await?;
    let metrics = scrape(&addr).await?;
    let label = format!("{{contract=\"{key}\"}}");
    assert_eq!(
        metrics.get(&format!("outbox_relay_contract_checked_total{label}")),
        Some(&4.0)
    );
    assert_eq!(
        metrics.get(&format!("outbox_relay_contract_refused_total{label}")),
        Some(&2.0)
    );
    // `status` shows each contract's counts and the last event it refused.
    let status = relay_cmd(&config, &["status"]).await?;
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains(&format!("contract {key}")) && status.contains("4 checked, 2 refused"),
        "{status}"
    );
    assert!(status.contains("last refused: event e-4"), "{status}");

    // A file changed under the running relay changes nothing until it restarts: a row the new
    // file would refuse (no `lines`) is still checked against what was read at start.
    let stricter = std::fs::read_to_string(&schema)?.replace(
        "\"required\": [\"order_id\", \"customer\", \"total\"]",
        "\"required\": [\"order_id\", \"customer\", \"total\", \"lines\"]",
    );
    std::fs::write(&schema, stricter)?;
    assert_ne!(
        Contract::load(&schema, None)?.key(),
        key,
        "the file changed"
    );
    insert_orders(&mut db, &[("e-6", "OrderPlaced", VALID_1)]).await?;
    let messages = wait_for_messages(&js, 6, WAIT, Some(&relay)).await?;
    assert_eq!(messages[5].id(), "e-6");
    assert_eq!(messages[5].header(outbox_contract::HEADER_SCHEMA), key);
    Ok(())
}

/// Without a dead-letter subject a violation stops the relay (exit 65) naming the event, the
/// contract and the violation, with nothing confirmed past the transaction before it; started
/// again with a dead-letter subject it parks the row and carries on, each event once.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_dead_letter_subject_a_violation_stops_with_nothing_confirmed_past_it()
-> Result<()> {
    let env = Env::start().await?;
    let mut db = env.db().await?;
    create_orders_outbox(&db).await?;
    let schema = order_contract(env.dir.path())?;
    let config = env.config(&mapping(&schema));
    let mut relay = Relay::start_streaming(&config).await?;
    let first = insert_orders(&mut db, &[("e-1", "OrderPlaced", VALID_1)]).await?;
    let js = env.jetstream().await?;
    wait_for_messages(&js, 1, WAIT, Some(&relay)).await?;
    let stored = env.wait_checkpoint(first, WAIT).await?;
    let second = insert_orders(
        &mut db,
        &[
            ("e-2", "OrderPlaced", VALID_2),
            ("e-3", "OrderPlaced", WRONG_TYPE),
        ],
    )
    .await?;
    let log = expect_exit(
        &mut relay,
        EX_DATAERR,
        WAIT,
        &["e-3", "order-placed.", "/total/cents", "`type`"],
    )
    .await?;
    let (checkpoint, _, commit) = assert_not_confirmed_past(&env, &log, "e-3").await?;
    assert!(
        checkpoint >= stored,
        "checkpoint {checkpoint:X} before the first transaction's {stored:X}, second's commit {commit:X}"
    );
    assert!(
        !read_stream(&js).await?.iter().any(|m| m.id() == "e-3"),
        "the refused event is not in the stream"
    );

    let parking = env.config(&format!(
        "dead_letter_subject = \"outbox.dlq\"\n{}",
        mapping(&schema)
    ));
    let relay = Relay::start_streaming(&parking).await?;
    env.wait_checkpoint(second, WAIT).await?;
    let messages = read_stream(&js).await?;
    let count = |id: &str| messages.iter().filter(|m| m.id() == id).count();
    assert_eq!(
        (count("e-1"), count("e-2")),
        (1, 1),
        "log:\n{}",
        relay.log()
    );
    let parked: Vec<_> = messages
        .iter()
        .filter(|m| m.subject == "outbox.dlq")
        .collect();
    assert_eq!(parked.len(), 1);
    assert_eq!(dead_letter_event(parked[0]), "e-3");
    Ok(())
}

/// A schema that does not compile, or that refers to anything but a local file in its own
/// directory, is a configuration error (78) naming the file and the keyword, before anything
/// connects.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_contract_file_is_a_configuration_error_naming_file_and_keyword() -> Result<()> {
    let env = Env::start().await?;
    let cases = [
        (
            "typo.json",
            r#"{"type":"object","properties":{"a":{"type":"strin"}}}"#,
            vec!["typo.json", "`type`", "/properties/a/type"],
        ),
        (
            "remote.json",
            r#"{"$ref":"https://example.com/order.json"}"#,
            vec![
                "remote.json",
                "`$ref`",
                "https://example.com/order.json",
                "local files",
            ],
        ),
        (
            "broken.json",
            "{\"type\":",
            vec!["broken.json", "not a JSON document"],
        ),
    ];
    for (name, text, needles) in cases {
        let path = env.dir.path().join(name);
        std::fs::write(&path, text)?;
        let config = env.config(&mapping(&path));
        let mut relay = Relay::start(&config)?;
        expect_exit(&mut relay, EX_CONFIG, WAIT, &needles).await?;
    }
    let missing = env.dir.path().join("missing.json");
    let mut relay = Relay::start(&env.config(&mapping(&missing)))?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["missing.json", "cannot read"],
    )
    .await?;

    // A `$ref` to a file outside the contract file's directory, by `..`, by an absolute path
    // or through a symbolic link: refused naming the file, the `$ref` and the fix, never
    // embedded in the bucket every consumer reads.
    let contracts = env.dir.path().join("contracts");
    std::fs::create_dir_all(&contracts)?;
    let secret = env.dir.path().join("secret.json");
    std::fs::write(&secret, r#"{"const": "s3cret"}"#)?;
    std::os::unix::fs::symlink(&secret, contracts.join("link.json"))?;
    for (name, reference) in [
        ("up.json", "../secret.json".to_owned()),
        ("absolute.json", secret.display().to_string()),
        ("through-link.json", "link.json".to_owned()),
    ] {
        let path = contracts.join(name);
        let schema = serde_json::json!({"properties": {"a": {"$ref": reference}}});
        std::fs::write(&path, schema.to_string())?;
        let mut relay = Relay::start(&env.config(&mapping(&path)))?;
        let log = expect_exit(
            &mut relay,
            EX_CONFIG,
            WAIT,
            &[
                name,
                &format!("`$ref` `{reference}`"),
                "outside",
                "copy the file under",
            ],
        )
        .await?;
        anyhow::ensure!(!log.contains("s3cret"), "the secret in the log:\n{log}");
    }
    Ok(())
}

/// `contracts check` with a new set of schemas finds, in the table and in the stream, the
/// events the new set would refuse (exit 65, each with its reason), says which contract matched
/// nothing, and passes (exit 0) when the set accepts everything.
#[tokio::test(flavor = "multi_thread")]
async fn contracts_check_finds_the_rows_and_messages_a_changed_schema_would_refuse() -> Result<()> {
    let env = Env::start().await?;
    let mut db = env.db().await?;
    create_orders_outbox(&db).await?;
    // Published before any contract: the stream and the table hold both events.
    let unchecked = env.config(
        "[[outbox]]\ntable = \"public.orders_outbox\"\nsubject = \"outbox.orders.{type}\"\nheaders = { \"Outbox-Event-Type\" = \"type\" }\n",
    );
    let relay = Relay::start_streaming(&unchecked).await?;
    insert_orders(
        &mut db,
        &[
            ("e-1", "OrderPlaced", VALID_1),
            ("e-2", "OrderPlaced", WRONG_TYPE),
        ],
    )
    .await?;
    let js = env.jetstream().await?;
    wait_for_messages(&js, 2, WAIT, Some(&relay)).await?;
    drop(relay);

    let schema = order_contract(env.dir.path())?;
    let unused = env.dir.path().join("contracts/order-cancelled.json");
    std::fs::write(&unused, r#"{"type":"object","required":["order_id"]}"#)?;
    let new_set = env.config(&mapping_of(&[
        ("OrderPlaced", &schema),
        ("OrderCancelled", &unused),
    ]));
    let out = relay_cmd(&new_set, &["contracts", "check", "--json"]).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(EX_DATAERR), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout)?;
    let refused: Vec<(String, String, Option<u64>)> = report["refused"]
        .as_array()
        .context("refused")?
        .iter()
        .map(|r| {
            (
                r["source"].as_str().unwrap_or_default().to_owned(),
                r["event_id"].as_str().unwrap_or_default().to_owned(),
                r["seq"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        refused,
        [
            ("row".to_owned(), "e-2".to_owned(), None),
            ("message".to_owned(), "e-2".to_owned(), Some(2))
        ],
        "{stdout}"
    );
    for r in report["refused"].as_array().context("refused")? {
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("/total/cents") && reason.contains("`type`"),
            "{reason}"
        );
    }
    assert_eq!(report["rows_checked"], 2);
    assert_eq!(report["messages_checked"], 2);
    let text = relay_cmd(&new_set, &["contracts", "check"]).await?;
    let text_out = String::from_utf8_lossy(&text.stdout);
    assert!(
        text_out.contains("order-cancelled.") && text_out.contains("matched no row or message"),
        "{text_out}"
    );
    assert!(text_out.contains("REFUSED row e-2"), "{text_out}");
    // The preflight reports each contract's match against the rows.
    let preflight = relay_cmd(&new_set, &["validate", "--connect"]).await?;
    let lines = String::from_utf8_lossy(&preflight.stdout);
    let line = |needle: &str| {
        lines
            .lines()
            .find(|l| l.contains(needle))
            .map(str::to_owned)
    };
    let placed = line("contract order-placed.").context(lines.to_string())?;
    assert!(
        placed.starts_with("WARN") && placed.contains("1 of 2 rows would be refused"),
        "{placed}"
    );
    let cancelled = line("contract order-cancelled.").context(lines.to_string())?;
    assert!(
        cancelled.starts_with("WARN") && cancelled.contains("matched none"),
        "{cancelled}"
    );

    // The AsyncAPI document names the contract's schema as the payload of its events (the
    // document is checked against the specification's schema, and parsed by AsyncAPI's parser,
    // by relay-runtime's tests).
    let document = env.dir.path().join("asyncapi.json");
    let out = relay_cmd(
        &new_set,
        &["asyncapi", "--output", &document.display().to_string()],
    )
    .await?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let document: serde_json::Value = serde_json::from_slice(&std::fs::read(&document)?)?;
    assert_eq!(document["asyncapi"], "3.0.0");
    // Its `$ref`s point where the document embeds the files they name (shared/money.json).
    let contract = Contract::load(&schema, None)?;
    let embedded = document["components"]["messages"]
        .as_object()
        .context("messages")?
        .iter()
        .any(|(id, message)| {
            let at = format!("/components/messages/{id}/payload/schema");
            message["payload"].get("schema")
                == Some(&outbox_schema::document_refs(contract.schema(), &at))
        });
    assert!(embedded, "{document:#}");

    // A set that accepts both: exit 0.
    let loose = env.dir.path().join("loose.json");
    std::fs::write(&loose, r#"{"type":"object"}"#)?;
    let out = relay_cmd(&env.config(&mapping(&loose)), &["contracts", "check"]).await?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing would be refused"));
    Ok(())
}
