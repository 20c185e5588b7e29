use super::*;
use crate::route::CloudEventsConfig;

#[test]
fn intervals_read_like_postgres_extract_epoch() {
    let s = |t: &str| interval_micros(t).map(|m| m as f64 / 1e6);
    assert_eq!(s("00:00:30"), Ok(30.0));
    assert_eq!(s("01:00:00"), Ok(3600.0));
    assert_eq!(s("100:00:00"), Ok(360_000.0));
    assert_eq!(s("00:00:00.5"), Ok(0.5));
    assert_eq!(s("3 days"), Ok(259_200.0));
    assert_eq!(s("1 day 02:00:00"), Ok(93_600.0));
    assert_eq!(s("-1 days +02:00:00"), Ok(-79_200.0));
    assert_eq!(s("-00:00:30"), Ok(-30.0));
    // EXTRACT(EPOCH FROM interval '1 year 2 mons') = 31557600 + 2 * 2592000
    assert_eq!(s("1 year 2 mons"), Ok(36_741_600.0));
    for bad in [
        "",
        "1",
        "1 hour",
        "P1D",
        "@ 1 hour",
        "00:61:00",
        "1:2:3.1234567",
        "x days",
    ] {
        assert!(interval_micros(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn ttls_are_whole_seconds_rounded_up() {
    assert_eq!(ttl_seconds(1_000_000), 1);
    assert_eq!(ttl_seconds(1_000_001), 2);
    assert_eq!(ttl_seconds(500_000), 1);
    assert_eq!(ttl_seconds(0), 0);
    assert_eq!(ttl_seconds(-1_500_000), -1);
}

#[test]
fn timestamptz_values_become_rfc3339_utc() {
    assert_eq!(
        timestamptz_rfc3339("2026-11-30 20:15:00.123456+00").as_deref(),
        Ok("2026-11-30T20:15:00.123456Z")
    );
    assert_eq!(
        timestamptz_rfc3339("2026-11-30 20:15:00+00").as_deref(),
        Ok("2026-11-30T20:15:00Z")
    );
    for bad in [
        "infinity",
        "-infinity",
        "2026-11-30 20:15:00+02",
        "2026-11-30 20:15:00",
        "0044-03-15 12:00:00+00 BC",
        "12026-01-01 00:00:00+00",
        "2026-13-01 00:00:00+00",
    ] {
        assert!(timestamptz_rfc3339(bad).is_err(), "{bad:?}");
    }
}

fn config() -> OutboxTableConfig {
    OutboxTableConfig::with_defaults("public.outbox")
}

#[test]
fn each_native_column_names_what_it_needs_from_the_broker() {
    let ce = CloudEventsConfig {
        source: "/orders".into(),
        type_column: "type".into(),
        time_column: None,
        subject_column: None,
    };
    let fine = OutboxTableConfig {
        ttl_column: Some("ttl".into()),
        schedule_column: Some("deliver_at".into()),
        schedule_subject: Some("outbox_schedules".into()),
        cloudevents: Some(ce),
        ..config()
    };
    assert_eq!(
        fine.broker_needs()
            .iter()
            .map(|n| (n.column.as_str(), n.feature))
            .collect::<Vec<_>>(),
        [
            ("ttl", BrokerFeature::MessageTtl),
            ("deliver_at", BrokerFeature::MessageSchedules)
        ]
    );
    assert_eq!(
        fine.schedule_sample().as_deref(),
        Some("outbox_schedules.x")
    );
    assert!(config().broker_needs().is_empty());
}
