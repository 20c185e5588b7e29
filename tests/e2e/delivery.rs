//! What arrives, in which order, with which headers.

use std::time::Duration;

use anyhow::Result;

use crate::support::*;

/// Commit order differs from start order, other tables, a rollback, insert-then-delete: every
/// committed event arrives once, in commit order, byte-exact, with its headers.
#[tokio::test(flavor = "multi_thread")]
async fn committed_events_arrive_once_in_commit_order_with_headers() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text)")
        .await?;
    let relay = Relay::start_streaming(&env.config("")).await?;

    let mut expected: Vec<(String, String)> = Vec::new(); // (id, xid) in commit order
    // 1. Plain transaction with two events and a write to another table.
    let mut a = env.db().await?;
    let tx = a.transaction().await?;
    let xid1: String = tx
        .query_one("SELECT (txid_current() % 4294967296)::text", &[])
        .await?
        .get(0);
    let e1 = insert_event(
        &tx,
        "Order",
        "Created",
        r#"{"n": 1, "text": "ünï 😀 e\u0301", "q": "a\"b"}"#,
    )
    .await?;
    tx.execute("INSERT INTO orders (note) VALUES ('x')", &[])
        .await?;
    let e2 = insert_event(&tx, "Order", "Paid", r#"{"n": 2}"#).await?;
    tx.commit().await?;
    expected.push((e1, xid1.clone()));
    expected.push((e2, xid1));

    // 2. Interleaved: A starts first, B commits first.
    let mut b = env.db().await?;
    let tx_a = a.transaction().await?;
    let xid_a: String = tx_a
        .query_one("SELECT (txid_current() % 4294967296)::text", &[])
        .await?
        .get(0);
    let ea = insert_event(&tx_a, "Order", "Shipped", r#"{"who": "A"}"#).await?;
    let tx_b = b.transaction().await?;
    let xid_b: String = tx_b
        .query_one("SELECT (txid_current() % 4294967296)::text", &[])
        .await?
        .get(0);
    let eb = insert_event(&tx_b, "Customer", "Registered", r#"{"who": "B"}"#).await?;
    tx_b.commit().await?;
    tx_a.commit().await?;
    expected.push((eb, xid_b));
    expected.push((ea, xid_a));

    // 3. Rolled back: nothing may arrive.
    let tx = a.transaction().await?;
    let rolled_back = insert_event(&tx, "Order", "Cancelled", r#"{"never": true}"#).await?;
    tx.rollback().await?;

    // 4. Only another table.
    db.execute("INSERT INTO orders (note) VALUES ('only orders')", &[])
        .await?;

    // 5. Insert and delete the outbox row in one transaction (Debezium pattern): published.
    let tx = a.transaction().await?;
    let xid5: String = tx
        .query_one("SELECT (txid_current() % 4294967296)::text", &[])
        .await?
        .get(0);
    let e5 = insert_event(&tx, "Order", "Archived", r#"{"gone": "soon"}"#).await?;
    tx.execute("DELETE FROM outbox WHERE id = $1::text::uuid", &[&e5])
        .await?;
    tx.commit().await?;
    expected.push((e5.clone(), xid5));

    // 6. A marker transaction, so we know when everything before it was processed.
    let marker = insert_event(&db, "Marker", "Done", "{}").await?;
    expected.push((marker, String::new()));

    let js = env.jetstream().await?;
    let got = wait_for_messages(&js, expected.len(), Duration::from_secs(30), Some(&relay)).await?;
    let ids: Vec<&str> = got.iter().map(Received::id).collect();
    let want: Vec<&str> = expected.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, want, "each committed event once, in commit order");
    assert!(!ids.contains(&rolled_back.as_str()));
    assert!(got.windows(2).all(|w| w[0].seq < w[1].seq), "stream order");

    let mut last_lsn = 0u64;
    for (msg, (id, xid)) in got.iter().zip(&expected) {
        // Payload byte-exact: what PostgreSQL itself renders for the stored jsonb.
        let stored: Option<String> = db
            .query_opt(
                "SELECT payload::text FROM outbox WHERE id = $1::text::uuid",
                &[id],
            )
            .await?
            .map(|r| r.get(0));
        if let Some(stored) = stored {
            assert_eq!(
                String::from_utf8_lossy(&msg.payload),
                stored,
                "payload of {id}"
            );
        }
        assert_eq!(msg.header("Outbox-Table"), "public.outbox");
        if !xid.is_empty() {
            assert_eq!(msg.header("Outbox-Xid"), xid, "xid of {id}");
        }
        let (hi, lo) = msg
            .header("Outbox-Commit-Lsn")
            .split_once('/')
            .expect("lsn header");
        let lsn = (u64::from_str_radix(hi, 16)? << 32) | u64::from_str_radix(lo, 16)?;
        assert!(lsn >= last_lsn, "commit LSNs ascend");
        last_lsn = lsn;
        assert!(msg.header("Outbox-Commit-Time").ends_with('Z'));
        assert!(!msg.header("Outbox-Aggregate-Type").is_empty());
    }
    assert_eq!(got[0].subject, "outbox.Order.Created");
    assert_eq!(got[2].subject, "outbox.Customer.Registered");
    assert_eq!(got[0].header("Outbox-Event-Type"), "Created");
    assert_eq!(got[0].header("Outbox-Tx-Index"), "0");
    assert_eq!(got[1].header("Outbox-Tx-Index"), "1");
    let deleted = got
        .iter()
        .find(|m| m.id() == e5)
        .expect("insert+delete event");
    assert_eq!(
        String::from_utf8_lossy(&deleted.payload),
        r#"{"gone": "soon"}"#
    );
    Ok(())
}

/// A table shaped like an application's own outbox works by configuration alone.
#[tokio::test(flavor = "multi_thread")]
async fn notification_outbox_works_by_configuration_alone() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    db.batch_execute(
        "CREATE TABLE notification_outbox (
            id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            request_id bigint,
            tenant_id varchar(255),
            order_id bigint,
            event_type varchar(40),
            status varchar(20) DEFAULT 'PENDING',
            attempts int DEFAULT 0,
            published_at timestamptz
        )",
    )
    .await?;
    let config = env.config(
        r#"
[[outbox]]
table = "public.notification_outbox"
event_id = "id"
subject = "outbox.notification.{tenant_id}.{event_type}"
payload = "*"
headers = { "Tenant-Id" = "tenant_id", "Order-Id" = "order_id" }
"#,
    );
    let relay = Relay::start_streaming(&config).await?;
    db.batch_execute(
        "INSERT INTO notification_outbox (request_id, tenant_id, order_id, event_type)
         VALUES (11, 'acme', 501, 'ORDER_PLACED'), (12, 'globex.eu', 502, 'ORDER_SHIPPED')",
    )
    .await?;
    let js = env.jetstream().await?;
    let got = wait_for_messages(&js, 2, Duration::from_secs(30), Some(&relay)).await?;
    assert_eq!(got[0].subject, "outbox.notification.acme.ORDER_PLACED");
    assert_eq!(
        got[1].subject,
        "outbox.notification.globex%2Eeu.ORDER_SHIPPED"
    );
    assert_eq!(got[0].id(), "1");
    assert_eq!(got[1].id(), "2");
    assert_eq!(got[0].header("Tenant-Id"), "acme");
    assert_eq!(got[1].header("Order-Id"), "502");
    assert_eq!(got[0].header("Outbox-Table"), "public.notification_outbox");
    let row: serde_json::Value = serde_json::from_slice(&got[0].payload)?;
    assert_eq!(row["request_id"], 11);
    assert_eq!(row["tenant_id"], "acme");
    assert_eq!(row["status"], "PENDING");
    assert_eq!(row["attempts"], 0);
    assert!(row["published_at"].is_null());
    Ok(())
}
