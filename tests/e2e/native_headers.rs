//! Broker-native headers from outbox columns: `ttl_column` → `Nats-TTL`
//! (nats-server 2.11+, `allow_msg_ttl`), `schedule_column` → `Nats-Schedule: @at …`
//! (2.12+, `allow_msg_schedules`), and CloudEvents binary-mode headers. A mapping the server or
//! the stream cannot honour is refused at start and by `validate --connect`; a bad value is a
//! bad row (fail closed, nothing past it confirmed).

use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, stream};

use crate::support::*;
use humantime_serde::re::humantime;

const WAIT: Duration = Duration::from_secs(30);
const SCHEDULES: &str = "outbox_schedules";

fn server(env: &Env) -> (u64, u64, u64) {
    let version = env.nats.version();
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// The default outbox plus a TTL and a delivery-time column.
async fn add_columns(env: &Env) -> Result<()> {
    env.db()
        .await?
        .batch_execute(
            "ALTER TABLE outbox ADD COLUMN ttl interval, ADD COLUMN deliver_at timestamptz",
        )
        .await?;
    Ok(())
}

/// The stream, made by the test (as production streams are), with or without the settings.
async fn create_stream(js: &jetstream::Context, ttl: bool, schedules: bool) -> Result<()> {
    js.create_stream(stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into(), format!("{SCHEDULES}.>")],
        storage: stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        allow_message_ttl: ttl,
        allow_message_schedules: schedules,
        ..Default::default()
    })
    .await?;
    Ok(())
}

async fn edit_stream(js: &jetstream::Context, ttl: bool, schedules: bool) -> Result<()> {
    let mut config = js.get_stream(STREAM).await?.info().await?.config.clone();
    config.allow_message_ttl = ttl;
    config.allow_message_schedules = schedules;
    js.update_stream(config).await?;
    Ok(())
}

/// `validate --connect`'s output.
async fn validate(config: &std::path::Path) -> Result<String> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(config)
        .args(["validate", "--connect"])
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Inserts an event with `ttl` and `deliver_at` (SQL expressions); returns its id.
async fn insert_native(db: &tokio_postgres::Client, ttl: &str, deliver_at: &str) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    db.execute(
        &format!(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ttl, deliver_at) \
             VALUES ($1::text::uuid, 'Order', '7', 'Created', '{{\"n\": 1}}', {ttl}, {deliver_at})"
        ),
        &[&id],
    )
    .await?;
    Ok(id)
}

/// Waits until the slot and the stored checkpoint are at or past `lsn`.
async fn wait_confirmed(env: &Env, lsn: u64, relay: &Relay) -> Result<()> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let slot = env.slot_confirmed().await?.unwrap_or(0);
        let stored = env.checkpoint().await?.unwrap_or(0);
        if slot >= lsn && stored >= lsn {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "slot {slot:X} / checkpoint {stored:X} not past {lsn:X}; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const TTL_MAPPING: &str = "[[outbox]]\ntable = \"public.outbox\"\nttl_column = \"ttl\"\n";

/// `ttl_column` on nats-server 2.9 is refused (the server would store `Nats-TTL` and never
/// expire the message); on 2.11+ a stream without `allow_msg_ttl` is refused with the edit that
/// fixes it; with it, `Nats-TTL` is the column's seconds (NULL: none), JetStream removes the
/// message when it expires, and the positions pass the events.
#[tokio::test(flavor = "multi_thread")]
async fn ttl_column_is_refused_where_it_cannot_work_and_expires_messages_where_it_can() -> Result<()>
{
    let env = Env::start().await?;
    add_columns(&env).await?;
    let js = env.jetstream().await?;
    create_stream(&js, false, false).await?;
    let config = env.config_full("", TTL_MAPPING);

    let checked = validate(&config).await?;
    let mut relay = Relay::start(&config)?;
    if server(&env) < (2, 11, 0) {
        let needles = [
            "ttl_column `ttl` (Nats-TTL) needs nats-server 2.11 or later",
            "upgrade nats-server, or remove ttl_column",
        ];
        expect_exit(&mut relay, 78, WAIT, &needles).await?;
        for needle in needles {
            assert!(checked.contains(needle), "{checked}");
        }
        println!("nats-server {}: ttl_column refused", env.nats.version());
        return Ok(());
    }
    let needles = [
        "ttl_column `ttl` (Nats-TTL) needs stream `OUTBOX` to have allow_msg_ttl",
        "nats stream edit OUTBOX --allow-msg-ttl",
    ];
    expect_exit(&mut relay, 78, WAIT, &needles).await?;
    assert!(checked.contains(needles[1]), "{checked}");
    assert_eq!(stream_count(&js).await?, 0);

    edit_stream(&js, true, false).await?;
    assert!(
        validate(&config).await?.contains("native headers"),
        "validate reports the check"
    );
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let short = insert_native(&db, "interval '2 seconds'", "NULL").await?;
    let none = insert_native(&db, "NULL", "NULL").await?;
    let long = insert_native(&db, "interval '1 day 00:00:00.5'", "NULL").await?;
    let after = env.current_wal().await?;
    let got = wait_for_messages(&js, 3, WAIT, Some(&relay)).await?;
    let ids: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(ids, [short.as_str(), none.as_str(), long.as_str()]);
    assert_eq!(got[0].header("Nats-TTL"), "2");
    assert!(!got[1].headers.contains_key("Nats-TTL"), "{:?}", got[1]);
    assert_eq!(got[2].header("Nats-TTL"), "86401", "part seconds round up");
    wait_confirmed(&env, after, &relay).await?;

    // JetStream honours it: the 2 s message goes, the others stay.
    let handle = js.get_stream(STREAM).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while handle.get_raw_message(got[0].seq).await.is_ok() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the 2 s message is still stored after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for kept in &got[1..] {
        handle
            .get_raw_message(kept.seq)
            .await
            .with_context(|| format!("{} expired too", kept.id()))?;
    }
    Ok(())
}

/// `schedule_column` needs nats-server 2.12 and `allow_msg_schedules`; with both, the event is
/// held on `<schedule_subject>.<id>` and JetStream delivers it to its subject at the row's
/// time, with `Outbox-Event-Id` (the delivered copy has no `Nats-Msg-Id`) and the row's TTL as
/// the copy's `Nats-TTL`; a NULL time publishes at once.
#[tokio::test(flavor = "multi_thread")]
async fn schedule_column_delays_delivery_or_is_refused() -> Result<()> {
    let env = Env::start().await?;
    add_columns(&env).await?;
    let js = env.jetstream().await?;
    let version = server(&env);
    create_stream(&js, version >= (2, 11, 0), false).await?;
    let config = env.config_full(
        "",
        &format!(
            "{TTL_MAPPING}schedule_column = \"deliver_at\"\nschedule_subject = \"{SCHEDULES}\"\n"
        ),
    );
    let checked = validate(&config).await?;
    let mut relay = Relay::start(&config)?;
    if version < (2, 12, 0) {
        // The first need the server cannot honour is named (TTL before 2.11).
        let needle = if version < (2, 11, 0) {
            "ttl_column `ttl` (Nats-TTL) needs nats-server 2.11"
        } else {
            "schedule_column `deliver_at` (Nats-Schedule) needs nats-server 2.12"
        };
        expect_exit(&mut relay, 78, WAIT, &[needle]).await?;
        assert!(checked.contains(needle), "{checked}");
        println!(
            "nats-server {}: schedule_column refused",
            env.nats.version()
        );
        return Ok(());
    }
    let needles = [
        "schedule_column `deliver_at` (Nats-Schedule) needs stream `OUTBOX` to have allow_msg_schedules",
        "nats stream edit OUTBOX --allow-schedules",
    ];
    expect_exit(&mut relay, 78, WAIT, &needles).await?;
    assert!(checked.contains(needles[1]), "{checked}");

    edit_stream(&js, true, true).await?;
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let later = insert_native(
        &db,
        "interval '1 hour'",
        "date_trunc('second', now()) + interval '3 seconds'",
    )
    .await?;
    let due: SystemTime = db
        .query_one(
            "SELECT deliver_at FROM outbox WHERE id = $1::text::uuid",
            &[&later],
        )
        .await?
        .get(0);
    let now = insert_native(&db, "NULL", "NULL").await?;
    let after = env.current_wal().await?;
    let got = wait_for_messages(&js, 2, WAIT, Some(&relay)).await?;
    let schedule = &got[0];
    assert_eq!(schedule.subject, format!("{SCHEDULES}.{later}"));
    assert_eq!(schedule.id(), later);
    let at = humantime::format_rfc3339_seconds(due).to_string();
    assert_eq!(schedule.header("Nats-Schedule"), format!("@at {at}"));
    assert_eq!(
        schedule.header("Nats-Schedule-Target"),
        "outbox.Order.Created"
    );
    assert_eq!(schedule.header("Nats-Schedule-TTL"), "3600");
    assert_eq!(schedule.header("Outbox-Event-Id"), later);
    assert_eq!(
        (got[1].subject.as_str(), got[1].id()),
        ("outbox.Order.Created", now.as_str())
    );
    assert!(!got[1].headers.contains_key("Nats-Schedule"));
    wait_confirmed(&env, after, &relay).await?;

    // Delivered at the row's time, to the event's subject.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let delivered = loop {
        let all = read_stream(&js).await?;
        if let Some(m) = all
            .iter()
            .find(|m| m.subject == "outbox.Order.Created" && m.header("Outbox-Event-Id") == later)
        {
            break m.clone();
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "scheduled event not delivered within 30 s: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        !delivered.headers.contains_key("Nats-Msg-Id"),
        "{delivered:?}"
    );
    assert_eq!(delivered.header("Nats-TTL"), "3600");
    assert_eq!(
        delivered.header("Outbox-Commit-Lsn"),
        schedule.header("Outbox-Commit-Lsn")
    );
    assert_eq!(delivered.payload, schedule.payload);
    let stored = js
        .get_stream(STREAM)
        .await?
        .get_raw_message(delivered.seq)
        .await?;
    let due_nanos = due.duration_since(SystemTime::UNIX_EPOCH)?.as_nanos() as i128;
    assert!(
        stored.time.unix_timestamp_nanos() >= due_nanos,
        "delivered at {} before {at}",
        stored.time
    );
    // The consumer library reads the delivered copy's id.
    let event = outbox_consumer::Event::from_parts(
        &delivered.subject,
        Some(&header_map(&delivered)),
        delivered.payload.clone().into(),
        delivered.seq,
        1,
    )?;
    assert_eq!(event.id, later);
    Ok(())
}

fn header_map(m: &Received) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    for (k, v) in &m.headers {
        headers.insert(k.as_str(), v.as_str());
    }
    headers
}

/// CloudEvents binary mode: exactly `ce-specversion`, `ce-id`, `ce-source`, `ce-type`,
/// `ce-time` (the commit time) and `ce-subject`, on any server. A `time_column` value that is
/// no RFC 3339 time is a bad row: exit 65 naming column and header, nothing past it confirmed.
#[tokio::test(flavor = "multi_thread")]
async fn cloudevents_headers_are_exact_and_a_bad_time_is_a_bad_row() -> Result<()> {
    let env = Env::start().await?;
    let js = env.jetstream().await?;
    let mapping = "[[outbox]]\ntable = \"public.outbox\"\n[outbox.cloudevents]\nsource = \"/orders\"\nsubject_column = \"aggregateid\"\n";
    let relay = Relay::start_streaming(&env.config(mapping)).await?;
    let mut db = env.db().await?;
    let id = insert_event(&db, "Order", "Created", "{}").await?;
    let got = wait_for_messages(&js, 1, WAIT, Some(&relay)).await?;
    let ce: Vec<(&str, &str)> = got[0]
        .headers
        .iter()
        .filter(|(k, _)| k.starts_with("ce-"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let commit_time = got[0].header("Outbox-Commit-Time");
    assert!(
        humantime::parse_rfc3339(commit_time).is_ok(),
        "{commit_time}"
    );
    assert_eq!(
        ce,
        [
            ("ce-id", id.as_str()),
            ("ce-source", "/orders"),
            ("ce-specversion", "1.0"),
            ("ce-subject", "1"),
            ("ce-time", commit_time),
            ("ce-type", "Created"),
        ]
    );
    drop(relay);

    let timed = env.config(&format!("{mapping}time_column = \"created_at\"\n"));
    let mut relay = Relay::start_streaming(&timed).await?;
    db.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
         VALUES (gen_random_uuid(), 'Order', '1', 'Paid', '{}', '2026-01-02 04:04:05.000006+01')",
        &[],
    )
    .await?;
    let got = wait_for_messages(&js, 2, WAIT, Some(&relay)).await?;
    assert_eq!(got[1].header("ce-time"), "2026-01-02T03:04:05.000006Z");
    let tx = db.transaction().await?;
    tx.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) \
         VALUES ('00000000-0000-4000-8000-00000000bad1', 'Order', '1', 'Bad', '{}', 'infinity')",
        &[],
    )
    .await?;
    tx.commit().await?;
    let log = expect_exit(
        &mut relay,
        65,
        WAIT,
        &[
            "00000000-0000-4000-8000-00000000bad1",
            "column `created_at` cannot be header `ce-time`",
            "infinity",
        ],
    )
    .await?;
    assert_not_confirmed_past(&env, &log, "00000000-0000-4000-8000-00000000bad1").await?;
    assert_eq!(
        stream_count(&js).await?,
        2,
        "nothing published for the bad row"
    );
    Ok(())
}

/// `[otlp]`: an event whose row has a sampled `traceparent` gets one span, a child of that
/// context, from its commit to its ack, with the event id, subject and stream sequence; events
/// without one, or with an unsampled one, get none. The last spans are flushed at shutdown.
#[tokio::test(flavor = "multi_thread")]
async fn otlp_spans_are_children_of_the_rows_traceparent() -> Result<()> {
    let env = Env::start().await?;
    let receiver = relay_testkit::OtlpReceiver::start().await?;
    let config = env.config(&format!(
        "\n[otlp]\nendpoint = \"{}\"\nservice_name = \"relay-test\"\n",
        receiver.url()
    ));
    let mut relay = Relay::start_streaming(&config).await?;
    let js = env.jetstream().await?;
    let db = env.db().await?;
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let insert = "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tracingspancontext) \
                  VALUES ($1::text::uuid, 'Order', '7', 'Traced', '{}', $2)";
    let traced = uuid::Uuid::new_v4().to_string();
    db.execute(insert, &[&traced, &format!("00-{trace}-{parent}-01")])
        .await?;
    let unsampled = uuid::Uuid::new_v4().to_string();
    db.execute(insert, &[&unsampled, &format!("00-{trace}-{parent}-00")])
        .await?;
    insert_event(&db, "Order", "Untraced", "{}").await?;
    let got = wait_for_messages(&js, 3, WAIT, Some(&relay)).await?;
    assert_eq!(got[0].id(), traced);
    relay.signal(nix::sys::signal::Signal::SIGTERM);
    let status = relay.wait_exit(WAIT).await?;
    assert_eq!(status.code(), Some(0), "{}", relay.log());

    let spans = receiver.wait_for(1, WAIT).await?;
    assert_eq!(
        spans.len(),
        1,
        "one span, for the sampled event only: {spans:?}"
    );
    let span = &spans[0];
    assert_eq!(span.name, "outbox-relay publish");
    assert_eq!(span.service, "relay-test");
    assert_eq!(
        (span.trace_id.as_str(), span.parent_span_id.as_str()),
        (trace, parent)
    );
    assert_ne!(span.span_id, parent);
    assert_eq!(
        span.attribute("messaging.message.id"),
        Some(traced.as_str())
    );
    assert_eq!(
        span.attribute("messaging.destination.name"),
        Some("outbox.Order.Traced")
    );
    assert_eq!(span.attribute("nats.stream"), Some(STREAM));
    let seq = got[0].seq.to_string();
    assert_eq!(span.attribute("nats.stream.sequence"), Some(seq.as_str()));
    assert_eq!(
        span.attribute("outbox.commit_lsn"),
        Some(got[0].header("Outbox-Commit-Lsn"))
    );
    assert_eq!(span.events, ["published"]);
    let commit = humantime::parse_rfc3339(got[0].header("Outbox-Commit-Time"))?
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_nanos() as u64;
    assert_eq!(
        span.start_unix_nanos, commit,
        "the span starts at the commit"
    );
    assert!(span.end_unix_nanos >= span.start_unix_nanos);
    Ok(())
}
