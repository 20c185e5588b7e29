//! Partitioned outbox tables: configured like any outbox table, published as the
//! root's rows (`publish_via_partition_root`, set by the relay when it creates the
//! publication), so events carry the configured table's name whatever partition holds them;
//! partitions created, attached, detached and dropped while the relay runs change nothing for
//! delivery; a publication made by hand without the option is refused (78) with the fix, and
//! the rows decoded before the fix are still delivered.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::Signal;

use crate::support::*;

const EX_CONFIG: i32 = 78;
const WAIT: Duration = Duration::from_secs(30);

/// Replaces the default `public.outbox` with a table of the same columns, partitioned by range
/// of `created_at`, then runs `partitions` (the `CREATE TABLE … PARTITION OF outbox …`).
async fn partitioned_outbox(db: &tokio_postgres::Client, partitions: &str) -> Result<()> {
    db.batch_execute(&format!(
        "DROP TABLE outbox; \
         CREATE TABLE outbox ( \
             id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, \
             aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, \
             tracingspancontext varchar(512), created_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at); \
         {partitions}"
    ))
    .await?;
    Ok(())
}

/// Inserts one event with `created_at` = `at` (a timestamptz expression); returns its id.
async fn insert_at(
    db: &impl tokio_postgres::GenericClient,
    kind: &str,
    at: &str,
) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    db.execute(
        &format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
             VALUES ($1::text::uuid, 'Order', '1', $2, '{{}}', {at})"
        ),
        &[&id, &kind],
    )
    .await
    .with_context(|| format!("insert at {at}"))?;
    Ok(id)
}

/// Which relation OIDs pgoutput sends the outbox's inserts under, through the relay's
/// publication: read from a second slot (created before the inserts) without consuming it.
async fn insert_relation_oids(db: &tokio_postgres::Client) -> Result<BTreeSet<u32>> {
    let rows = db
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('probe', NULL, NULL, \
                 'proto_version', '1', 'publication_names', 'relay_pub') \
             WHERE get_byte(data, 0) = 73",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let data: Vec<u8> = r.get(0);
            u32::from_be_bytes([data[1], data[2], data[3], data[4]])
        })
        .collect())
}

async fn oid_of(db: &tokio_postgres::Client, table: &str) -> Result<u32> {
    Ok(db
        .query_one("SELECT $1::text::regclass::oid", &[&table])
        .await?
        .get(0))
}

/// A range-partitioned outbox (last month, this month, next month, and a default partition)
/// relays end to end: the relay creates the publication with `publish_via_partition_root`,
/// pgoutput sends every insert under the root's OID, and every event carries `public.outbox`
/// whatever partition holds its row.
#[tokio::test(flavor = "multi_thread")]
async fn a_partitioned_outbox_relays_by_configuration_alone() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    partitioned_outbox(
        &db,
        "CREATE TABLE outbox_last PARTITION OF outbox \
             FOR VALUES FROM (date_trunc('month', now()) - interval '1 month') TO (date_trunc('month', now())); \
         CREATE TABLE outbox_this PARTITION OF outbox \
             FOR VALUES FROM (date_trunc('month', now())) TO (date_trunc('month', now()) + interval '1 month'); \
         CREATE TABLE outbox_next PARTITION OF outbox \
             FOR VALUES FROM (date_trunc('month', now()) + interval '1 month') TO (date_trunc('month', now()) + interval '2 months'); \
         CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;",
    )
    .await?;
    let relay = Relay::start_streaming(&env.config("")).await?;
    let via_root: bool = db
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'relay_pub'",
            &[],
        )
        .await?
        .get(0);
    assert!(
        via_root,
        "the relay creates the publication with publish_via_partition_root"
    );
    db.batch_execute("SELECT pg_create_logical_replication_slot('probe', 'pgoutput')")
        .await?;

    let mut ids = Vec::new();
    for (kind, at) in [
        ("Last", "date_trunc('month', now()) - interval '1 day'"),
        ("This", "now()"),
        ("Next", "date_trunc('month', now()) + interval '40 days'"),
        ("Default", "now() + interval '10 years'"),
        ("DefaultPast", "now() - interval '10 years'"),
    ] {
        ids.push((kind, insert_at(&db, kind, at).await?));
    }
    // Through the default mapping too (created_at from its default).
    ids.push(("Plain", insert_event(&db, "Order", "Plain", "{}").await?));
    let got = wait_for_messages(&js, ids.len(), WAIT, Some(&relay)).await?;
    assert_eq!(got.len(), ids.len());
    for (kind, id) in &ids {
        let m = got
            .iter()
            .find(|m| m.id() == id)
            .with_context(|| format!("{kind} event {id} missing"))?;
        assert_eq!(m.header("Outbox-Table"), "public.outbox", "{kind}");
        assert_eq!(m.subject, format!("outbox.Order.{kind}"));
    }
    let per_partition: Vec<(String, i64)> = db
        .query(
            "SELECT tableoid::regclass::text, count(*) FROM outbox GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        per_partition,
        [
            ("outbox_default".to_owned(), 2),
            ("outbox_last".to_owned(), 1),
            ("outbox_next".to_owned(), 1),
            ("outbox_this".to_owned(), 2),
        ]
    );
    // What pgoutput sent: every insert under the root's OID, none under a partition's.
    let root = oid_of(&db, "outbox").await?;
    assert_eq!(insert_relation_oids(&db).await?, BTreeSet::from([root]));
    db.batch_execute("SELECT pg_drop_replication_slot('probe')")
        .await?;
    assert!(!relay.log().contains("another name"), "{}", relay.log());
    Ok(())
}

/// Under a steady load of transactions into the newest partition, partitions are created
/// (`CREATE TABLE … PARTITION OF`) and attached (`ALTER TABLE … ATTACH PARTITION`) one after
/// the other, and the load moves on into each as soon as it exists: every committed event
/// arrives, by event id, and nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn partitions_created_and_attached_under_load_lose_no_event() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    // Day d of the load is 2030-01-01 + d days; partition d holds day d.
    let day = |d: i64| format!("(timestamptz '2030-01-01 00:00+00' + interval '{d} days')");
    partitioned_outbox(
        &db,
        &format!(
            "CREATE TABLE outbox_d0 PARTITION OF outbox FOR VALUES FROM ({}) TO ({});",
            day(0),
            day(1)
        ),
    )
    .await?;
    let mut relay = Relay::start_streaming(&env.config("")).await?;

    // The load writes into the newest day that has a partition.
    let newest = Arc::new(AtomicI64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let load = {
        let (newest, done, url) = (newest.clone(), done.clone(), env.pg.url(DB));
        tokio::spawn(async move {
            let (mut client, connection) =
                tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let mut ids = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let d = newest.load(Ordering::Relaxed);
                let tx = client.transaction().await?;
                let mut batch = Vec::new();
                for r in 0..5 {
                    let at = format!(
                        "(timestamptz '2030-01-01 00:00+00' + interval '{d} days' + interval '{r} seconds')"
                    );
                    batch.push(insert_at(&tx, "Load", &at).await?);
                }
                tx.commit().await?;
                ids.extend(batch);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(ids)
        })
    };
    for d in 1..=6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if d % 2 == 1 {
            db.batch_execute(&format!(
                "CREATE TABLE outbox_d{d} PARTITION OF outbox FOR VALUES FROM ({}) TO ({})",
                day(d),
                day(d + 1)
            ))
            .await?;
        } else {
            db.batch_execute(&format!(
                "CREATE TABLE outbox_d{d} (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS); \
                 ALTER TABLE outbox ATTACH PARTITION outbox_d{d} FOR VALUES FROM ({}) TO ({})",
                day(d),
                day(d + 1)
            ))
            .await?;
        }
        newest.store(d, Ordering::Relaxed);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, Ordering::Relaxed);
    let ids = load.await??;
    let partitions_used: i64 = db
        .query_one("SELECT count(DISTINCT tableoid) FROM outbox", &[])
        .await?
        .get(0);
    assert_eq!(partitions_used, 7, "the load wrote into every partition");

    let got = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(&relay)).await?;
    let sent: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for m in &got {
        *seen.entry(m.id()).or_default() += 1;
        assert_eq!(m.header("Outbox-Table"), "public.outbox");
    }
    let received: BTreeSet<&str> = seen.keys().copied().collect();
    assert_eq!(
        sent.difference(&received).count(),
        0,
        "events lost: {:?}",
        sent.difference(&received).take(5).collect::<Vec<_>>()
    );
    assert_eq!(received.difference(&sent).count(), 0, "unexpected events");
    assert!(seen.values().all(|&n| n == 1), "an event stored twice");
    assert!(
        relay.try_status()?.is_none(),
        "the relay keeps running:\n{}",
        relay.log()
    );
    Ok(())
}

/// Partitions detached (`CONCURRENTLY`, and plainly) and dropped while the relay runs change
/// nothing for delivery: rows committed into a partition before it was detached are delivered
/// (even when the relay reads them only after the partition is gone: decoding uses the catalog
/// of their time), rows written into a detached table are not outbox rows, and the relay goes
/// on.
#[tokio::test(flavor = "multi_thread")]
async fn detached_and_dropped_partitions_change_nothing_for_delivery() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let day = |d: i64| format!("(timestamptz '2030-01-01 00:00+00' + interval '{d} days')");
    let mut sql = String::new();
    for d in 0..4 {
        sql.push_str(&format!(
            "CREATE TABLE outbox_d{d} PARTITION OF outbox FOR VALUES FROM ({}) TO ({});",
            day(d),
            day(d + 1)
        ));
    }
    partitioned_outbox(&db, &sql).await?;
    let config = env.config("");
    let mut relay = Relay::start_streaming(&config).await?;
    let mut expected = Vec::new();
    for d in 0..4 {
        expected.push(insert_at(&db, "Before", &day(d)).await?);
    }
    wait_for_messages(&js, expected.len(), WAIT, Some(&relay)).await?;

    // Detached concurrently (no default partition) and plainly, under writes to the others.
    expected.push(insert_at(&db, "Before", &day(0)).await?);
    db.batch_execute("ALTER TABLE outbox DETACH PARTITION outbox_d0 CONCURRENTLY")
        .await?;
    expected.push(insert_at(&db, "Live", &day(2)).await?);
    expected.push(insert_at(&db, "Before", &day(1)).await?);
    db.batch_execute("ALTER TABLE outbox DETACH PARTITION outbox_d1")
        .await?;
    // The detached tables are not the outbox any more.
    let outside = insert_at(&db, "Outside", &day(0)).await;
    assert!(outside.is_err(), "day 0 has no partition now");
    db.execute(
        "INSERT INTO outbox_d0 (id, aggregatetype, aggregateid, type, payload, created_at) \
         VALUES (gen_random_uuid(), 'Order', '1', 'Detached', '{}', timestamptz '2030-01-01 01:00+00')",
        &[],
    )
    .await?;
    db.batch_execute("DROP TABLE outbox_d0").await?;
    expected.push(insert_at(&db, "Live", &day(3)).await?);
    let got = wait_for_messages(&js, expected.len(), WAIT, Some(&relay)).await?;

    // Stopped, a row committed into a partition that is then detached and dropped before the
    // relay reads it: still delivered, as the outbox's.
    relay.signal(Signal::SIGTERM);
    assert_eq!(relay.wait_exit(WAIT).await?.code(), Some(0));
    let late = insert_at(&db, "Late", &day(2)).await?;
    db.batch_execute("ALTER TABLE outbox DETACH PARTITION outbox_d2; DROP TABLE outbox_d2")
        .await?;
    expected.push(late.clone());
    expected.push(insert_at(&db, "Live", &day(3)).await?);
    let relay = Relay::start(&config)?;
    let got_after = wait_for_messages(&js, expected.len(), WAIT, Some(&relay)).await?;
    assert!(got.len() < got_after.len());
    let received: BTreeSet<&str> = got_after.iter().map(Received::id).collect();
    let wanted: BTreeSet<&str> = expected.iter().map(String::as_str).collect();
    assert_eq!(received, wanted, "exactly the outbox's events");
    assert!(got_after.iter().all(
        |m| m.header("Outbox-Table") == "public.outbox" && m.subject != "outbox.Order.Detached"
    ));
    assert_eq!(got_after.len(), expected.len(), "each once");
    Ok(())
}

/// A publication created by hand without `publish_via_partition_root`: pgoutput would send the
/// partitions' rows under their own names. The relay refuses at start-up (78) with the
/// `ALTER PUBLICATION` that fixes it and nothing stored or confirmed; after the fix the rows
/// committed before it (which are still decoded as their partitions') are delivered as the
/// outbox's, with the ones after it. Turning the option off while the relay runs stops it (78)
/// with the same fix.
#[tokio::test(flavor = "multi_thread")]
async fn a_publication_without_the_root_option_is_refused_with_the_fix() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    partitioned_outbox(
        &db,
        "CREATE TABLE outbox_a PARTITION OF outbox \
             FOR VALUES FROM ('2000-01-01') TO ('2100-01-01'); \
         CREATE TABLE outbox_rest PARTITION OF outbox DEFAULT;",
    )
    .await?;
    db.batch_execute("CREATE PUBLICATION relay_pub FOR TABLE outbox WITH (publish = 'insert')")
        .await?;
    db.batch_execute("SELECT pg_create_logical_replication_slot('relay_slot', 'pgoutput')")
        .await?;
    let slot_before = env.slot_confirmed().await?;
    let before = insert_event(&db, "Order", "BeforeFix", "{}").await?;
    let before_default = insert_at(&db, "BeforeFix", "timestamptz '2200-01-01'").await?;

    let config = env.config("publication_check_interval = \"500ms\"");
    let mut relay = Relay::start(&config)?;
    let log = expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &[
            "outbox table `public.outbox` is partitioned",
            "publish_via_partition_root is off",
            "ALTER PUBLICATION relay_pub SET (publish_via_partition_root = true)",
            "Rows committed before that ALTER are still decoded as their partitions'",
        ],
    )
    .await?;
    assert!(!log.contains("replication started"), "{log}");
    assert_eq!(
        env.slot_confirmed().await?,
        slot_before,
        "nothing confirmed"
    );
    assert_eq!(stream_count(&js).await?, 0, "nothing published");

    // validate --connect says the same.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&config)
        .args(["validate", "--connect"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{text}");
    assert!(
        text.contains("FAIL  publication relay_pub has public.outbox: partitioned, published as its partitions")
            && text.contains("SET (publish_via_partition_root = true)"),
        "{text}"
    );

    // The fix. Rows from before it arrive under the partitions' OIDs and names.
    db.batch_execute("ALTER PUBLICATION relay_pub SET (publish_via_partition_root = true)")
        .await?;
    let after = insert_event(&db, "Order", "AfterFix", "{}").await?;
    let mut relay = Relay::start(&config)?;
    let got = wait_for_messages(&js, 3, WAIT, Some(&relay)).await?;
    let ids: BTreeSet<&str> = got.iter().map(Received::id).collect();
    assert_eq!(
        ids,
        BTreeSet::from([before.as_str(), before_default.as_str(), after.as_str()])
    );
    assert!(
        got.iter()
            .all(|m| m.header("Outbox-Table") == "public.outbox")
    );

    // Turned off while running: stopped with the fix.
    db.batch_execute("ALTER PUBLICATION relay_pub SET (publish_via_partition_root = false)")
        .await?;
    let off = insert_event(&db, "Order", "WhileOff", "{}").await?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["ALTER PUBLICATION relay_pub SET (publish_via_partition_root = true)"],
    )
    .await?;
    // The row written meanwhile went to a partition the session knew: delivered as the outbox's
    // once the option is back.
    db.batch_execute("ALTER PUBLICATION relay_pub SET (publish_via_partition_root = true)")
        .await?;
    let relay = Relay::start(&config)?;
    let got = wait_for_id(&js, &off, &relay).await?;
    assert!(
        got.iter()
            .filter(|m| m.id() == off)
            .all(|m| m.header("Outbox-Table") == "public.outbox")
    );
    Ok(())
}
