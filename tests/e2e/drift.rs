//! Schema and publication drift while the relay runs (docs/bad-rows.md): a nullable column
//! added keeps going; a mapped column dropped, renamed or retyped, or the outbox table renamed or
//! moved, stops the relay at that transaction naming it (exit 78, nothing confirmed past it);
//! a table that left the
//! publication, a publication that stopped publishing inserts or was dropped stops it with 78; a
//! publication newer than the slot is reported, or refused when the relay would create it.

use std::time::{Duration, Instant};

use anyhow::Result;
use nix::sys::signal::Signal;

use crate::support::*;

const EX_CONFIG: i32 = 78;
const WAIT: Duration = Duration::from_secs(30);

/// ADD COLUMN keeps going; RENAME, a type change and DROP COLUMN of a mapped column each stop
/// at their transaction (exit 78) with the column named and the checkpoint before it.
#[tokio::test(flavor = "multi_thread")]
async fn column_drift_keeps_going_or_stops_naming_the_column() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("");
    let dead_letter = env.config("dead_letter_subject = \"outbox.dlq\"");

    let mut relay = Relay::start_streaming(&config).await?;
    insert_event(&db, "Order", "Created", r#"{"n":1}"#).await?;
    db.batch_execute("ALTER TABLE outbox ADD COLUMN note text")
        .await?;
    let e2 = insert_event(&db, "Order", "Created", r#"{"n":2}"#).await?;
    wait_for_id(&js, &e2, &relay).await?;

    // RENAME of a mapped column.
    db.batch_execute("ALTER TABLE outbox RENAME COLUMN aggregatetype TO agg_type")
        .await?;
    let renamed = uuid::Uuid::new_v4().to_string();
    db.execute(
        "INSERT INTO outbox (id, agg_type, aggregateid, type, payload) VALUES ($1::text::uuid, 'Order', '1', 'Renamed', '{}')",
        &[&renamed],
    )
    .await?;
    let wal_after_bad = env.current_wal().await?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &[
            "column `aggregatetype`",
            "renamed to `agg_type`",
            "public.outbox",
            "commit LSN",
        ],
    )
    .await?;
    assert!(env.checkpoint().await?.expect("checkpoint") < wal_after_bad);
    assert!(env.slot_confirmed().await?.expect("slot") < wal_after_bad);
    // Fixed: the column is renamed back; the committed row goes to the dead-letter subject.
    db.batch_execute("ALTER TABLE outbox RENAME COLUMN agg_type TO aggregatetype")
        .await?;
    let e4 = insert_event(&db, "Order", "Created", r#"{"n":4}"#).await?;
    let mut relay = Relay::start(&dead_letter)?;
    let got = wait_for_id(&js, &e4, &relay).await?;
    assert!(
        got.iter().any(|m| m.subject == "outbox.dlq"
            && m.header("Outbox-Dlq-Reason").contains("aggregatetype")),
        "renamed row dead-lettered"
    );
    relay.signal(Signal::SIGTERM);
    assert_eq!(relay.wait_exit(WAIT).await?.code(), Some(0));

    // A type change of a mapped column.
    let mut relay = Relay::start_streaming(&config).await?;
    let e5 = insert_event(&db, "Order", "Created", r#"{"n":5}"#).await?;
    wait_for_id(&js, &e5, &relay).await?;
    db.batch_execute("ALTER TABLE outbox ALTER COLUMN aggregateid TYPE text")
        .await?;
    let e6 = insert_event(&db, "Order", "Created", r#"{"n":6}"#).await?;
    let wal_after_bad = env.current_wal().await?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["column `aggregateid`", "changed type", "public.outbox"],
    )
    .await?;
    assert!(env.checkpoint().await?.expect("checkpoint") < wal_after_bad);
    // A restart takes the new type as the session's baseline: the operator's acknowledgement.
    let mut relay = Relay::start(&config)?;
    wait_for_id(&js, &e6, &relay).await?;

    // DROP COLUMN of a mapped column.
    db.batch_execute("ALTER TABLE outbox DROP COLUMN aggregateid")
        .await?;
    db.execute(
        "INSERT INTO outbox (id, aggregatetype, type, payload) VALUES (gen_random_uuid(), 'Order', 'NoAggId', '{}')",
        &[],
    )
    .await?;
    let wal_after_bad = env.current_wal().await?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["no column `aggregateid`", "public.outbox"],
    )
    .await?;
    assert!(env.checkpoint().await?.expect("checkpoint") < wal_after_bad);
    Ok(())
}

/// `ALTER TABLE … RENAME` and `SET SCHEMA` of the outbox: the publication still streams its
/// rows under the new name; the relay knows the table by OID and stops at the first such row
/// (exit 78, both names), confirming nothing past it. Renamed back, the rows written under the
/// other name are delivered as the configured table's.
#[tokio::test(flavor = "multi_thread")]
async fn a_renamed_or_moved_outbox_table_stops_the_relay_and_loses_nothing() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("");

    let mut relay = Relay::start_streaming(&config).await?;
    let e1 = insert_event(&db, "Order", "Created", r#"{"n":1}"#).await?;
    wait_for_id(&js, &e1, &relay).await?;

    db.batch_execute("ALTER TABLE outbox RENAME TO outbox_old")
        .await?;
    let written_renamed = uuid::Uuid::new_v4().to_string();
    db.execute(
        "INSERT INTO outbox_old (id, aggregatetype, aggregateid, type, payload) VALUES ($1::text::uuid, 'Order', '1', 'WhileRenamed', '{}')",
        &[&written_renamed],
    )
    .await?;
    let wal_after_bad = env.current_wal().await?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &[
            "`public.outbox`",
            "is now named `public.outbox_old`",
            "commit LSN",
        ],
    )
    .await?;
    assert!(env.checkpoint().await?.expect("checkpoint") < wal_after_bad);
    assert!(env.slot_confirmed().await?.expect("slot") < wal_after_bad);
    assert!(
        !read_stream(&js)
            .await?
            .iter()
            .any(|m| m.id() == written_renamed),
        "nothing of the renamed table was published"
    );

    // The operator renames it back: the row written under the other name arrives, as the
    // configured table's.
    db.batch_execute("ALTER TABLE outbox_old RENAME TO outbox")
        .await?;
    let e3 = insert_event(&db, "Order", "Created", r#"{"n":3}"#).await?;
    let mut relay = Relay::start(&config)?;
    let got = wait_for_id(&js, &e3, &relay).await?;
    let parked = got
        .iter()
        .find(|m| m.id() == written_renamed)
        .expect("the row written while renamed is delivered");
    assert_eq!(parked.header("Outbox-Table"), "public.outbox");

    // SET SCHEMA while running.
    db.batch_execute("CREATE SCHEMA archive; ALTER TABLE outbox SET SCHEMA archive")
        .await?;
    db.execute(
        "INSERT INTO archive.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'Order', '1', 'Moved', '{}')",
        &[],
    )
    .await?;
    let wal_after_bad = env.current_wal().await?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["`public.outbox`", "is now named `archive.outbox`"],
    )
    .await?;
    assert!(env.checkpoint().await?.expect("checkpoint") < wal_after_bad);
    Ok(())
}

/// The publication is checked while running: the outbox table dropped and re-created (the new
/// table is not in the publication), the table removed from it, inserts no longer published,
/// or the publication dropped: a clear error and exit 78, not a silent stop.
#[tokio::test(flavor = "multi_thread")]
async fn publication_drift_is_detected_while_running() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("publication_check_interval = \"500ms\"");
    let no_create = [("RELAY_POSTGRES__CREATE_PUBLICATION", "false")];

    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "ALTER PUBLICATION relay_pub SET (publish = 'update, delete')",
            "ALTER PUBLICATION relay_pub SET (publish = 'insert')",
            &["no longer publishes inserts", "relay_pub"],
        ),
        (
            "ALTER PUBLICATION relay_pub DROP TABLE outbox",
            "ALTER PUBLICATION relay_pub ADD TABLE outbox",
            &["`public.outbox` is no longer in publication `relay_pub`"],
        ),
        (
            "CREATE TABLE outbox_new (LIKE outbox INCLUDING ALL); DROP TABLE outbox; ALTER TABLE outbox_new RENAME TO outbox",
            "ALTER PUBLICATION relay_pub ADD TABLE outbox",
            &[
                "`public.outbox` is no longer in publication `relay_pub`",
                "dropped and re-created",
            ],
        ),
        (
            "DROP PUBLICATION relay_pub",
            "",
            // Whichever notices first: the check ("publication `relay_pub` no longer exists")
            // or the walsender decoding the next WAL ("publication \"relay_pub\" does not
            // exist"): both exit 78.
            &["relay_pub", "exist"],
        ),
    ];
    for (n, (drift, fix, needles)) in cases.iter().enumerate() {
        let started = Instant::now();
        // The last case must not have the relay re-create the publication it lost.
        let env_vars: &[(&str, &str)] = if n == 3 { &no_create } else { &[] };
        let mut relay = Relay::start_with_env(&config, &["run"], env_vars)?;
        relay.wait_log("replication started", WAIT).await?;
        let id = insert_event(&db, "Order", "Created", &format!("{{\"case\":{n}}}")).await?;
        wait_for_id(&js, &id, &relay).await?;
        db.batch_execute(drift).await?;
        expect_exit(&mut relay, EX_CONFIG, WAIT, needles).await?;
        if !fix.is_empty() {
            db.batch_execute(fix).await?;
        }
        println!("drift {drift:?}: {:?}", started.elapsed());
    }
    Ok(())
}

/// A publication created after the slot: the slot decodes its WAL with the catalog of the time,
/// so rows committed before the publication existed cannot be read through it (PostgreSQL 17
/// and older stop decoding, 18 skips them with a server-log warning only). Made by hand (slot,
/// an outbox row, then the publication): the relay refuses at start-up on every version, before
/// reading anything (exit 78 naming both and the fix), and the fix works. Made by the relay
/// (publication dropped, slot kept, restarted with create_publication = true): it refuses,
/// naming the fix.
#[tokio::test(flavor = "multi_thread")]
async fn publication_created_after_the_slot() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("");
    db.batch_execute("SELECT pg_create_logical_replication_slot('relay_slot', 'pgoutput')")
        .await?;
    let slot_before = env.slot_confirmed().await?;
    let before = insert_event(&db, "Order", "Created", r#"{"before":"publication"}"#).await?;
    db.batch_execute("CREATE PUBLICATION relay_pub FOR TABLE outbox WITH (publish = 'insert')")
        .await?;

    let mut relay = Relay::start(&config)?;
    let log = expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &[
            "publication `relay_pub` is newer than replication slot `relay_slot`",
            "skipped loading publication",
            "SELECT pg_drop_replication_slot('relay_slot')",
            "outbox-relay setup",
        ],
    )
    .await?;
    assert!(!log.contains("replication started"), "{log}");
    assert_eq!(stream_count(&js).await?, 0, "nothing published");
    assert_eq!(
        env.slot_confirmed().await?,
        slot_before,
        "nothing confirmed"
    );
    assert_eq!(env.checkpoint().await?, None, "nothing stored");

    db.batch_execute("DROP PUBLICATION relay_pub").await?;
    let mut relay = Relay::start(&config)?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &[
            "publication `relay_pub` does not exist, and creating it now",
            "pg_drop_replication_slot('relay_slot')",
            "outbox-relay setup",
        ],
    )
    .await?;
    let created = db
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = 'relay_pub'",
            &[],
        )
        .await?;
    assert!(
        created.is_none(),
        "the relay must not create the publication"
    );

    // The fix the message names (after publishing `before` by hand): a new slot after the
    // publication. The relay creates both, in that order, and streams.
    db.batch_execute(
        "SELECT pg_drop_replication_slot('relay_slot'); \
         DELETE FROM outbox_relay.checkpoint WHERE slot_name = 'relay_slot'",
    )
    .await?;
    let relay = Relay::start_streaming(&config).await?;
    let after = insert_event(&db, "Order", "Created", r#"{"after":"fix"}"#).await?;
    let got = wait_for_id(&js, &after, &relay).await?;
    assert!(
        got.iter().all(|m| m.id() != before),
        "{before} stays to publish by hand"
    );
    Ok(())
}
