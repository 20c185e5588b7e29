//! Outbox tables as application frameworks create them: names that need double quotes (a dot,
//! capitals), one row per listener kept apart by a publication row filter, and time columns
//! that are no `timestamptz` (an epoch count in milliseconds, a `timestamp without time zone`).

use std::time::Duration;

use anyhow::Result;

use crate::support::*;

const EX_CONFIG: i32 = 78;
const WAIT: Duration = Duration::from_secs(40);

/// `table = 'public."watermill_orders.created"'` and `'"Acme"."OutboxEvent"'`: both relayed,
/// named in `Outbox-Table` as the configuration writes them; the cleanup's fence and the
/// publication work on them. A bare `OutboxEvent` for a table the catalog stores as
/// `outboxevent` stops the relay with the line to write.
#[tokio::test(flavor = "multi_thread")]
async fn quoted_dotted_and_mixed_case_table_names_are_relayed() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    db.batch_execute(
        "CREATE TABLE public.\"watermill_orders.created\" (LIKE outbox INCLUDING ALL); \
         CREATE SCHEMA \"Acme\"; \
         CREATE TABLE \"Acme\".\"OutboxEvent\" (LIKE outbox INCLUDING ALL); \
         CREATE TABLE outboxevent (LIKE outbox INCLUDING ALL);",
    )
    .await?;
    let config = env.config(
        "[[outbox]]\ntable = 'public.\"watermill_orders.created\"'\n\
         [outbox.cleanup]\nmode = \"delete\"\nretain = \"1h\"\ninterval = \"200ms\"\n\
         [[outbox]]\ntable = '\"Acme\".\"OutboxEvent\"'\n",
    );
    let relay = Relay::start_streaming(&config).await?;
    let insert = |table: &'static str, n: i32| {
        let db = &db;
        async move {
            db.execute(
                &format!(
                    "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) \
                     VALUES (gen_random_uuid(), 'Order', 'o-' || $1::int, 'Created', \
                             jsonb_build_object('n', $1::int))"
                ),
                &[&n],
            )
            .await
        }
    };
    for n in 0..3 {
        insert("public.\"watermill_orders.created\"", n).await?;
        insert("\"Acme\".\"OutboxEvent\"", n).await?;
    }
    let messages = wait_for_messages(&js, 6, WAIT, Some(&relay)).await?;
    let mut tables: Vec<&str> = messages.iter().map(|m| m.header("Outbox-Table")).collect();
    tables.sort_unstable();
    assert_eq!(
        tables,
        [
            "Acme.OutboxEvent",
            "Acme.OutboxEvent",
            "Acme.OutboxEvent",
            "public.\"watermill_orders.created\"",
            "public.\"watermill_orders.created\"",
            "public.\"watermill_orders.created\"",
        ]
    );
    // The relay created the publication with both tables, quoted.
    let published: Vec<String> = db
        .query(
            "SELECT schemaname || '|' || tablename FROM pg_publication_tables \
             WHERE pubname = 'relay_pub' ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        published,
        ["Acme|OutboxEvent", "public|watermill_orders.created"]
    );
    // Cleanup found the dotted table (its fence is recorded under the name as configured).
    wait_until("the dotted table's cleanup fence", &relay, async || {
        Ok(db
            .query_opt(
                "SELECT 1 FROM outbox_relay.cleanup_fence \
                 WHERE table_name = 'public.\"watermill_orders.created\"'",
                &[],
            )
            .await?
            .is_some())
    })
    .await?;
    drop(relay);

    // A bare `OutboxEvent` names `public.OutboxEvent`, which does not exist; the catalog has
    // `public.outboxevent` and `Acme.OutboxEvent`: the error names both lines.
    let wrong = env.config("[[outbox]]\ntable = 'OutboxEvent'\n");
    let mut relay = Relay::start(&wrong)?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &[
            "outbox table `public.OutboxEvent` does not exist",
            "table = 'public.outboxevent'",
            "table = 'Acme.OutboxEvent'",
        ],
    )
    .await?;
    // The dotted name without quotes is three parts: refused before connecting, with the fix.
    let unquoted = env.config("[[outbox]]\ntable = 'public.watermill_orders.created'\n");
    let mut relay = Relay::start(&unquoted)?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["table = 'public.\"watermill_orders.created\"'"],
    )
    .await?;
    // Two parts that should have been one quoted name: the lookalike in `public` is named.
    let split = env.config("[[outbox]]\ntable = 'watermill_orders.created'\n");
    let mut relay = Relay::start(&split)?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &["table = 'public.\"watermill_orders.created\"'"],
    )
    .await?;
    Ok(())
}

/// Spring Modulith's `event_publication`: one row per listener. With `row_filter` the relay's
/// publication keeps one listener's rows; the other listener's are never published. A restart
/// finds the publication's filter equal to the configured one (as the server prints it); a
/// publication with another filter, or none, stops the relay with the statements that fix it;
/// a filter that is no condition on the table stops it with the server's reason.
#[tokio::test(flavor = "multi_thread")]
async fn row_filter_relays_one_listeners_rows_and_is_checked_at_start() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    db.batch_execute(
        "CREATE TABLE event_publication ( \
             id uuid NOT NULL PRIMARY KEY, listener_id text NOT NULL, event_type text NOT NULL, \
             serialized_event text NOT NULL, publication_date timestamptz NOT NULL, \
             completion_date timestamptz)",
    )
    .await?;
    let mapping = "[[outbox]]\ntable = \"event_publication\"\nsubject = \"outbox.modulith.{event_type}\"\n\
                   payload = \"serialized_event\"\nheaders = {}\n\
                   row_filter = \"listener_id = 'com.acme.Relay.on(OrderPlaced)'\"\n\
                   [outbox.cleanup]\nmode = \"mark\"\nsent_at_column = \"completion_date\"\n\
                   interval = \"200ms\"\n";
    let config = env.config(mapping);
    let relay = Relay::start_streaming(&config).await?;
    wait_until("the cleanup fence", &relay, async || {
        Ok(db
            .query_opt("SELECT 1 FROM outbox_relay.cleanup_fence", &[])
            .await?
            .is_some())
    })
    .await?;
    let mut kept = Vec::new();
    for n in 0..4 {
        for listener in [
            "com.acme.Relay.on(OrderPlaced)",
            "com.acme.Billing.on(OrderPlaced)",
        ] {
            let id = uuid::Uuid::new_v4().to_string();
            db.execute(
                "INSERT INTO event_publication \
                 (id, listener_id, event_type, serialized_event, publication_date) \
                 VALUES ($1::text::uuid, $2, 'OrderPlaced', $3, now())",
                &[&id, &listener, &format!("{{\"n\":{n}}}")],
            )
            .await?;
            if listener.contains("Relay") {
                kept.push(id);
            }
        }
    }
    wait_for_messages(&js, 4, WAIT, Some(&relay)).await?;
    // Another row after the others, so that a late fifth message would have arrived by then.
    let last = uuid::Uuid::new_v4().to_string();
    db.execute(
        "INSERT INTO event_publication (id, listener_id, event_type, serialized_event, publication_date) \
         VALUES ($1::text::uuid, 'com.acme.Relay.on(OrderPlaced)', 'OrderPlaced', '{}', now())",
        &[&last],
    )
    .await?;
    kept.push(last.clone());
    let mut ids: Vec<String> = wait_for_id(&js, &last, &relay)
        .await?
        .iter()
        .map(|m| m.id().to_owned())
        .collect();
    ids.sort();
    kept.sort();
    assert_eq!(ids, kept, "exactly the relay listener's rows");
    let filter: String = db
        .query_one(
            "SELECT rowfilter FROM pg_publication_tables WHERE pubname = 'relay_pub'",
            &[],
        )
        .await?
        .get(0);
    assert!(filter.contains("listener_id"), "{filter}");
    // Cleanup marks the relay listener's rows only: the other listener's are Modulith's.
    let completed = async || -> Result<Vec<(String, bool)>> {
        Ok(db
            .query(
                "SELECT listener_id, bool_and(completion_date IS NOT NULL) \
                 FROM event_publication GROUP BY 1 ORDER BY 1",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    };
    wait_until("the relay listener's rows marked", &relay, async || {
        Ok(completed()
            .await?
            .iter()
            .any(|(l, done)| l.contains("Relay") && *done))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        completed().await?,
        [
            ("com.acme.Billing.on(OrderPlaced)".to_owned(), false),
            ("com.acme.Relay.on(OrderPlaced)".to_owned(), true),
        ]
    );
    drop(relay);
    // Started again: the publication's filter is the configured one.
    let relay = Relay::start_streaming(&config).await?;
    drop(relay);

    // Another filter: refused, with the statements that fix it.
    db.batch_execute(
        "ALTER PUBLICATION relay_pub DROP TABLE event_publication; \
         ALTER PUBLICATION relay_pub ADD TABLE event_publication WHERE (listener_id <> '')",
    )
    .await?;
    let mut relay = Relay::start(&config)?;
    expect_exit(
        &mut relay,
        EX_CONFIG,
        WAIT,
        &[
            "outbox table public.event_publication: row_filter",
            "has row filter ((listener_id <> ''::text))",
            "ALTER PUBLICATION relay_pub DROP TABLE \"public\".\"event_publication\"; ALTER PUBLICATION relay_pub ADD TABLE \"public\".\"event_publication\" WHERE ((listener_id = 'com.acme.Relay.on(OrderPlaced)'::text))",
        ],
    )
    .await?;
    // The statements from the message fix it.
    db.batch_execute(
        "BEGIN; ALTER PUBLICATION relay_pub DROP TABLE \"public\".\"event_publication\"; \
         ALTER PUBLICATION relay_pub ADD TABLE \"public\".\"event_publication\" \
             WHERE ((listener_id = 'com.acme.Relay.on(OrderPlaced)'::text)); COMMIT",
    )
    .await?;
    let relay = Relay::start_streaming(&config).await?;
    drop(relay);

    // No filter at all on the publication: refused too.
    db.batch_execute(
        "ALTER PUBLICATION relay_pub DROP TABLE event_publication; \
         ALTER PUBLICATION relay_pub ADD TABLE event_publication",
    )
    .await?;
    let mut relay = Relay::start(&config)?;
    expect_exit(&mut relay, EX_CONFIG, WAIT, &["has no row filter"]).await?;

    // A filter that is no condition on the table (a column it lacks), and one that tries to
    // close its parentheses (refused with the configuration): refused before any publication
    // is made.
    // (The slot goes too: a publication is never created after its slot.)
    db.batch_execute(
        "DROP PUBLICATION relay_pub; SELECT pg_drop_replication_slot('relay_slot'); \
         DELETE FROM outbox_relay.checkpoint",
    )
    .await?;
    for (filter, needle) in [
        ("listener = 'x'", "is not a valid condition"),
        (
            "true), public.outbox WHERE (true",
            "row_filter `true), public.outbox WHERE (true` closes a parenthesis it did not open",
        ),
    ] {
        let bad = env.config(&mapping.replace(
            "row_filter = \"listener_id = 'com.acme.Relay.on(OrderPlaced)'\"",
            &format!("row_filter = {filter:?}"),
        ));
        let mut relay = Relay::start(&bad)?;
        expect_exit(&mut relay, EX_CONFIG, WAIT, &[needle, "event_publication"]).await?;
    }
    let exists: bool = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'relay_pub')",
            &[],
        )
        .await?
        .get(0);
    assert!(!exists, "no publication is made from a refused filter");
    Ok(())
}

/// Cleanup on an Eventuate-style `creation_time bigint` (epoch milliseconds, `age_unit = "ms"`)
/// and a CAP-style `"Added" timestamp` written in a zone west of the server's
/// (`age_time_zone`): rows older than `retain` go, younger ones stay (read as the server's zone,
/// the wall-clock rows would all look hours old). Without the setting the relay refuses to
/// start, naming the table, the column and the setting.
#[tokio::test(flavor = "multi_thread")]
async fn cleanup_reads_epoch_millis_and_wall_clock_columns_by_their_type() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute(
        "CREATE TABLE message (LIKE outbox INCLUDING ALL, creation_time bigint NOT NULL); \
         CREATE TABLE published (LIKE outbox INCLUDING ALL, \"Added\" timestamp NOT NULL); \
         SET TIME ZONE 'UTC';",
    )
    .await?;
    // West of any zone a test server runs in (UTC-11, no daylight saving time): read in the
    // server's zone, a row written 30 minutes ago there looks hours old.
    let zone = "Pacific/Pago_Pago";
    let epoch = |retain_only: bool| {
        format!(
            "[[outbox]]\ntable = \"message\"\n[outbox.cleanup]\nmode = \"delete\"\nretain = \"1h\"\n\
             interval = \"200ms\"\nage_column = \"creation_time\"\n{}",
            if retain_only {
                ""
            } else {
                "age_unit = \"ms\"\n"
            }
        )
    };
    let wall = |with_zone: bool| {
        format!(
            "[[outbox]]\ntable = \"published\"\n[outbox.cleanup]\nmode = \"delete\"\nretain = \"1h\"\n\
             interval = \"200ms\"\nage_column = \"Added\"\n{}",
            if with_zone {
                format!("age_time_zone = \"{zone}\"\n")
            } else {
                String::new()
            }
        )
    };

    // Without the settings: refused at start, nothing cleaned. (Both tables in each config:
    // the first start creates the publication with both.)
    for (config, needles) in [
        (
            format!("{}{}", epoch(true), wall(true)),
            vec!["public.message", "`creation_time` is bigint", "age_unit"],
        ),
        (
            format!("{}{}", epoch(false), wall(false)),
            vec![
                "public.published",
                "`Added` is timestamp without time zone",
                "age_time_zone",
            ],
        ),
    ] {
        let mut relay = Relay::start(&env.config(&config))?;
        expect_exit(&mut relay, EX_CONFIG, WAIT, &needles).await?;
    }

    let config = env.config(&format!("{}{}", epoch(false), wall(true)));
    let relay = Relay::start_streaming(&config).await?;
    wait_until("both cleanup fences", &relay, async || {
        Ok(db
            .query_one("SELECT count(*) FROM outbox_relay.cleanup_fence", &[])
            .await?
            .get::<_, i64>(0)
            == 2)
    })
    .await?;
    // Rows 2 h old and 30 min old, each as the framework writes its time.
    for (age, kind) in [("2 hours", "old"), ("30 minutes", "young")] {
        db.execute(
            "INSERT INTO message (id, aggregatetype, aggregateid, type, payload, creation_time) \
             VALUES (gen_random_uuid(), 'Order', $2, 'Created', '{}', \
                     (extract(epoch FROM now() - $1::text::interval) * 1000)::bigint)",
            &[&age, &kind],
        )
        .await?;
        db.execute(
            "INSERT INTO published (id, aggregatetype, aggregateid, type, payload, \"Added\") \
             VALUES (gen_random_uuid(), 'Order', $2, 'Created', '{}', \
                     (now() - $1::text::interval) AT TIME ZONE $3)",
            &[&age, &kind, &zone],
        )
        .await?;
    }
    let left = async |table: &str| -> Result<Vec<String>> {
        Ok(db
            .query(&format!("SELECT aggregateid FROM {table} ORDER BY 1"), &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    };
    wait_until("the old rows' deletion", &relay, async || {
        Ok(left("message").await? == ["young"] && left("published").await? == ["young"])
    })
    .await?;
    // Some more rounds: the young rows stay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(left("message").await?, ["young"]);
    assert_eq!(left("published").await?, ["young"]);
    Ok(())
}
