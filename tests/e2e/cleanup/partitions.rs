//! `mode = "drop-partitions"`: partitions detached and dropped only once every row they held is
//! confirmed, and created ahead.

use super::*;

/// `mode = "drop-partitions"` on a table partitioned by day: partitions whose range ended more
/// than `retain` ago are detached (`CONCURRENTLY` without a default partition, plainly with
/// one), and dropped only once the checkpoint is past every row they held: rows written into
/// them during a broker outage keep them from being dropped until they are confirmed.
#[tokio::test(flavor = "multi_thread")]
async fn drop_partitions_waits_for_the_checkpoint() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let mut writer = env.db().await?;
    let js = env.jetstream().await?;
    let day = |d: i64| format!("(date_trunc('day', now()) + interval '{d} days')");
    db.batch_execute(&format!(
        "DROP TABLE outbox; \
         CREATE TABLE outbox ( \
             id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, \
             aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, \
             tracingspancontext varchar(512), created_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at); \
         CREATE TABLE outbox_now PARTITION OF outbox FOR VALUES FROM ({}) TO ({});",
        day(-1),
        day(2)
    ))
    .await?;
    audit(&db).await?;
    let (http, addr) = http_listen();
    let config = cleanup_config(
        &env,
        "mode = \"drop-partitions\"\nretain = \"1d\"\ninterval = \"200ms\"",
        &http,
    );
    let exists = async |name: &str| -> Result<bool> {
        Ok(db
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
            .await?
            .get(0))
    };

    let is_partition = async |name: &str| -> Result<bool> {
        Ok(db
            .query_one(
                "SELECT COALESCE((SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)), false)",
                &[&name],
            )
            .await?
            .get(0))
    };

    // During a broker outage, old partitions are created with rows in them (in one transaction,
    // so cleanup cannot detach one before its rows are in): they are detached at once (older
    // than retain), but dropped only once the relay confirmed their rows.
    let relay = Relay::start_streaming(&config).await?;
    wait_for_fence(&db, &relay).await?;
    env.nats.pause()?;
    let mut rows_of: HashMap<&str, Vec<String>> = HashMap::new();
    let tx = writer.transaction().await?;
    tx.batch_execute(&format!(
        "CREATE TABLE outbox_old5 PARTITION OF outbox FOR VALUES FROM ({}) TO ({}); \
         CREATE TABLE outbox_old4 PARTITION OF outbox FOR VALUES FROM ({}) TO ({});",
        day(-5),
        day(-4),
        day(-4),
        day(-3)
    ))
    .await?;
    for (name, d) in [
        ("public.outbox_old5", -5),
        ("public.outbox_old4", -4),
        ("public.outbox_old5", -5),
        ("public.outbox_old4", -4),
    ] {
        rows_of
            .entry(name)
            .or_default()
            .push(insert_dated(&tx, &day(d)).await?);
    }
    tx.commit().await?;
    let current = insert_dated(&db, &day(0)).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        exists("outbox_old5").await? && exists("outbox_old4").await?,
        "dropped during the outage"
    );
    assert!(
        !is_partition("outbox_old5").await? && !is_partition("outbox_old4").await?,
        "old partitions are detached at once"
    );
    env.nats.resume()?;
    wait_for_messages(&js, 5, WAIT, Some(&relay)).await?;
    wait_until("the old partitions dropped", &relay, async || {
        Ok(!exists("outbox_old5").await? && !exists("outbox_old4").await?)
    })
    .await?;
    assert!(exists("outbox_now").await?, "the current partition stays");
    assert_eq!(count_of(&db, std::slice::from_ref(&current)).await?, 1);

    // With a default partition a detach cannot be concurrent: a plain one, same rule.
    db.batch_execute("CREATE TABLE outbox_default PARTITION OF outbox DEFAULT")
        .await?;
    let tx = writer.transaction().await?;
    tx.batch_execute(&format!(
        "CREATE TABLE outbox_old3 PARTITION OF outbox FOR VALUES FROM ({}) TO ({})",
        day(-3),
        day(-2)
    ))
    .await?;
    rows_of
        .entry("public.outbox_old3")
        .or_default()
        .push(insert_dated(&tx, &day(-3)).await?);
    tx.commit().await?;
    wait_for_messages(&js, 6, WAIT, Some(&relay)).await?;
    wait_until("the third old partition dropped", &relay, async || {
        Ok(!exists("outbox_old3").await?)
    })
    .await?;
    assert!(exists("outbox_default").await?);

    // Each dropped partition's rows were in the stream, committed before the checkpoint the
    // DROP saw.
    let lsns = commit_lsns(&js).await?;
    let drops = db
        .query(
            "SELECT name, (checkpoint - '0/0')::bigint FROM drop_audit ORDER BY name",
            &[],
        )
        .await?;
    let dropped: Vec<String> = drops.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        dropped,
        [
            "public.outbox_old3",
            "public.outbox_old4",
            "public.outbox_old5"
        ]
    );
    for row in &drops {
        let (name, checkpoint): (String, i64) = (row.get(0), row.get(1));
        for id in &rows_of[name.as_str()] {
            let lsn = lsns
                .get(id)
                .with_context(|| format!("{name} dropped with row {id}, not in the stream"))?;
            assert!(
                *lsn < checkpoint as u64,
                "{name} dropped at checkpoint {checkpoint:#x}, before its row {id} ({lsn:#x})"
            );
        }
    }
    // The counter moves after the DROP committed, which the loop above saw: wait for it.
    let dropped_metric = wait_metric(
        &addr,
        "outbox_relay_cleanup_partitions_dropped_total{table=\"public.outbox\"}",
        WAIT,
        |n| n >= 3.0,
    )
    .await;
    assert_eq!(dropped_metric, Some(3.0));
    Ok(())
}

/// `create_ahead = "3d"`: the partitions after the newest one are created, each a day wide like
/// it and named by its first day, until they cover three days past now; later rounds create
/// nothing more. A row written into a created partition is delivered as the outbox table's.
#[tokio::test(flavor = "multi_thread")]
async fn drop_partitions_creates_partitions_ahead() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    db.batch_execute(
        "DROP TABLE outbox; \
         CREATE TABLE outbox ( \
             id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, \
             aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, \
             tracingspancontext varchar(512), created_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at); \
         CREATE TABLE outbox_first PARTITION OF outbox \
             FOR VALUES FROM (date_trunc('day', now()) - interval '1 day') TO (date_trunc('day', now()));",
    )
    .await?;
    let partitions = async || -> Result<Vec<(String, String)>> {
        Ok(db
            .query(
                "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i \
                 JOIN pg_class c ON c.oid = i.inhrelid \
                 WHERE i.inhparent = 'outbox'::regclass ORDER BY c.relname",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    };
    assert_eq!(
        partitions().await?.len(),
        1,
        "one partition before the relay"
    );
    // The days from today on until one starting after now() + 3 days is not needed: today and
    // the three after it (the fourth starts past now() + 3d only at midnight sharp).
    let expected: Vec<(String, String)> = db
        .query(
            "SELECT 'outbox_' || to_char(d, 'YYYYMMDD'), \
                    format('FOR VALUES FROM (%L) TO (%L)', d, d + interval '1 day') \
             FROM generate_series(date_trunc('day', now()), now() + interval '3 days', \
                                  interval '1 day') d",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(expected.len() >= 4, "{expected:?}");

    let config = cleanup_config(
        &env,
        "mode = \"drop-partitions\"\nretain = \"30d\"\ninterval = \"200ms\"\ncreate_ahead = \"3d\"",
        "",
    );
    let relay = Relay::start_streaming(&config).await?;
    wait_until("the partitions ahead created", &relay, async || {
        Ok(partitions().await?.len() > expected.len())
    })
    .await?;
    // Several more rounds: nothing else is created.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut created = partitions().await?;
    created.retain(|(name, _)| name != "outbox_first");
    assert_eq!(created, expected, "log:\n{}", relay.log());

    // A row two days ahead lands in a created partition and is delivered as the outbox's.
    let id = insert_dated(&db, "(date_trunc('day', now()) + interval '2 days')").await?;
    let messages = wait_for_messages(&js, 1, WAIT, Some(&relay)).await?;
    assert_eq!(messages[0].id(), id);
    assert_eq!(messages[0].header("Outbox-Table"), "public.outbox");
    Ok(())
}
