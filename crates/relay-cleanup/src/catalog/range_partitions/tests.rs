use relay_testkit::PostgresServer;

use super::*;

#[tokio::test]
async fn a_range_partitioned_tables_key_partitions_and_detached_ones_are_read() {
    let pg = PostgresServer::start().await.unwrap();
    let client = pg.connect("postgres").await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE events (id bigint, at timestamptz NOT NULL) PARTITION BY RANGE (at); \
             CREATE TABLE events_b PARTITION OF events FOR VALUES FROM ('2030-01-02') TO ('2030-01-03'); \
             CREATE TABLE events_a PARTITION OF events FOR VALUES FROM ('2030-01-01') TO ('2030-01-02'); \
             CREATE TABLE listed (id bigint, kind text) PARTITION BY LIST (kind); \
             CREATE TABLE listed_x PARTITION OF listed FOR VALUES IN ('x'); \
             CREATE TABLE by_expr (id bigint, at timestamptz) PARTITION BY RANGE (date_trunc('day', at AT TIME ZONE 'UTC')); \
             CREATE TABLE plain (id bigint);",
        )
        .await
        .unwrap();
    for (table, range_on_one) in [("events", true), ("listed", false), ("plain", false)] {
        let oid: u32 = client
            .query_one("SELECT $1::text::regclass::oid", &[&table])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            range_partitioned_on_one_column(&client, oid).await.unwrap(),
            range_on_one,
            "{table}"
        );
    }
    assert_eq!(
        partition_key_column(&client, "public.events")
            .await
            .unwrap(),
        Some("at".to_owned())
    );
    assert_eq!(
        partition_key_column(&client, "public.by_expr")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        partition_key_column(&client, "public.plain").await.unwrap(),
        None
    );

    let partitions = range_partitions(&client, "public.events").await.unwrap();
    let names: Vec<_> = partitions.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["public.events_a", "public.events_b"], "by name");
    assert!(
        partitions[0]
            .bound
            .starts_with("FOR VALUES FROM ('2030-01-01"),
        "{}",
        partitions[0].bound
    );
    assert!(
        range_partitions(&client, "public.listed")
            .await
            .unwrap()
            .is_empty()
    );

    // PostgreSQL 14+ and no default partition: a detach may be concurrent.
    assert_eq!(
        may_detach_concurrently(&client, "public.events")
            .await
            .unwrap(),
        pg.version_num() >= 140_000
    );
    client
        .batch_execute("CREATE TABLE events_rest PARTITION OF events DEFAULT")
        .await
        .unwrap();
    assert!(
        !may_detach_concurrently(&client, "public.events")
            .await
            .unwrap()
    );

    let a = partitions[0].oid;
    assert_eq!(
        detach_state(&client, a).await.unwrap(),
        DetachState {
            exists: true,
            attached: true,
            pending: false
        }
    );
    assert_eq!(
        detached_table_name(&client, a).await.unwrap(),
        None,
        "still a partition"
    );
    client
        .batch_execute("ALTER TABLE events DETACH PARTITION events_a")
        .await
        .unwrap();
    assert_eq!(
        detach_state(&client, a).await.unwrap(),
        DetachState {
            exists: true,
            attached: false,
            pending: false
        }
    );
    assert_eq!(
        detached_table_name(&client, a).await.unwrap().as_deref(),
        Some("public.events_a")
    );
    client.batch_execute("DROP TABLE events_a").await.unwrap();
    assert_eq!(
        detach_state(&client, a).await.unwrap(),
        DetachState::default()
    );
    assert_eq!(detached_table_name(&client, a).await.unwrap(), None);
}

#[test]
fn range_bounds_of_printed_partition_bounds() {
    assert_eq!(
        range_bounds("FOR VALUES FROM ('2030-01-01 00:00:00+00') TO ('2030-01-02 00:00:00+00')"),
        Some((
            "2030-01-01 00:00:00+00".into(),
            "2030-01-02 00:00:00+00".into()
        ))
    );
    assert_eq!(
        range_bounds("FOR VALUES FROM ('2030-01-01') TO ('2030-02-01')"),
        Some(("2030-01-01".into(), "2030-02-01".into()))
    );
    assert_eq!(
        range_bounds("FOR VALUES FROM (MINVALUE) TO ('2030-01-01')"),
        None
    );
    assert_eq!(
        range_bounds("FOR VALUES FROM ('2030-01-01') TO (MAXVALUE)"),
        None
    );
    assert_eq!(range_bounds("FOR VALUES FROM (1) TO (10)"), None);
    assert_eq!(range_bounds("DEFAULT"), None);
    assert_eq!(range_bounds("FOR VALUES IN ('a')"), None);
}
