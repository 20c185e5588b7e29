//! Outbox tables known by relation OID: renames, moves and column renames.

use super::*;

#[test]
fn a_renamed_outbox_table_is_an_error_not_another_table() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(16384)).unwrap();
    let mut renamed = debezium_relation(16384);
    renamed.name = "outbox_old".into();
    let err = router.on_relation_live(renamed).unwrap_err();
    assert_eq!(
        err,
        RouteError::OutboxRenamed {
            configured: "public.outbox".into(),
            now: "public.outbox_old".into(),
            oid: 16384
        }
    );
    assert!(err.is_schema_mismatch());
    let text = err.to_string();
    assert!(
        text.contains("`public.outbox`") && text.contains("`public.outbox_old`"),
        "{text}"
    );
    // Its rows fail too; they are never "not an outbox".
    let row = insert(
        16384,
        &[Some("e"), Some("A"), Some("1"), Some("T"), Some("{}"), None],
    );
    assert!(router.is_outbox(16384));
    assert!(router.route_insert(&row, &tx(), 0).is_err());
}

#[test]
fn a_table_moved_to_another_schema_is_an_error() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(5)).unwrap();
    let mut moved = debezium_relation(5);
    moved.namespace = "archive".into();
    assert!(matches!(
        router.on_relation_live(moved),
        Err(RouteError::OutboxRenamed { ref now, .. }) if now == "archive.outbox"
    ));
}

#[test]
fn an_oid_bound_from_the_catalog_is_caught_on_its_first_relation_message() {
    // Renamed before the relay saw any of its rows in this session.
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.bind_catalog(&[("public".into(), "outbox".into(), 77)], Lsn(5000));
    let mut renamed = debezium_relation(77);
    renamed.name = "outbox_2025".into();
    assert!(matches!(
        router.on_relation_live(renamed),
        Err(RouteError::OutboxRenamed { oid: 77, .. })
    ));
    // An older incarnation (another OID) under the configured name is still the outbox.
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.bind_catalog(&[("public".into(), "outbox".into(), 77)], Lsn(5000));
    router.on_relation_live(debezium_relation(60)).unwrap();
    assert!(router.is_outbox(60));
}

#[test]
fn a_name_from_before_the_catalog_read_is_history_and_routed_as_configured() {
    // Renamed and renamed back before this session: the WAL still carries the old name.
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.bind_catalog(&[("public".into(), "outbox".into(), 77)], Lsn(5000));
    let mut then = debezium_relation(77);
    then.name = "outbox_old".into();
    router.on_relation(then.clone(), Some(Lsn(4000))).unwrap();
    let row = insert(
        77,
        &[Some("e"), Some("A"), Some("1"), Some("T"), Some("{}"), None],
    );
    let msg = router.route_insert(&row, &tx(), 0).unwrap().unwrap();
    assert_eq!(msg.header("Outbox-Table"), Some("public.outbox"));
    assert_eq!(&*msg.table, "public.outbox");
    // The same name in a transaction after the catalog read is a live rename.
    router
        .on_relation(debezium_relation(77), Some(Lsn(5100)))
        .unwrap();
    assert!(matches!(
        router.on_relation(then, Some(Lsn(5200))),
        Err(RouteError::OutboxRenamed { .. })
    ));
}

#[test]
fn two_outbox_tables_swapping_names_is_an_error() {
    let mut router = Router::new(&[
        OutboxTableConfig::with_defaults("public.a"),
        OutboxTableConfig::with_defaults("public.b"),
    ])
    .unwrap();
    let mut a = debezium_relation(1);
    a.name = "a".into();
    let mut b = debezium_relation(2);
    b.name = "b".into();
    router.on_relation_live(a.clone()).unwrap();
    router.on_relation_live(b.clone()).unwrap();
    a.name = "b".into();
    assert!(matches!(
        router.on_relation_live(a),
        Err(RouteError::OutboxRenamed { ref configured, ref now, .. })
            if configured == "public.a" && now == "public.b"
    ));
}

#[test]
fn a_renamed_mapped_column_names_old_and_new() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.on_relation_live(debezium_relation(1)).unwrap();
    let mut renamed = debezium_relation(1);
    renamed.columns[3].name = "event_type".into();
    let err = router.on_relation_live(renamed).unwrap_err();
    assert_eq!(
        err,
        RouteError::ColumnRenamed {
            table: "public.outbox".into(),
            column: "type".into(),
            now: "event_type".into(),
            role: "subject"
        }
    );
    assert!(err.to_string().contains("renamed to `event_type`"), "{err}");
    // A dropped column (fewer columns) is reported as missing, not renamed.
    let mut dropped = debezium_relation(1);
    dropped.columns.remove(3);
    assert!(matches!(
        router.on_relation_live(dropped),
        Err(RouteError::MissingColumn { ref column, .. }) if column == "type"
    ));
}

#[test]
fn partitions_of_a_partitioned_outbox_are_routed_as_the_configured_table() {
    let mut router = Router::new(&[OutboxTableConfig::with_defaults("public.outbox")]).unwrap();
    router.bind_catalog(&[("public".into(), "outbox".into(), 77)], Lsn(5000));
    router.bind_partitions(&[
        ("public".into(), "outbox".into(), 78),
        ("public".into(), "outbox".into(), 79),
    ]);
    let row = |oid| {
        insert(
            oid,
            &[Some("e"), Some("A"), Some("1"), Some("T"), Some("{}"), None],
        )
    };
    // publish_via_partition_root: the root (bound by OID) and, beside it, the partition.
    router.on_relation_live(debezium_relation(77)).unwrap();
    let mut p1 = debezium_relation(78);
    p1.name = "outbox_2025_01".into();
    router.on_relation_live(p1).unwrap();
    let msg = router.route_insert(&row(77), &tx(), 0).unwrap().unwrap();
    assert_eq!(msg.header("Outbox-Table"), Some("public.outbox"));
    // Without the option (or decoded with the catalog from before it was set): the
    // partition's own OID and name, before or after the catalog read alike.
    let msg = router.route_insert(&row(78), &tx(), 0).unwrap().unwrap();
    assert_eq!(&*msg.table, "public.outbox");
    let mut default = debezium_relation(79);
    default.name = "outbox_default".into();
    router.on_relation(default, Some(Lsn(4000))).unwrap();
    let msg = router.route_insert(&row(79), &tx(), 0).unwrap().unwrap();
    assert_eq!(msg.header("Outbox-Table"), Some("public.outbox"));
    // A partition the session does not know is another table, and stays out of the OIDs the
    // table is known by.
    let mut unknown = debezium_relation(80);
    unknown.name = "outbox_2025_02".into();
    router.on_relation_live(unknown).unwrap();
    assert!(router.route_insert(&row(80), &tx(), 0).unwrap().is_none());
    // The partition renamed is still the partition, never an "outbox renamed" error.
    let mut renamed = debezium_relation(78);
    renamed.name = "outbox_archive".into();
    router.on_relation_live(renamed).unwrap();
    assert!(router.route_insert(&row(78), &tx(), 0).unwrap().is_some());
}
