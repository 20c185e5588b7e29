//! A transaction with a row that cannot be routed publishes nothing of itself: the rows before
//! the bad one are routed, held until the transaction's Commit, and dropped with the stop.

use std::time::Duration;

use anyhow::Result;

use crate::support::*;

/// One transaction inserts row A, then a row whose empty `type` cannot form a subject, then row
/// C, without a dead-letter subject: the relay stops (65) before the transaction, neither A nor
/// C is in the stream, and neither the checkpoint nor the slot is past the transaction's commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_row_stops_before_its_transaction_with_nothing_of_it_published() -> Result<()> {
    let env = Env::start().await?;
    let config = env.config("");
    let mut relay = Relay::start_streaming(&config).await?;
    let mut db = env.db().await?;
    let before = insert_event(&db, "Order", "Placed", r#"{"n":0}"#).await?;
    let js = env.jetstream().await?;
    wait_for_id(&js, &before, &relay).await?;

    let tx = db.transaction().await?;
    let a = insert_event(&tx, "Order", "Placed", r#"{"n":"a"}"#).await?;
    let bad = insert_unroutable(&tx, r#"{"n":"bad"}"#).await?;
    let c = insert_event(&tx, "Order", "Placed", r#"{"n":"c"}"#).await?;
    tx.commit().await?;

    let log = expect_exit(
        &mut relay,
        65,
        Duration::from_secs(30),
        &["stopped before this transaction", &bad],
    )
    .await?;
    let got = read_stream(&js).await?;
    let ids: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(
        ids,
        [before.as_str()],
        "A ({a}) and C ({c}) must not be published"
    );
    let (checkpoint, _, commit) = assert_not_confirmed_past(&env, &log, &bad).await?;
    // The event before the transaction was confirmed: the stop is at the transaction, not
    // before an earlier one.
    assert!(checkpoint > 0 && checkpoint <= commit);
    Ok(())
}
