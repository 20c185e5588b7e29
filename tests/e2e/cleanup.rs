//! `[outbox.cleanup]`: rows deleted or marked, partitions dropped, only once the
//! stored checkpoint is past them. The oracle is the database's own record: a trigger notes every
//! row cleanup deletes or updates (an event trigger every table it drops) with the checkpoint the
//! statement saw, and each such row's event must be in the stream with a commit LSN before that
//! checkpoint. Through a broker outage and kill -9 at every step of a round, none is cleaned
//! ahead of it.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(40);

/// Records every row deleted from or updated in `outbox`, and every table dropped, with the
/// stored checkpoint the statement saw.
async fn audit(db: &tokio_postgres::Client) -> Result<()> {
    db.batch_execute(
        "CREATE TABLE cleanup_audit (id text, op text, checkpoint pg_lsn); \
         CREATE FUNCTION audit_cleanup() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             INSERT INTO cleanup_audit VALUES (OLD.id::text, TG_OP, \
                 (SELECT confirmed_lsn FROM outbox_relay.checkpoint WHERE slot_name = 'relay_slot')); \
             RETURN NULL; END $$; \
         CREATE TRIGGER audit_cleanup AFTER DELETE OR UPDATE ON outbox \
             FOR EACH ROW EXECUTE FUNCTION audit_cleanup(); \
         CREATE TABLE drop_audit (name text, checkpoint pg_lsn); \
         CREATE FUNCTION audit_drop() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN \
             INSERT INTO drop_audit SELECT object_identity, \
                 (SELECT confirmed_lsn FROM outbox_relay.checkpoint WHERE slot_name = 'relay_slot') \
             FROM pg_event_trigger_dropped_objects() WHERE object_type = 'table'; END $$; \
         CREATE EVENT TRIGGER audit_drop ON sql_drop EXECUTE FUNCTION audit_drop();",
    )
    .await?;
    Ok(())
}

/// Event id → the lowest `Outbox-Commit-Lsn` the stream holds for it.
async fn commit_lsns(js: &async_nats::jetstream::Context) -> Result<HashMap<String, u64>> {
    let mut out: HashMap<String, u64> = HashMap::new();
    for m in read_stream(js).await? {
        let lsn = parse_lsn(m.header("Outbox-Commit-Lsn")).context("commit LSN header")?;
        out.entry(m.id().to_owned())
            .and_modify(|l| *l = (*l).min(lsn))
            .or_insert(lsn);
    }
    Ok(out)
}

/// The oracle for rows: every row cleanup deleted or updated is in the stream, committed before
/// the checkpoint its statement saw. Returns how many rows were cleaned.
async fn nothing_cleaned_ahead(
    db: &tokio_postgres::Client,
    js: &async_nats::jetstream::Context,
) -> Result<usize> {
    let lsns = commit_lsns(js).await?;
    let rows = db
        .query(
            "SELECT id, op, (checkpoint - '0/0')::bigint FROM cleanup_audit",
            &[],
        )
        .await?;
    for row in &rows {
        let (id, op, checkpoint): (String, String, Option<i64>) =
            (row.get(0), row.get(1), row.get(2));
        let Some(lsn) = lsns.get(&id) else {
            bail!("{op} of row {id}, whose event is not in the stream");
        };
        let checkpoint = checkpoint.with_context(|| format!("{op} of {id} with no checkpoint"))?;
        assert!(
            *lsn < checkpoint as u64,
            "{op} of row {id} (committed at {lsn:#x}) ahead of the checkpoint {checkpoint:#x}"
        );
    }
    Ok(rows.len())
}

/// Inserts `n` events created `age` ago (an interval, e.g. `'2 hours'`) in transactions of 10.
async fn insert_aged(db: &mut tokio_postgres::Client, n: usize, age: &str) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for chunk in 0..n.div_ceil(10) {
        let tx = db.transaction().await?;
        for _ in 0..10.min(n - chunk * 10) {
            let id = uuid::Uuid::new_v4().to_string();
            tx.execute(
                &format!(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
                     VALUES ($1::text::uuid, 'Order', '1', 'Aged', '{{}}', now() - interval '{age}')"
                ),
                &[&id],
            )
            .await?;
            ids.push(id);
        }
        tx.commit().await?;
    }
    Ok(ids)
}

/// Inserts one event created an hour after `day` (a timestamptz expression); returns its id.
async fn insert_dated(db: &impl tokio_postgres::GenericClient, day: &str) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    db.execute(
        &format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
             VALUES ($1::text::uuid, 'Order', '1', 'Dated', '{{}}', {day} + interval '1 hour')"
        ),
        &[&id],
    )
    .await?;
    Ok(id)
}

/// Waits until the first cleanup round established the table's fence: rows committed before it
/// are never cleaned.
async fn wait_for_fence(db: &tokio_postgres::Client, relay: &Relay) -> Result<()> {
    wait_until("the cleanup fence", relay, async || {
        Ok(db
            .query_opt(
                "SELECT 1 FROM outbox_relay.cleanup_fence WHERE table_name = 'public.outbox'",
                &[],
            )
            .await?
            .is_some())
    })
    .await
}

async fn count_of(db: &tokio_postgres::Client, ids: &[String]) -> Result<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM outbox WHERE id::text = ANY($1)",
            &[&ids],
        )
        .await?
        .get(0))
}

fn cleanup_config(env: &Env, cleanup: &str, extra: &str) -> std::path::PathBuf {
    env.config(&format!(
        "{extra}\n[[outbox]]\ntable = \"public.outbox\"\n[outbox.cleanup]\n{cleanup}\n"
    ))
}

/// `mode = "delete"` with `retain = "1h"`: rows older than that are deleted once the checkpoint
/// is past them, younger ones stay; while NATS is paused (a broker outage) the rows written
/// meanwhile stay however many rounds run, and go once the relay confirmed them. Metrics count
/// the rows cleaned and describe the table.
#[tokio::test(flavor = "multi_thread")]
async fn delete_cleans_only_rows_behind_the_checkpoint_through_a_broker_outage() -> Result<()> {
    let env = Env::start().await?;
    let mut db = env.db().await?;
    let js = env.jetstream().await?;
    audit(&db).await?;
    let (http, addr) = http_listen();
    let config = cleanup_config(
        &env,
        "mode = \"delete\"\nretain = \"1h\"\ninterval = \"200ms\"\nbatch_size = 40\nbatch_pause = \"10ms\"",
        &format!("{http}sample_interval = \"200ms\""),
    );
    // Rows from before the slot: never published by the relay, so never cleaned.
    let before = insert_aged(&mut db, 10, "2 hours").await?;
    let relay = Relay::start_streaming(&config).await?;
    wait_for_fence(&db, &relay).await?;
    let old = insert_aged(&mut db, 200, "2 hours").await?;
    let mut young = Vec::new();
    for _ in 0..5 {
        young.push(insert_event(&db, "Order", "Young", "{}").await?);
    }
    wait_for_messages(&js, 205, WAIT, Some(&relay)).await?;
    wait_until("the old rows' deletion", &relay, async || {
        Ok(count_of(&db, &old).await? == 0)
    })
    .await?;
    assert_eq!(
        count_of(&db, &young).await?,
        5,
        "rows younger than retain stay"
    );
    // The counter moves after the DELETE committed, which the loop above saw: wait for it.
    let cleaned = wait_metric(
        &addr,
        "outbox_relay_cleanup_rows_total{table=\"public.outbox\"}",
        WAIT,
        |n| n >= 200.0,
    )
    .await;
    assert_eq!(cleaned, Some(200.0));

    // A broker outage: the relay cannot confirm what it reads, so nothing of it is deleted.
    env.nats.pause()?;
    let during = insert_aged(&mut db, 50, "3 hours").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        count_of(&db, &during).await?,
        50,
        "deleted while NATS was down"
    );
    let waiting = metric(
        &addr,
        "outbox_relay_cleanup_waiting{table=\"public.outbox\"}",
    )
    .await?;
    assert!(waiting > 0.0, "the batch waits for the checkpoint");
    env.nats.resume()?;
    wait_for_messages(&js, 255, WAIT, Some(&relay)).await?;
    wait_until("the outage rows' deletion", &relay, async || {
        Ok(count_of(&db, &during).await? == 0)
    })
    .await?;
    assert_eq!(nothing_cleaned_ahead(&db, &js).await?, 250);
    assert_eq!(count_of(&db, &young).await?, 5);
    assert_eq!(
        count_of(&db, &before).await?,
        10,
        "rows from before the slot stay"
    );

    // The table as /metrics describes it.
    let metrics = scrape(&addr).await?;
    let size = metrics["outbox_relay_table_size_bytes{table=\"public.outbox\"}"];
    assert!(size > 0.0, "{metrics:?}");
    assert!(metrics.contains_key("outbox_relay_table_rows_estimate{table=\"public.outbox\"}"));
    let age = metrics["outbox_relay_table_oldest_unconfirmed_age_seconds{table=\"public.outbox\"}"];
    assert!(age < 60.0, "every row is confirmed: {age}");

    // `status` says the same, with what the running relay cleaned.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&config)
        .args(["status", "--json"])
        .env("RUST_LOG", "warn")
        .output()?;
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let table = &doc["tables"]["public.outbox"];
    assert!(
        table["size_bytes"].as_i64().is_some_and(|b| b > 0),
        "{table}"
    );
    assert!(table["rows_estimate"].is_number(), "{table}");
    assert_eq!(table["oldest_unconfirmed_measured_by"], "relay", "{table}");
    assert_eq!(table["cleanup"]["mode"], "delete");
    assert_eq!(table["cleanup"]["running"]["rows_cleaned"], 250, "{table}");
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&config)
        .arg("status")
        .env("RUST_LOG", "warn")
        .output()?;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("table public.outbox: about")
            && text.contains("cleanup delete (retain 3600s): 250 rows cleaned"),
        "{text}"
    );
    Ok(())
}

/// kill -9 of the relay at every step of a cleanup round (after a batch was selected; after the
/// checkpoint was seen past it, before the delete) and at random moments, some during a broker
/// outage, under a steady load: every event is delivered, every row goes in the end, and none
/// went before the checkpoint was past it.
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_every_step_cleans_nothing_ahead_of_the_checkpoint() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    audit(&db).await?;
    let config = cleanup_config(
        &env,
        "mode = \"delete\"\nretain = \"0s\"\ninterval = \"100ms\"\nbatch_size = 20\nbatch_pause = \"0s\"",
        "",
    );

    // The slot first: rows committed before it exists are not the relay's to publish (they
    // are `backfill`'s), though they are behind every checkpoint.
    let setup = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&config)
        .args(["setup", "--create-stream"])
        .output()?;
    assert!(setup.status.success(), "{setup:?}");
    let relay = Relay::start_streaming(&config).await?;
    wait_for_fence(&db, &relay).await?;
    drop(relay);

    let done = Arc::new(AtomicBool::new(false));
    let load = {
        let (done, url) = (done.clone(), env.pg.url(DB));
        tokio::spawn(async move {
            let (mut client, connection) =
                tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let mut ids = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let tx = client.transaction().await?;
                let mut batch = Vec::new();
                for _ in 0..3 {
                    batch.push(insert_event(&tx, "Load", "Written", "{}").await?);
                }
                tx.commit().await?;
                ids.extend(batch);
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            anyhow::Ok(ids)
        })
    };

    let mut logs = Vec::new();
    for point in ["cleanup_selected", "cleanup_confirmed"] {
        let file = env.dir.path().join(point);
        let mut relay = Relay::start_with_env(
            &config,
            &["run"],
            &[("RELAY_PAUSE", &format!("{point}:{}", file.display()))],
        )?;
        relay.wait_log(&format!("paused at {point}"), WAIT).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        relay.kill9();
    }
    for round in 0..8u64 {
        let mut relay = Relay::start(&config)?;
        relay.wait_log("replication started", WAIT).await?;
        let outage = round % 3 == 1;
        if outage {
            env.nats.pause()?;
        }
        tokio::time::sleep(Duration::from_millis(300 + (round * 373) % 1200)).await;
        relay.kill9();
        logs.push(relay.log());
        if outage {
            env.nats.resume()?;
        }
    }
    done.store(true, Ordering::Relaxed);
    let ids = load.await??;
    assert!(ids.len() > 300, "{} events", ids.len());

    let relay = Relay::start(&config)?;
    let wanted: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let delivered = wait_until("every event delivered", &relay, async || {
        let got = read_stream(&js).await?;
        let seen: BTreeSet<&str> = got.iter().map(Received::id).collect();
        Ok(wanted.iter().all(|id| seen.contains(id)))
    })
    .await;
    if let Err(e) = delivered {
        let got = read_stream(&js).await?;
        let seen: BTreeSet<&str> = got.iter().map(Received::id).collect();
        let missing: Vec<String> = wanted
            .iter()
            .filter(|id| !seen.contains(*id))
            .map(|id| (*id).to_owned())
            .collect();
        let in_table = count_of(&db, &missing).await?;
        let audited: i64 = db
            .query_one(
                "SELECT count(*) FROM cleanup_audit WHERE id = ANY($1)",
                &[&missing],
            )
            .await?
            .get(0);
        let dump = std::env::temp_dir().join("cleanup-kill9-logs.txt");
        std::fs::write(
            &dump,
            format!("{}\n=== final\n{}", logs.join("\n=== next\n"), relay.log()),
        )?;
        bail!(
            "logs in {dump:?}; {} of {} events missing ({} still in the table, {} deleted by cleanup; stream holds {}): {:?}\n{e}",
            missing.len(),
            wanted.len(),
            in_table,
            audited,
            got.len(),
            &missing[..missing.len().min(5)]
        );
    }
    wait_until("every row cleaned", &relay, async || {
        Ok(count_of(&db, &ids).await? == 0)
    })
    .await?;
    let cleaned = nothing_cleaned_ahead(&db, &js).await?;
    assert_eq!(cleaned, ids.len(), "each row deleted once");
    Ok(())
}

/// `mode = "mark"` (a team coming from a polling publisher): `status` and `sent_at` are set once
/// the checkpoint is past the row, never while the broker is down; marked rows stay.
#[tokio::test(flavor = "multi_thread")]
async fn mark_sets_the_status_once_confirmed() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let mut writer = env.db().await?;
    let js = env.jetstream().await?;
    db.batch_execute(
        "ALTER TABLE outbox ADD COLUMN status text NOT NULL DEFAULT 'new', ADD COLUMN sent_at timestamptz",
    )
    .await?;
    audit(&db).await?;
    let config = cleanup_config(
        &env,
        "mode = \"mark\"\nstatus_column = \"status\"\nstatus_value = \"sent\"\nsent_at_column = \"sent_at\"\ninterval = \"200ms\"",
        "",
    );
    let relay = Relay::start_streaming(&config).await?;
    wait_for_fence(&db, &relay).await?;
    let first = insert_aged(&mut writer, 20, "1 minute").await?;
    wait_for_messages(&js, 20, WAIT, Some(&relay)).await?;
    let marked = async |ids: &[String]| -> Result<i64> {
        Ok(db
            .query_one(
                "SELECT count(*) FROM outbox WHERE id::text = ANY($1) AND status = 'sent' AND sent_at IS NOT NULL",
                &[&ids],
            )
            .await?
            .get(0))
    };
    wait_until("the first rows marked", &relay, async || {
        Ok(marked(&first).await? == 20)
    })
    .await?;

    env.nats.pause()?;
    let during = insert_aged(&mut writer, 20, "1 minute").await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(marked(&during).await?, 0, "marked while NATS was down");
    env.nats.resume()?;
    wait_until("the outage rows marked", &relay, async || {
        Ok(marked(&during).await? == 20)
    })
    .await?;
    assert_eq!(
        nothing_cleaned_ahead(&db, &js).await?,
        40,
        "each row marked once"
    );
    assert_eq!(
        count_of(&db, &first).await? + count_of(&db, &during).await?,
        40
    );
    Ok(())
}

/// `mode = "mark"` with `delete_after` (what a polling relay's cleanup job did after marking):
/// rows are marked once confirmed and deleted once also older than `delete_after`; rows written
/// during a broker outage are neither marked nor deleted until the relay confirmed them, and
/// younger marked rows stay.
#[tokio::test(flavor = "multi_thread")]
async fn mark_then_delete_after_touches_only_confirmed_rows() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let mut writer = env.db().await?;
    let js = env.jetstream().await?;
    db.batch_execute("ALTER TABLE outbox ADD COLUMN sent_at timestamptz")
        .await?;
    audit(&db).await?;
    let config = cleanup_config(
        &env,
        "mode = \"mark\"\nsent_at_column = \"sent_at\"\ndelete_after = \"1h\"\ninterval = \"200ms\"",
        "",
    );
    let relay = Relay::start_streaming(&config).await?;
    wait_for_fence(&db, &relay).await?;
    let old = insert_aged(&mut writer, 20, "2 hours").await?;
    let young = insert_aged(&mut writer, 20, "1 minute").await?;
    wait_for_messages(&js, 40, WAIT, Some(&relay)).await?;
    let marked = async |ids: &[String]| -> Result<i64> {
        Ok(db
            .query_one(
                "SELECT count(*) FROM outbox WHERE id::text = ANY($1) AND sent_at IS NOT NULL",
                &[&ids],
            )
            .await?
            .get(0))
    };
    wait_until(
        "the old rows deleted, the young marked",
        &relay,
        async || Ok(count_of(&db, &old).await? == 0 && marked(&young).await? == 20),
    )
    .await?;

    env.nats.pause()?;
    let during = insert_aged(&mut writer, 20, "2 hours").await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        (count_of(&db, &during).await?, marked(&during).await?),
        (20, 0),
        "rows written while NATS was down were touched before the relay confirmed them"
    );
    env.nats.resume()?;
    wait_until("the outage rows deleted", &relay, async || {
        Ok(count_of(&db, &during).await? == 0)
    })
    .await?;
    let ops: Vec<(String, i64)> = db
        .query(
            "SELECT op, count(*) FROM cleanup_audit GROUP BY op ORDER BY op",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // The old rows may be deleted before a round marked them: either way each is deleted once
    // and every row is marked at most once.
    let deletes = ops.iter().find(|(op, _)| op == "DELETE").map_or(0, |o| o.1);
    let updates = ops.iter().find(|(op, _)| op == "UPDATE").map_or(0, |o| o.1);
    assert_eq!(deletes, 40, "{ops:?}");
    assert!((20..=60).contains(&updates), "{ops:?}");
    assert_eq!(
        nothing_cleaned_ahead(&db, &js).await?,
        (deletes + updates) as usize
    );
    assert_eq!(count_of(&db, &young).await?, 20, "young rows are kept");
    Ok(())
}

mod access;
mod partitions;
