//! The ledger migration and pruning.

use std::time::Duration;

use outbox_consumer::{ensure_ledger, prune_ledger};
use relay_testkit::PostgresServer;

#[tokio::test]
async fn ensure_ledger_is_idempotent_and_safe_concurrently() -> anyhow::Result<()> {
    let pg = PostgresServer::start().await?;
    pg.create_database("l").await?;
    let (a, b) = (pg.connect("l").await?, pg.connect("l").await?);
    let (ra, rb) = tokio::join!(ensure_ledger(&a), ensure_ledger(&b));
    ra?;
    rb?;
    ensure_ledger(&a).await?;
    // The session is still usable (no transaction left open).
    let n: i64 = a
        .query_one("SELECT count(*) FROM outbox_consumer_ledger", &[])
        .await?
        .get(0);
    assert_eq!(n, 0);
    Ok(())
}

#[tokio::test]
async fn prune_ledger_deletes_only_old_rows_of_that_consumer() -> anyhow::Result<()> {
    let pg = PostgresServer::start().await?;
    pg.create_database("l").await?;
    let db = pg.connect("l").await?;
    ensure_ledger(&db).await?;
    db.batch_execute(
        "INSERT INTO outbox_consumer_ledger (consumer, event_id, subject, stream_seq, applied_at)
         SELECT c, 'old' || i, 's', i, now() - interval '3 days'
           FROM generate_series(1, 12000) i, (VALUES ('a'), ('b')) v(c);
         INSERT INTO outbox_consumer_ledger (consumer, event_id, subject, stream_seq)
         SELECT 'a', 'new' || i, 's', i FROM generate_series(1, 10) i;",
    )
    .await?;
    let deleted = prune_ledger(&db, "a", Duration::from_secs(2 * 86_400)).await?;
    assert_eq!(deleted, 12_000, "two batches");
    let left = |c: &'static str| {
        let db = &db;
        async move {
            let n: i64 = db
                .query_one(
                    "SELECT count(*) FROM outbox_consumer_ledger WHERE consumer = $1",
                    &[&c],
                )
                .await?
                .get(0);
            anyhow::Ok(n)
        }
    };
    assert_eq!(left("a").await?, 10, "recent rows kept");
    assert_eq!(left("b").await?, 12_000, "other consumers untouched");
    assert_eq!(prune_ledger(&db, "a", Duration::from_secs(3600)).await?, 0);
    Ok(())
}
