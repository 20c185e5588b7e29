//! What cleanup needs from the role (`validate --connect`), and the migration from a polling
//! publisher (docs/migrating.md) end to end.

use super::*;

/// `validate --connect` checks what the chosen mode needs and prints the GRANT: DELETE for
/// `delete`, UPDATE of the columns for `mark`, and names a missing column.
#[tokio::test(flavor = "multi_thread")]
async fn validate_connect_names_the_grant_each_mode_needs() -> Result<()> {
    let env = Env::start().await?;
    let admin = env.db().await?;
    admin
        .batch_execute(
            "CREATE ROLE relay_min LOGIN REPLICATION PASSWORD 'relay-min-pw'; \
             GRANT SELECT ON public.outbox TO relay_min; \
             GRANT USAGE ON SCHEMA outbox_relay TO relay_min; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.checkpoint TO relay_min; \
             CREATE PUBLICATION relay_pub FOR TABLE public.outbox WITH (publish = 'insert', publish_via_partition_root = true);",
        )
        .await?;
    let url = format!(
        "postgres://relay_min:relay-min-pw@127.0.0.1:{}/{DB}",
        env.pg.port()
    );
    let validate = |config: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .arg("--config")
            .arg(config)
            .args(["validate", "--connect"])
            .env("RUST_LOG", "warn")
            .output()
            .expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let with = |cleanup: &str| {
        crate::security::pg_config(&env, &cleanup_config(&env, cleanup, ""), &url, "")
    };

    let (code, out) = validate(&with("mode = \"delete\""));
    assert_eq!(code, Some(78), "{out}");
    assert!(
        out.contains(
            "FAIL  cleanup public.outbox: mode = \"delete\" needs privileges the role lacks"
        ) && out.contains("hint: GRANT SELECT, DELETE ON \"public\".\"outbox\" TO relay_min"),
        "{out}"
    );
    let (_, out) = validate(&with(
        "mode = \"mark\"\nstatus_column = \"status\"\nsent_at_column = \"sent_at\"",
    ));
    assert!(
        out.contains("FAIL  cleanup public.outbox: no column status, sent_at"),
        "{out}"
    );
    admin
        .batch_execute("ALTER TABLE outbox ADD COLUMN status text, ADD COLUMN sent_at timestamptz")
        .await?;
    let (_, out) = validate(&with(
        "mode = \"mark\"\nstatus_column = \"status\"\nsent_at_column = \"sent_at\"",
    ));
    assert!(
        out.contains(
            "hint: GRANT UPDATE (\"status\", \"sent_at\") ON \"public\".\"outbox\" TO relay_min"
        ),
        "{out}"
    );
    let (_, out) = validate(&with(
        "mode = \"mark\"\nstatus_column = \"status\"\nsent_at_column = \"sent_at\"\ndelete_after = \"7d\"",
    ));
    assert!(
        out.contains("mode = \"mark\" with delete_after needs privileges the role lacks")
            && out.contains("GRANT UPDATE (\"status\", \"sent_at\") ON \"public\".\"outbox\" TO relay_min; GRANT SELECT, DELETE ON \"public\".\"outbox\" TO relay_min"),
        "{out}"
    );
    let (_, out) = validate(&with("mode = \"drop-partitions\""));
    assert!(out.contains("GRANT \"postgres\" TO relay_min"), "{out}");
    admin
        .batch_execute("GRANT DELETE ON public.outbox TO relay_min")
        .await?;
    let (_, out) = validate(&with("mode = \"delete\""));
    assert!(
        out.contains("hint: GRANT USAGE ON SCHEMA outbox_relay TO relay_min; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.cleanup_fence, outbox_relay.cleanup_detached TO relay_min"),
        "{out}"
    );
    admin
        .batch_execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.cleanup_fence, outbox_relay.cleanup_detached TO relay_min",
        )
        .await?;
    let (code, out) = validate(&with("mode = \"delete\"\nretain = \"2d\""));
    assert!(
        out.contains("PASS  cleanup public.outbox: mode = \"delete\", retain 2days"),
        "{out}"
    );
    assert!(!out.contains("FAIL  cleanup"), "{code:?} {out}");
    Ok(())
}

/// docs/migrating.md end to end: a polling publisher (`FOR UPDATE SKIP LOCKED`, publishes with
/// `Nats-Msg-Id` = id, marks `sent_at`) with a backlog from before the relay, then the relay in
/// mark mode beside it under load, the checks of step 6, the poller stopped: every event is in
/// the stream exactly once, every row ends marked, and the relay saw no collision.
#[tokio::test(flavor = "multi_thread")]
async fn migrating_from_a_poller_loses_and_doubles_nothing() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    db.batch_execute("ALTER TABLE outbox ADD COLUMN sent_at timestamptz")
        .await?;
    let config = cleanup_config(
        &env,
        "mode = \"mark\"\nsent_at_column = \"sent_at\"\ninterval = \"200ms\"",
        "",
    );
    let insert = async |db: &tokio_postgres::Client, n: usize| -> Result<Vec<String>> {
        let mut ids = Vec::new();
        for i in 0..n {
            ids.push(insert_event(db, "Order", "Created", &format!(r#"{{"n": {i}}}"#)).await?);
        }
        Ok(ids)
    };
    // The poller's backlog, from before the relay's slot.
    let mut ids = insert(&db, 50).await?;
    let setup = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&config)
        .args(["setup", "--create-stream"])
        .output()?;
    assert!(setup.status.success(), "{setup:?}");

    let stop_poller = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, url, js) = (stop_poller.clone(), env.pg.url(DB), js.clone());
        tokio::spawn(async move {
            let (mut client, connection) =
                tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let (mut published, mut duplicates) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                let tx = client.transaction().await?;
                let rows = tx
                    .query(
                        "SELECT id::text, aggregatetype, type, payload::text FROM outbox \
                         WHERE sent_at IS NULL ORDER BY created_at LIMIT 20 FOR UPDATE SKIP LOCKED",
                        &[],
                    )
                    .await?;
                let mut sent = Vec::new();
                for row in &rows {
                    let (id, aggregate, kind, payload): (String, String, String, String) =
                        (row.get(0), row.get(1), row.get(2), row.get(3));
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", id.as_str());
                    let ack = js
                        .publish_with_headers(
                            format!("outbox.{aggregate}.{kind}"),
                            headers,
                            payload.into_bytes().into(),
                        )
                        .await?
                        .await?;
                    duplicates += usize::from(ack.duplicate);
                    sent.push(id);
                }
                tx.execute(
                    "UPDATE outbox SET sent_at = now() WHERE id::text = ANY($1)",
                    &[&sent],
                )
                .await?;
                tx.commit().await?;
                published += sent.len();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok((published, duplicates))
        })
    };

    let (http, addr) = http_listen();
    let config = {
        let text = std::fs::read_to_string(&config)?;
        let path = config.with_extension("http.toml");
        std::fs::write(
            &path,
            text.replacen("\n[[outbox]]", &format!("{http}\n[[outbox]]"), 1),
        )?;
        path
    };
    let relay = Relay::start_streaming(&config).await?;
    for _ in 0..10 {
        ids.extend(insert(&db, 20).await?);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Step 6: the relay ready with its fence, and nothing older than a moment unsent.
    wait_for_fence(&db, &relay).await?;
    wait_until("no old unsent row", &relay, async || {
        let unsent: i64 = db
            .query_one(
                "SELECT count(*) FROM outbox WHERE sent_at IS NULL AND created_at < now() - interval '2 seconds'",
                &[],
            )
            .await?
            .get(0);
        Ok(unsent == 0)
    })
    .await?;
    stop_poller.store(true, Ordering::Relaxed);
    let (by_poller, poller_duplicates) = poller.await??;
    assert!(
        by_poller >= 50,
        "the poller published its backlog: {by_poller}"
    );
    // The relay alone from here.
    ids.extend(insert(&db, 30).await?);
    wait_until("every row marked", &relay, async || {
        let unsent: i64 = db
            .query_one("SELECT count(*) FROM outbox WHERE sent_at IS NULL", &[])
            .await?
            .get(0);
        Ok(unsent == 0)
    })
    .await?;

    let got = wait_for_messages(&js, ids.len(), WAIT, Some(&relay)).await?;
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for m in &got {
        *copies.entry(m.id()).or_default() += 1;
    }
    for id in &ids {
        assert_eq!(copies.get(id.as_str()), Some(&1), "event {id}");
    }
    assert_eq!(got.len(), ids.len(), "nothing else in the stream");
    let log = relay.log();
    assert!(!log.contains("collision"), "{log}");
    // Both did publish some rows: each publish after the first was dropped by its id.
    let relay_duplicates = metric(&addr, "outbox_relay_duplicates_acknowledged_total").await?;
    assert!(
        poller_duplicates as f64 + relay_duplicates > 0.0,
        "the two never published the same row"
    );
    Ok(())
}
