//! `--where`: only the rows it matches, under a cursor of its own; a filter that is not one
//! condition is refused before anything is read.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Result;

use super::{backfill, expect_each_once, seed};
use crate::support::*;

/// `--where` backfills only the rows it matches, under a cursor of its own; an unconfigured
/// table, and a filter that is not one condition, are refused with 78, naming them.
#[tokio::test(flavor = "multi_thread")]
async fn where_filter_backfills_only_matching_rows() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    seed(&db, 2_000, "created").await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;

    backfill(
        &config,
        &["--table", "public.nope"],
        78,
        Duration::from_secs(20),
        &["`public.nope` is not configured as an outbox table"],
    )
    .await?;
    backfill(
        &config,
        &["--table", "outbox", "--where", "nonsense_column > 1"],
        78,
        Duration::from_secs(20),
        &["--where `nonsense_column > 1` is not a valid condition"],
    )
    .await?;
    backfill(
        &config,
        &["--table", "outbox", "--where", "true; DELETE FROM outbox"],
        78,
        Duration::from_secs(20),
        &["--where `true; DELETE FROM outbox` holds a `;`, which ends the statement"],
    )
    .await?;
    // Valid SQL where the filter is prepared alone, but its `OR` would leave the page's key
    // range: the backfill would read its first page forever.
    backfill(
        &config,
        &["--table", "outbox", "--where", "aggregateid = '1') OR (true"],
        78,
        Duration::from_secs(20),
        &[
            "--where `aggregateid = '1') OR (true` closes a parenthesis it did not open: give one condition",
        ],
    )
    .await?;
    let cursors: i64 = db
        .query_one("SELECT count(*) FROM outbox_relay.backfill", &[])
        .await?
        .get(0);
    assert_eq!(cursors, 0, "a refused filter starts no cursor");

    let wanted: HashSet<String> = db
        .query(
            "SELECT id::text FROM outbox WHERE aggregateid::int % 10 = 0",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(wanted.len(), 200);
    backfill(
        &config,
        &["--table", "outbox", "--where", "aggregateid::int % 10 = 0"],
        0,
        Duration::from_secs(30),
        &["finished:"],
    )
    .await?;
    let messages = expect_each_once(&env, &wanted, &relay).await?;
    assert!(
        messages
            .iter()
            .all(|m| m.header("Outbox-Backfill") == "true")
    );
    let count: i64 = db
        .query_one("SELECT count(*) FROM outbox", &[])
        .await?
        .get(0);
    assert_eq!(count, 2_000, "the filter changed nothing");
    Ok(())
}
