use relay_testkit::PostgresServer;

use super::*;

#[tokio::test]
async fn ownership_and_privileges_are_read_for_the_current_role() {
    let pg = PostgresServer::start().await.unwrap();
    let admin = pg.connect("postgres").await.unwrap();
    admin
        .batch_execute(
            "CREATE ROLE cleaner LOGIN; \
             CREATE TABLE guarded (id bigint, status text, sent_at timestamptz); \
             GRANT SELECT, DELETE ON guarded TO cleaner; \
             GRANT UPDATE (status) ON guarded TO cleaner;",
        )
        .await
        .unwrap();
    assert_eq!(
        table_ownership(&admin, "public", "missing").await.unwrap(),
        None
    );
    let owned = table_ownership(&admin, "public", "guarded")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (owned.user.as_str(), owned.owner.as_str()),
        ("postgres", "postgres")
    );
    assert!(owned.acts_as_owner);

    admin.batch_execute("SET ROLE cleaner").await.unwrap();
    let theirs = table_ownership(&admin, "public", "guarded")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(theirs.oid, owned.oid);
    assert_eq!(
        (theirs.user.as_str(), theirs.owner.as_str()),
        ("cleaner", "postgres")
    );
    assert!(!theirs.acts_as_owner);
    assert!(may_select_and_delete(&admin, theirs.oid).await.unwrap());
    assert!(
        may_update_column(&admin, theirs.oid, "status")
            .await
            .unwrap()
    );
    assert!(
        !may_update_column(&admin, theirs.oid, "sent_at")
            .await
            .unwrap()
    );

    admin
        .batch_execute("RESET ROLE; REVOKE DELETE ON guarded FROM cleaner; SET ROLE cleaner")
        .await
        .unwrap();
    assert!(!may_select_and_delete(&admin, theirs.oid).await.unwrap());
}
