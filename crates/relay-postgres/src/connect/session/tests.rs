use relay_testkit::{PostgresServer, free_port};

use super::*;

fn settings(url: String) -> PostgresSettings {
    PostgresSettings {
        url,
        connect_timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    }
}

#[tokio::test]
async fn plain_primary_and_observed_sessions_reach_the_server() {
    let pg = PostgresServer::start().await.unwrap();
    let plain = connect(&settings(pg.url("postgres"))).await.unwrap();
    let name: String = plain
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, "outbox-relay");

    // The first host is down: the primary is the second, and the settings come back bound to it.
    let down = free_port();
    let url = format!(
        "postgres://postgres:postgres@127.0.0.1:{down},127.0.0.1:{}/postgres",
        pg.port()
    );
    let given = settings(url);
    assert!(!given.is_pinned());
    let (client, bound) = connect_primary(&given).await.unwrap();
    assert!(bound.is_pinned());
    assert_eq!(bound.parts().unwrap().port, pg.port());
    assert_eq!(
        bound.display_target(),
        format!("127.0.0.1:{}/postgres", pg.port())
    );
    client.execute("SELECT 1", &[]).await.unwrap();

    // No host answers: transient, naming each host and why.
    let other = free_port();
    let none = settings(format!(
        "postgres://postgres:postgres@127.0.0.1:{down},127.0.0.1:{other}/postgres"
    ));
    let error = connect_primary(&none).await.unwrap_err();
    assert!(matches!(error, PgError::NoPrimary { .. }), "{error:?}");
    assert!(error.is_transient());
    let text = error.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{down}/postgres is unreachable"))
            && text.contains(&format!("127.0.0.1:{other}/postgres is unreachable")),
        "{text}"
    );

    let (observed, mut notices) = connect_with_notices(&settings(pg.url("postgres")))
        .await
        .unwrap();
    observed
        .batch_execute("DO $$ BEGIN RAISE WARNING 'watch this'; END $$")
        .await
        .unwrap();
    let notice = notices.recv().await.unwrap();
    assert_eq!(notice.message(), "watch this");
}

#[tokio::test]
async fn a_wrong_password_is_a_refusal_not_an_outage() {
    let pg = PostgresServer::start().await.unwrap();
    let refused = connect(&settings(
        pg.url("postgres").replace(":postgres@", ":wrong@"),
    ))
    .await
    .unwrap_err();
    assert!(matches!(refused, PgError::Connect { .. }), "{refused:?}");
    assert!(!refused.is_transient(), "{refused:?}");
}
