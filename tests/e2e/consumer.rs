//! The relay and the `outbox-consumer` library end to end: every committed outbox event is
//! applied exactly once in a downstream service's database, across a relay kill -9 and with
//! second copies of events stored past the stream's (short) duplicate window, as a re-send by
//! another writer or after a lost stream index would store them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::FutureExt as _;
use outbox_consumer::{Consumer, handler_fn};
use outbox_contract::HEADER_EXPECTED_LAST_MSG_ID;

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn relay_and_consumer_apply_every_event_exactly_once() -> Result<()> {
    let env = Env::start().await?;
    env.pg.create_database("svc").await?;
    let svc = env.pg.connect("svc").await?;
    svc.batch_execute("CREATE TABLE applied (event_id text NOT NULL, subject text NOT NULL)")
        .await?;

    // A 100 ms duplicate window: a re-send after a restart is stored as a second copy.
    let config = env.config_full("create_stream = true\nduplicate_window = \"100ms\"", "");
    let mut relay = Relay::start_streaming(&config).await?;

    let db = env.db().await?;
    let mut ids = Vec::new();
    for t in 0..40 {
        for r in 0..5 {
            ids.push(
                insert_event(
                    &db,
                    "Order",
                    "Created",
                    &format!(r#"{{"t": {t}, "r": {r}}}"#),
                )
                .await?,
            );
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
        if t == 20 {
            relay.kill9();
            relay = Relay::start(&config)?;
        }
    }
    let js = env.jetstream().await?;
    let stored = wait_for_messages(&js, ids.len(), Duration::from_secs(60), Some(&relay)).await?;
    // Second copies of 25 events, past the 100 ms window: JetStream stores them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for m in stored.iter().take(25) {
        let mut headers = async_nats::HeaderMap::new();
        // The stored copy's commit-order condition named the event before it, which is not
        // the stream's last message now: a copy publishes without it.
        for (k, v) in m
            .headers
            .iter()
            .filter(|(k, _)| *k != HEADER_EXPECTED_LAST_MSG_ID)
        {
            headers.insert(k.as_str(), v.as_str());
        }
        js.publish_with_headers(m.subject.clone(), headers, m.payload.clone().into())
            .await?
            .await?;
    }
    let copies = read_stream(&js).await?.len();
    assert_eq!(copies, ids.len() + 25, "second copies stored");

    let pg_config: tokio_postgres::Config = env.pg.url("svc").parse()?;
    let handler = handler_fn(|tx, event| {
        async move {
            tx.execute(
                "INSERT INTO applied (event_id, subject) VALUES ($1, $2)",
                &[&event.id, &event.subject],
            )
            .await?;
            Ok(())
        }
        .boxed()
    });
    let consumer = Consumer::builder(js.clone(), pg_config, "billing")
        .stream(STREAM)
        .subjects(["outbox.>"])
        .parallel(4)
        .build()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(consumer.run(handler, async move {
        let _ = stop_rx.await;
    }));

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let applied: i64 = svc
            .query_one("SELECT count(*) FROM applied", &[])
            .await?
            .get(0);
        let ledger: i64 = svc
            .query_one("SELECT count(*) FROM outbox_consumer_ledger", &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        if applied as usize >= ids.len() && ledger as usize >= ids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "applied {applied} of {}",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let any remaining duplicate copies be consumed before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), running).await;

    let mut counts: HashMap<String, i64> = HashMap::new();
    for row in svc
        .query(
            "SELECT event_id, count(*) FROM applied GROUP BY event_id",
            &[],
        )
        .await?
    {
        counts.insert(row.get(0), row.get(1));
    }
    for id in &ids {
        assert_eq!(counts.get(id), Some(&1), "event {id} applied exactly once");
    }
    assert_eq!(
        counts.len(),
        ids.len(),
        "nothing applied that was not committed"
    );
    eprintln!(
        "stream holds {copies} copies of {} events; each applied once",
        ids.len()
    );
    Ok(())
}
