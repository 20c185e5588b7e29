use relay_testkit::PostgresServer;

use super::*;

#[tokio::test]
async fn a_tables_columns_keys_identity_and_publication_are_read() {
    let pg = PostgresServer::start().await.unwrap();
    let client = pg.connect("postgres").await.unwrap();
    client
        .batch_execute(
            "CREATE TABLE shaped (id bigint PRIMARY KEY, event_id uuid NOT NULL UNIQUE, \
                                  note varchar(20), gone int, \
                                  twice int GENERATED ALWAYS AS (id * 2) STORED); \
             ALTER TABLE shaped DROP COLUMN gone; \
             CREATE TABLE unkeyed (event_id text, body text); \
             CREATE UNIQUE INDEX unkeyed_event ON unkeyed (event_id); \
             ALTER TABLE unkeyed REPLICA IDENTITY FULL; ",
        )
        .await
        .unwrap();
    let oid = |table: &'static str| {
        let client = &client;
        async move {
            client
                .query_one("SELECT $1::text::regclass::oid", &[&table])
                .await
                .unwrap()
                .get::<_, u32>(0)
        }
    };
    let (shaped, unkeyed) = (oid("shaped").await, oid("unkeyed").await);

    // Dropped and generated columns are left out; the primary key is the replica identity.
    let columns = columns(&client, shaped).await.unwrap();
    let names: Vec<_> = columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["id", "event_id", "note"]);
    let identity: Vec<_> = columns.iter().map(|c| c.in_replica_identity).collect();
    assert_eq!(identity, [true, false, false]);
    assert_eq!(columns[0].type_oid, 20, "bigint");
    assert_eq!(columns[2].type_modifier, 24, "varchar(20): 20 + 4");
    assert_eq!(replica_identity(&client, shaped).await.unwrap(), b'd' as i8);
    // FULL: every column is part of it.
    assert!(
        super::columns(&client, unkeyed)
            .await
            .unwrap()
            .iter()
            .all(|c| c.in_replica_identity)
    );
    assert_eq!(
        replica_identity(&client, unkeyed).await.unwrap(),
        b'f' as i8
    );

    // The primary key wins; without one, a unique index on the event id alone.
    let key = single_column_key(&client, shaped, "event_id")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((key.name.as_str(), key.type_sql.as_str()), ("id", "bigint"));
    assert!(key.primary && !key.nullable);
    let key = single_column_key(&client, unkeyed, "event_id")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(key.name, "event_id");
    assert!(!key.primary && key.nullable);
    assert_eq!(
        single_column_key(&client, unkeyed, "body").await.unwrap(),
        None
    );

    // Column lists and row filters came with PostgreSQL 15.
    if pg.version_num() >= 150_000 {
        client
            .batch_execute(
                "CREATE PUBLICATION shaped_pub FOR TABLE shaped (id, note) WHERE (id > 0)",
            )
            .await
            .unwrap();
        let (list, filter) = published_columns(&client, "shaped_pub", "public", "shaped")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(list, Some(vec!["id".to_owned(), "note".to_owned()]));
        assert_eq!(filter.as_deref(), Some("(id > 0)"));
        assert_eq!(
            published_columns(&client, "shaped_pub", "public", "unkeyed")
                .await
                .unwrap(),
            None
        );
    }
}
