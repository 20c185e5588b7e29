use relay_testkit::PostgresServer;

use super::*;
use crate::age_column::EpochUnit;

fn spec(column: &str, unit: Option<EpochUnit>, time_zone: Option<&str>) -> AgeSpec {
    AgeSpec {
        column: column.into(),
        unit,
        time_zone: time_zone.map(str::to_owned),
    }
}

#[tokio::test]
async fn the_age_columns_type_is_read_through_domains_and_judged() {
    let pg = PostgresServer::start().await.unwrap();
    let client = pg.connect("postgres").await.unwrap();
    client
        .batch_execute(
            "CREATE DOMAIN stamp AS timestamptz; \
             CREATE TABLE aged (at stamp, wall timestamp, ms bigint, gone int, note text); \
             ALTER TABLE aged DROP COLUMN gone;",
        )
        .await
        .unwrap();
    assert_eq!(
        column_base_type(&client, "public", "aged", "at")
            .await
            .unwrap(),
        Some((1184, "timestamp with time zone".to_owned()))
    );
    for (schema, table, column) in [
        ("public", "aged", "gone"),
        ("public", "aged", "nothing"),
        ("public", "nothing", "at"),
    ] {
        assert_eq!(
            column_base_type(&client, schema, table, column)
                .await
                .unwrap(),
            None
        );
        let missing = spec(column, None, None)
            .resolve(&client, schema, table)
            .await;
        assert!(matches!(missing, Ok(None)), "{table}.{column}: {missing:?}");
    }

    let resolve = |spec: AgeSpec| {
        let client = &client;
        async move {
            spec.resolve(client, "public", "aged")
                .await
                .unwrap()
                .unwrap()
        }
    };
    let instant = resolve(spec("at", None, None)).await.unwrap();
    assert_eq!(instant.kind, AgeKind::Instant);
    let epoch = resolve(spec("ms", Some(EpochUnit::Milliseconds), None))
        .await
        .unwrap();
    assert_eq!(epoch.type_sql, "bigint");
    let wall = resolve(spec("wall", None, Some("Europe/Berlin")))
        .await
        .unwrap();
    assert!(matches!(wall.kind, AgeKind::WallClock { .. }), "{wall:?}");
    // A zone PostgreSQL does not know is refused, naming it.
    let unknown = resolve(spec("wall", None, Some("Mars/Olympus")))
        .await
        .unwrap_err();
    assert!(
        unknown.contains("\"Mars/Olympus\" is not a time zone"),
        "{unknown}"
    );
    // A type that is not a time is refused by the judgement.
    assert!(resolve(spec("note", None, None)).await.is_err());
}
