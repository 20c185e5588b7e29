//! Native (`Nats-TTL`, `Nats-Schedule`) and CloudEvents headers through the router.

use super::*;

fn native_relation() -> Relation {
    relation(
        5,
        "public",
        "outbox",
        &[
            ("id", 2950),
            ("aggregatetype", 1043),
            ("aggregateid", 1043),
            ("type", 1043),
            ("payload", oid::JSONB),
            ("ttl", oid::INTERVAL),
            ("ttl_s", oid::INT4),
            ("deliver_at", oid::TIMESTAMPTZ),
            ("topic", 1043),
        ],
    )
}

fn native_config() -> OutboxTableConfig {
    OutboxTableConfig {
        ttl_column: Some("ttl".into()),
        schedule_column: Some("deliver_at".into()),
        schedule_subject: Some("outbox_schedules".into()),
        cloudevents: Some(CloudEventsConfig {
            source: "/orders".into(),
            type_column: "type".into(),
            time_column: None,
            subject_column: Some("topic".into()),
        }),
        ..OutboxTableConfig::with_defaults("public.outbox")
    }
}

fn router(config: OutboxTableConfig) -> Router {
    let mut router = Router::new(&[config]).unwrap();
    router.on_relation_live(native_relation()).unwrap();
    router
}

fn row(ttl: Option<&str>, ttl_s: Option<&str>, deliver_at: Option<&str>) -> Insert {
    insert(
        5,
        &[
            Some("e.1"),
            Some("Order"),
            Some("7"),
            Some("OrderCreated"),
            Some("{}"),
            ttl,
            ttl_s,
            deliver_at,
            None,
        ],
    )
}

fn own_headers(msg: &OutboundMessage) -> Vec<(String, String)> {
    msg.headers
        .iter()
        .filter(|(n, _)| {
            n.starts_with("ce-") || n.starts_with("Nats-") || n.as_ref() == "Outbox-Event-Id"
        })
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn ttl_schedule_and_cloudevents_headers_come_from_the_row() {
    let router = router(native_config());
    let tx = tx();
    let msg = router
        .route_insert(&row(Some("01:00:00.2"), None, None), &tx, 0)
        .unwrap()
        .unwrap();
    assert_eq!(msg.subject, "outbox.Order.OrderCreated");
    let commit_time = tx.commit_time_text.to_string();
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(
        own_headers(&msg),
        pairs(&[
            ("Nats-TTL", "3601"),
            ("ce-specversion", "1.0"),
            ("ce-id", "e.1"),
            ("ce-source", "/orders"),
            ("ce-type", "OrderCreated"),
            ("ce-time", &commit_time),
        ])
    );

    // Scheduled: stored under its own schedule subject, delivered to the event's subject, the
    // TTL for the delivered copy.
    let msg = router
        .route_insert(
            &row(Some("2 days"), None, Some("2030-01-02 03:04:05.5+00")),
            &tx,
            1,
        )
        .unwrap()
        .unwrap();
    assert_eq!(msg.subject, "outbox_schedules.e%2E1");
    let headers = own_headers(&msg);
    assert_eq!(
        headers[..4],
        pairs(&[
            ("Nats-Schedule", "@at 2030-01-02T03:04:05.5Z"),
            ("Nats-Schedule-Target", "outbox.Order.OrderCreated"),
            ("Outbox-Event-Id", "e.1"),
            ("Nats-Schedule-TTL", "172800"),
        ])[..]
    );
    assert_eq!(msg.header("Nats-TTL"), None);

    // NULL columns: no header, the event goes out now and never expires.
    let msg = router
        .route_insert(&row(None, None, None), &tx, 2)
        .unwrap()
        .unwrap();
    assert_eq!(msg.subject, "outbox.Order.OrderCreated");
    assert_eq!(msg.header("Nats-TTL"), None);
    assert_eq!(msg.header("Nats-Schedule"), None);
    assert_eq!(msg.header("ce-subject"), None);
}

#[test]
fn a_bad_value_is_a_bad_row_naming_column_and_header() {
    let router = router(native_config());
    for (ttl, deliver_at, column, header) in [
        (Some("-00:00:10"), None, "ttl", "Nats-TTL"),
        (Some("00:00:00"), None, "ttl", "Nats-TTL"),
        (None, Some("infinity"), "deliver_at", "Nats-Schedule"),
        (
            Some("1 hour"),
            Some("2030-01-01 00:00:00+00"),
            "ttl",
            "Nats-Schedule-TTL",
        ),
    ] {
        let err = router
            .route_insert(&row(ttl, None, deliver_at), &tx(), 0)
            .unwrap_err();
        match &err {
            RouteError::InvalidNativeValue {
                column: c,
                header: h,
                event_id,
                ..
            } => {
                assert_eq!((c.as_str(), *h, event_id.as_str()), (column, header, "e.1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            !err.is_schema_mismatch(),
            "a row error, dead-lettered when configured"
        );
    }
    let seconds = OutboxTableConfig {
        ttl_column: Some("ttl_s".into()),
        ..native_config()
    };
    let router = self::router(seconds);
    let msg = router
        .route_insert(&row(None, Some("30"), None), &tx(), 0)
        .unwrap()
        .unwrap();
    assert_eq!(msg.header("Nats-TTL"), Some("30"));
    for bad in ["0", "-5"] {
        assert!(matches!(
            router.route_insert(&row(None, Some(bad), None), &tx(), 0),
            Err(RouteError::InvalidNativeValue { .. })
        ));
    }
    // CloudEvents needs a type.
    let router = self::router(OutboxTableConfig {
        subject: "outbox.{aggregatetype}".into(),
        ..native_config()
    });
    let mut no_type = row(None, None, None);
    no_type.new.values[3] = TupleValue::Null;
    let err = router.route_insert(&no_type, &tx(), 0).unwrap_err();
    assert!(err.to_string().contains("ce-type"), "{err}");
}

#[test]
fn a_column_of_the_wrong_type_stops_at_the_relation() {
    for (config, column) in [
        (
            OutboxTableConfig {
                ttl_column: Some("topic".into()),
                ..native_config()
            },
            "topic",
        ),
        (
            OutboxTableConfig {
                schedule_column: Some("ttl".into()),
                ..native_config()
            },
            "ttl",
        ),
    ] {
        let mut router = Router::new(&[config]).unwrap();
        let err = router.on_relation_live(native_relation()).unwrap_err();
        assert!(err.is_schema_mismatch(), "{err}");
        assert!(err.to_string().contains(&format!("`{column}`")), "{err}");
    }
    let missing = OutboxTableConfig {
        ttl_column: Some("nope".into()),
        ..native_config()
    };
    let mut router = Router::new(&[missing]).unwrap();
    assert!(matches!(
        router.on_relation_live(native_relation()),
        Err(RouteError::MissingColumn { .. })
    ));
}
