//! The start-up check that refuses a publication newer than the slot
//! (`relay_postgres`'s `publication_order`) compares transaction ids: the publication's oldest
//! catalog row against the slot's `catalog_xmin`. It must not refuse a publication that is
//! older than the slot, when a transaction open across both creations leaves a fresh slot's
//! `catalog_xmin` behind the publication, or after `ALTER PUBLICATION … SET` rewrote its row;
//! and it must refuse one dropped and re-created behind a stopped relay's back.

use std::time::Duration;

use anyhow::Result;
use nix::sys::signal::Signal;

use crate::support::*;

const EX_CONFIG: i32 = 78;
const WAIT: Duration = Duration::from_secs(30);

/// `age()` of the slot's catalog_xmin and of the publication's row: the slot looks older
/// than the publication when the first is not larger.
async fn ages(db: &tokio_postgres::Client) -> Result<(i32, i32)> {
    let row = db
        .query_one(
            "SELECT age(s.catalog_xmin), age(p.xmin) FROM pg_replication_slots s, pg_publication p \
             WHERE s.slot_name = 'relay_slot' AND p.pubname = 'relay_pub'",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

#[tokio::test(flavor = "multi_thread")]
async fn publication_older_than_the_slot_is_accepted_and_a_recreated_one_refused() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let config = env.config("");

    // A transaction with an xid older than the publication stays open while the slot is
    // created (the creation waits for it): the new slot's catalog_xmin is that xid.
    let open = env.db().await?;
    open.batch_execute("BEGIN; SELECT txid_current()").await?;
    db.batch_execute("CREATE PUBLICATION relay_pub FOR TABLE outbox WITH (publish = 'insert')")
        .await?;
    let creator = env.db().await?;
    let create = tokio::spawn(async move {
        creator
            .batch_execute("SELECT pg_create_logical_replication_slot('relay_slot', 'pgoutput')")
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    open.batch_execute("COMMIT").await?;
    create.await??;
    let (slot_age, publication_age) = ages(&db).await?;
    assert!(
        slot_age >= publication_age,
        "the fresh slot's catalog_xmin (age {slot_age}) is not older than the publication (age {publication_age})"
    );
    let mut relay = Relay::start_streaming(&config).await?;
    let first = insert_event(&db, "Order", "Created", r#"{"n":1}"#).await?;
    wait_for_id(&js, &first, &relay).await?;
    relay.signal(Signal::SIGTERM);
    assert_eq!(relay.wait_exit(WAIT).await?.code(), Some(0));

    // ALTER PUBLICATION … SET rewrites the publication's row while the relay is stopped.
    db.batch_execute("ALTER PUBLICATION relay_pub SET (publish = 'insert')")
        .await?;
    let (slot_age, publication_age) = ages(&db).await?;
    assert!(
        slot_age >= publication_age,
        "the row is newer than the slot's horizon"
    );
    let mut relay = Relay::start_streaming(&config).await?;
    let second = insert_event(&db, "Order", "Created", r#"{"n":2}"#).await?;
    wait_for_id(&js, &second, &relay).await?;
    relay.signal(Signal::SIGTERM);
    assert_eq!(relay.wait_exit(WAIT).await?.code(), Some(0));

    // Dropped and re-created behind the stopped relay's back, a row committed in between.
    db.batch_execute("DROP PUBLICATION relay_pub").await?;
    let between = insert_event(&db, "Order", "Created", r#"{"n":"between"}"#).await?;
    db.batch_execute("CREATE PUBLICATION relay_pub FOR TABLE outbox WITH (publish = 'insert')")
        .await?;
    let slot_before = env.slot_confirmed().await?;
    let mut relay = Relay::start(&config)?;
    let log = expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["publication `relay_pub` is newer than replication slot `relay_slot`"],
    )
    .await?;
    assert!(!log.contains("replication started"), "{log}");
    assert_eq!(
        env.slot_confirmed().await?,
        slot_before,
        "nothing confirmed"
    );
    let got = read_stream(&js).await?;
    assert!(got.iter().all(|m| m.id() != between), "not published");
    Ok(())
}
