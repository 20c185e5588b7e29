//! A fleet's console in a real browser against a real relay process, PostgreSQL and
//! nats-server: two pipelines (two outbox tables, slots, publications and streams in one
//! database); the fleet page shows each streaming with its events, leads to each pipeline's
//! console, whose pages read that pipeline under its base path; one pipeline stopped on a row
//! it cannot route is shown stopped with the reason `/status` gives while the other streams
//! on. Screenshots: `target/test-artifacts/console/fleet*.png`.

use anyhow::{Context as _, Result, ensure};

use super::{artifacts, chromium, status, webdriver};
use crate::support::*;

/// The shared file's end: the console, and two pipelines over the shared `[postgres]` and
/// `[nats]` servers, each with its table, slot, publication and stream (subjects apart: two
/// streams cannot capture one subject).
fn pipelines(addr: &str) -> String {
    format!(
        r#"
[http]
listen = "{addr}"
console = true
sample_interval = "1s"

[[pipeline]]
name = "orders"
[pipeline.postgres]
slot = "orders_slot"
publication = "orders_pub"
[pipeline.nats]
stream = "ORDERS"
stream_subjects = ["orders.>"]
[[pipeline.outbox]]
table = "public.outbox"
subject = "orders.{{aggregatetype}}.{{type}}"

[[pipeline]]
name = "billing"
[pipeline.postgres]
slot = "billing_slot"
publication = "billing_pub"
[pipeline.nats]
stream = "BILLING"
stream_subjects = ["billing.>"]
[[pipeline.outbox]]
table = "public.outbox2"
subject = "billing.{{aggregatetype}}.{{type}}"
"#
    )
}

/// Inserts an outbox row into `table` (`type` empty: a row no subject can be made of);
/// returns its id.
async fn insert_row(
    db: &tokio_postgres::Client,
    table: &str,
    kind: &str,
    payload: &str,
) -> Result<String> {
    let id = uuid::Uuid::new_v4().to_string();
    db.execute(
        &format!(
            "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, 'Doc', '1', $2, $3::text::jsonb)"
        ),
        &[&id, &kind, &payload],
    )
    .await?;
    Ok(id)
}

/// Messages in `stream` now (0 while it does not exist).
async fn messages_in(js: &async_nats::jetstream::Context, stream: &str) -> Result<u64> {
    Ok(match js.get_stream(stream).await {
        Ok(mut s) => s.info().await?.state.messages,
        Err(_) => 0,
    })
}

/// Pipeline `name`'s entry in the fleet's `/status`.
fn entry<'a>(fleet: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    fleet["pipelines"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
}

/// A script answering whether the fleet page's row of `pipeline` shows `state` and `events`.
fn row_shows(pipeline: &str, state: &str, events: u64) -> String {
    format!(
        "const row = document.querySelector('tr[data-pipeline=\"{pipeline}\"]'); \
         return row !== null && row.querySelector('.state').textContent === '{state}' \
         && row.querySelector('td.events').textContent === '{events}'"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_page_shows_each_pipeline_and_one_that_stopped_in_a_real_browser() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute("CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)")
        .await?;
    let addr = format!("127.0.0.1:{}", relay_testkit::free_port());
    let config = env.config(&pipelines(&addr));
    let relay = Relay::start(&config)?;
    wait_until("both pipelines streaming", &relay, async || {
        let Ok(fleet) = status(&addr).await else {
            return Ok(false);
        };
        Ok(["orders", "billing"].iter().all(|name| {
            entry(&fleet, name).is_some_and(|p| p["relay"]["postgres"]["streaming"] == true)
        }))
    })
    .await?;
    let mut orders = Vec::new();
    for n in 0..3 {
        orders.push(insert_row(&db, "outbox", "created", &format!(r#"{{"n": {n}}}"#)).await?);
    }
    let mut billing = Vec::new();
    for n in 0..2 {
        billing.push(insert_row(&db, "outbox2", "billed", &format!(r#"{{"n": {n}}}"#)).await?);
    }
    let js = env.jetstream().await?;
    wait_until("3 events in ORDERS and 2 in BILLING", &relay, async || {
        Ok(messages_in(&js, "ORDERS").await? == 3 && messages_in(&js, "BILLING").await? == 2)
    })
    .await?;

    // The fleet page: both pipelines streaming, each with its events.
    let browser = webdriver::Browser::start(&chromium()?).await?;
    browser
        .open_view(&format!("http://{addr}/console"), "fleet")
        .await?;
    browser
        .wait_for(
            "orders streaming with 3 events",
            &row_shows("orders", "streaming", 3),
        )
        .await?;
    browser
        .wait_for(
            "billing streaming with 2 events",
            &row_shows("billing", "streaming", 2),
        )
        .await?;
    ensure!(
        browser.text("#fleet-state").await? == "2 of 2 ready",
        "fleet badge: {}",
        browser.text("#fleet-state").await?
    );
    browser.screenshot(&artifacts()?.join("fleet.png")).await?;

    // A pipeline's own console, under its name.
    browser
        .click("tr[data-pipeline=\"orders\"] a.pipeline-link")
        .await?;
    browser
        .wait_for(
            "the orders overview",
            "return location.pathname === '/console/p/orders/' && document.body.dataset.view === 'overview' && document.body.dataset.loaded === 'true'",
        )
        .await?;
    ensure!(browser.text("#slot").await? == "orders_slot");
    ensure!(browser.text("#events-published").await? == "3");
    ensure!(browser.text("#pipeline-name").await? == "orders");
    browser
        .wait_for(
            "the badge says ready",
            "return document.getElementById('relay-state').className === 'badge ok'",
        )
        .await?;
    browser
        .screenshot(&artifacts()?.join("fleet-orders-overview.png"))
        .await?;
    let base = format!("http://{addr}/console/p/orders/");
    browser.open(&format!("{base}#events")).await?;
    let listed = browser.text("#events").await?;
    for id in &orders {
        ensure!(
            listed.contains(id.as_str()),
            "orders event {id} listed: {listed}"
        );
    }
    for id in &billing {
        ensure!(
            !listed.contains(id.as_str()),
            "billing's {id} not listed: {listed}"
        );
    }
    browser
        .screenshot(&artifacts()?.join("fleet-orders-events.png"))
        .await?;
    browser.open(&format!("{base}#event/1")).await?;
    let payload = browser.text("#payload").await?;
    ensure!(
        payload.replace(' ', "") == r#"{"n":0}"#,
        "payload: {payload}"
    );
    browser.open(&format!("{base}#trace/{}", orders[2])).await?;
    let traced = browser.text("#view").await?;
    ensure!(traced.contains("Published: published"), "{traced}");

    // Billing meets a row it cannot route, without a dead-letter subject: it stops, orders
    // goes on.
    insert_row(&db, "outbox2", "", r#"{"bad": true}"#).await?;
    let mut reason = String::new();
    wait_until("billing stopped", &relay, async || {
        let fleet = status(&addr).await?;
        let stopped = entry(&fleet, "billing")
            .filter(|p| p["state"] == "stopped")
            .and_then(|p| p["reason"].as_str());
        if let Some(why) = stopped {
            reason = why.to_owned();
        }
        Ok(stopped.is_some())
    })
    .await?;
    let last = insert_row(&db, "outbox", "created", r#"{"n": "last"}"#).await?;
    wait_until("the last orders event in ORDERS", &relay, async || {
        Ok(messages_in(&js, "ORDERS").await? == 4)
    })
    .await?;
    browser
        .open_view(&format!("http://{addr}/console"), "fleet")
        .await?;
    browser
        .wait_for("billing stopped", &row_shows("billing", "stopped", 2))
        .await?;
    browser
        .wait_for(
            "orders streaming with 4 events",
            &row_shows("orders", "streaming", 4),
        )
        .await?;
    let shown = browser
        .run("return document.querySelector('tr[data-pipeline=\"billing\"] .reason').textContent")
        .await?;
    ensure!(
        shown.as_str() == Some(reason.as_str()),
        "billing's reason shown {shown} is /status's: {reason}"
    );
    ensure!(
        browser.text("#fleet-state").await? == "1 of 2 ready",
        "fleet badge: {}",
        browser.text("#fleet-state").await?
    );
    // Rate and latency from each pipeline's first 10 s sample, which saw every event so far.
    browser
        .wait_for(
            "orders' events/s and commit to ack sampled",
            "const row = document.querySelector('tr[data-pipeline=\"orders\"]'); \
             return /^[0-9.]+$/.test(row.querySelector('td.rate').textContent) \
             && /^[0-9.]+$/.test(row.querySelector('td.latency').textContent)",
        )
        .await?;
    browser
        .screenshot(&artifacts()?.join("fleet-stopped.png"))
        .await?;

    // The stopped pipeline's console: its last run, marked not ready with the stop.
    browser
        .open(&format!("http://{addr}/console/p/billing/#overview"))
        .await?;
    browser
        .wait_for(
            "billing's badge says why",
            "const b = document.getElementById('relay-state'); return b.className === 'badge bad' && b.title.startsWith('stopped: ')",
        )
        .await?;
    ensure!(browser.text("#events-published").await? == "2");
    browser.close().await?;
    ensure!(
        read_ids(&js, "ORDERS").await?.contains(&last),
        "orders published on after billing stopped"
    );
    Ok(())
}

/// The `Nats-Msg-Id` of every message in `stream`.
async fn read_ids(js: &async_nats::jetstream::Context, stream: &str) -> Result<Vec<String>> {
    let mut stream = js.get_stream(stream).await?;
    let mut ids = Vec::new();
    let last = stream.info().await?.state.last_sequence;
    for seq in 1..=last {
        let message = stream.get_raw_message(seq).await.context("a message")?;
        if let Some(id) = message.headers.get("Nats-Msg-Id") {
            ids.push(id.as_str().to_owned());
        }
    }
    Ok(ids)
}
