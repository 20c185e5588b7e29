use super::*;

#[test]
fn a_page_behind_the_frontier_gives_its_cursor_once() {
    let progress = PageProgress::new(None, 10);
    progress.note_page(1, "k100".into(), 110);
    progress.note_page(2, "k200".into(), 210);
    progress.note_page(3, "k300".into(), 310);
    // The frontier jumped over page 1 to page 2: page 2's cursor, page 1 forgotten.
    assert_eq!(progress.take_page(2), Some(("k200".into(), 210)));
    assert_eq!(progress.take_page(1), None, "behind the cursor for good");
    assert_eq!(progress.take_page(3), Some(("k300".into(), 310)));
    assert_eq!(progress.take_page(4), None, "a page never read is unknown");
}

#[test]
fn complete_only_when_every_page_was_read_and_the_last_confirmed() {
    let progress = PageProgress::new(Some("k0".into()), 0);
    assert_eq!(progress.stored(), (Some("k0".into()), 0));
    progress.last_page.store(3, Ordering::Relaxed);
    assert!(!progress.complete_at(Lsn(3)), "pages remain to be read");
    progress.exhausted.store(true, Ordering::Relaxed);
    assert!(!progress.complete_at(Lsn(2)), "page 3 is not acknowledged");
    assert!(progress.complete_at(Lsn(3)));
}

/// The pages of a real table through the source, with rows left out by both skip sets, and the
/// cursor the store makes of the frontier's page numbers.
#[tokio::test]
async fn pages_of_a_table_become_transactions_and_the_frontier_the_cursor() {
    use relay_testkit::PostgresServer;

    use relay_postgres::PostgresSettings;

    use crate::{
        begin_page_snapshot, connect_reader, load_cursor, prepare_cursor_session, start_cursor,
        table_shape,
    };

    let pg = PostgresServer::start().await.unwrap();
    let setup = pg.connect("postgres").await.unwrap();
    setup
        .batch_execute(
            "CREATE TABLE outbox (id bigint PRIMARY KEY, event_id text NOT NULL, payload jsonb); \
             INSERT INTO outbox SELECT n, 'e' || n, '{}' FROM generate_series(1, 25) n; \
             CREATE PUBLICATION relay_pub FOR TABLE outbox;",
        )
        .await
        .unwrap();
    // Built field by field: a settings' `pinned` host is private to relay-postgres.
    let mut settings = PostgresSettings::default();
    settings.url = pg.url("postgres");
    settings.publication = "relay_pub".into();
    let reader = connect_reader(&settings).await.unwrap();
    let cursor_client = relay_postgres::connect(&settings).await.unwrap();
    prepare_cursor_session(&cursor_client).await.unwrap();
    let shape = table_shape(&reader, "public", "outbox", "event_id", "relay_pub")
        .await
        .unwrap();
    let end = shape.last_key(&reader, None).await.unwrap().unwrap();
    assert_eq!(end, "25");
    let id = CursorId {
        slot: settings.slot.clone(),
        table: shape.table.clone(),
        filter: String::new(),
    };
    start_cursor(&cursor_client, &id, &shape.key.name, Some(&end), Some(25))
        .await
        .unwrap();
    begin_page_snapshot(&reader).await.unwrap();

    // e7 is in the stream already, e13 was published by the relay meanwhile.
    let live = SharedIds::default();
    live.insert("e13");
    let progress = Arc::new(PageProgress::new(None, 0));
    let mut source = PageSource::start(
        PageReader {
            client: Arc::new(reader),
            shape: shape.clone(),
            filter: None,
            after: None,
            end,
            page_size: 10,
            rate: 0,
            rows_done: 0,
            skip: HashSet::from([id_digest("e7")]),
            live,
        },
        progress.clone(),
    );
    let mut events = Vec::new();
    while let Some(event) = source.next().await.unwrap() {
        events.push(event);
    }
    let commits: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Commit { end_lsn, .. } => Some(end_lsn.0),
            _ => None,
        })
        .collect();
    assert_eq!(commits, [1, 2, 3], "one transaction per page, numbered");
    let inserts = events
        .iter()
        .filter(|e| matches!(e, SourceEvent::Message(pgoutput::LogicalMessage::Insert(_))))
        .count();
    assert_eq!(inserts, 23, "25 rows, two of them known");
    assert!(
        matches!(
            events.get(1),
            Some(SourceEvent::Message(pgoutput::LogicalMessage::Relation(_)))
        ),
        "the Relation comes before the first row"
    );
    assert_eq!((progress.read(), progress.skipped()), (25, 2));
    assert!(!progress.complete_at(Lsn(2)) && progress.complete_at(Lsn(3)));

    // The frontier at page 2: the cursor is that page's last key and row count.
    let mut store = CursorStore::new(cursor_client, id.clone(), progress.clone());
    store.save(Lsn(2)).await.unwrap();
    let stored = load_cursor(&store.client, &id).await.unwrap().unwrap();
    assert_eq!(
        (stored.last_key.as_deref(), stored.rows_done),
        (Some("20"), 20)
    );
    assert_eq!(progress.stored(), (Some("20".into()), 20));
    // A page behind the cursor is never stored again.
    let behind = store.save(Lsn(1)).await.unwrap_err();
    assert_eq!(behind.class, ErrorClass::Fatal);
    store.save(Lsn(3)).await.unwrap();
    store.finish().await.unwrap();
    let finished = load_cursor(&store.client, &id).await.unwrap().unwrap();
    assert_eq!(
        (finished.last_key.as_deref(), finished.rows_done),
        (Some("25"), 25)
    );
    assert!(finished.finished_at.is_some(), "marked finished");
}
