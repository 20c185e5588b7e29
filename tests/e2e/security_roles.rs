//! The PostgreSQL role: the least-privilege role of docs/security.md works without
//! CREATE on the database, and a login refused while the relay runs stops it instead of a retry
//! loop (docs/security.md).

use anyhow::Result;

use crate::security::{EX_CONFIG, FAST, fast_exit, pg_config, secret_file};
use crate::support::*;

/// The least-privilege role of docs/security.md, without CREATE on the database: the checkpoint
/// table was made by an administrator (`migrations/`), so the relay only checks it. Missing
/// table or missing grants: exit 78 with the SQL that fixes it.
#[tokio::test(flavor = "multi_thread")]
async fn least_privilege_postgres_role_is_enough() -> Result<()> {
    let env = Env::start().await?;
    let admin = env.db().await?;
    // REPLICATION, SELECT on the outbox, a publication made beforehand by the table owner.
    admin
        .batch_execute(
            "CREATE ROLE outbox_relay LOGIN REPLICATION PASSWORD 'relay-pw-never-logged';
             GRANT SELECT ON public.outbox TO outbox_relay;
             CREATE PUBLICATION relay_pub FOR TABLE public.outbox WITH (publish = 'insert');",
        )
        .await?;
    let may_create: bool = admin
        .query_one(
            "SELECT has_database_privilege('outbox_relay', current_database(), 'CREATE')",
            &[],
        )
        .await?
        .get(0);
    assert!(!may_create, "the role must not have CREATE on the database");
    let pw_file = secret_file(&env, "relay-pw", "relay-pw-never-logged\n");
    let url = format!("postgres://outbox_relay@127.0.0.1:{}/{DB}", env.pg.port());
    let config = pg_config(
        &env,
        &env.config(""),
        &url,
        &format!(
            "create_publication = false\npassword_file = \"{}\"",
            pw_file.display()
        ),
    );

    // No checkpoint table, and no right to create it.
    admin
        .batch_execute("DROP SCHEMA outbox_relay CASCADE")
        .await?;
    fast_exit(
        &config,
        EX_CONFIG,
        &[
            "outbox_relay.checkpoint does not exist and cannot be created",
            "migrations/0002_relay_checkpoint.sql",
        ],
    )
    .await?;
    // Made by the administrator, but not granted.
    for sql in migrations() {
        admin.batch_execute(&sql).await?;
    }
    fast_exit(
        &config,
        EX_CONFIG,
        &["GRANT USAGE ON SCHEMA outbox_relay TO outbox_relay; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.checkpoint TO outbox_relay"],
    )
    .await?;
    // Granted only in part (SELECT): still not usable, and said so at start-up, not at the
    // first checkpoint write.
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA outbox_relay TO outbox_relay;
             GRANT SELECT ON outbox_relay.checkpoint TO outbox_relay;",
        )
        .await?;
    fast_exit(
        &config,
        EX_CONFIG,
        &["GRANT USAGE ON SCHEMA outbox_relay TO outbox_relay; GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.checkpoint TO outbox_relay"],
    )
    .await?;
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA outbox_relay TO outbox_relay;
             GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay.checkpoint TO outbox_relay;",
        )
        .await?;

    let relay = Relay::start_streaming(&config).await?;
    let id = insert_event(&admin, "Order", "Created", "{}").await?;
    wait_for_id(&env.jetstream().await?, &id, &relay).await?;
    let log = relay.log();
    assert!(!log.contains("relay-pw-never-logged"), "{log}");
    // Not granted the position map: said once, and checkpoints are stored without it.
    assert!(
        log.contains("the position map (outbox_relay.position_map) is not written"),
        "{log}"
    );
    let superuser: bool = admin
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = 'outbox_relay'",
            &[],
        )
        .await?
        .get(0);
    assert!(!superuser);
    Ok(())
}

/// A login refused after the relay has run (the password changed, or LOGIN revoked, then its
/// sessions terminated): a few quick attempts, then exit 78 naming the role and the server,
/// instead of retrying forever.
#[tokio::test(flavor = "multi_thread")]
async fn login_refused_while_running_stops_the_relay() -> Result<()> {
    let env = Env::start().await?;
    let admin = env.db().await?;
    let js = env.jetstream().await?;
    admin
        .batch_execute("CREATE ROLE rotating LOGIN SUPERUSER PASSWORD 'rotating-pw-1'")
        .await?;
    let pw_file = secret_file(&env, "rotating-secret", "rotating-pw-1\n");
    let url = format!("postgres://rotating@127.0.0.1:{}/{DB}", env.pg.port());
    let config = pg_config(
        &env,
        &env.config(""),
        &url,
        &format!("password_file = \"{}\"", pw_file.display()),
    );
    let target = format!("127.0.0.1:{}/{DB}", env.pg.port());
    let cases = [
        (
            "ALTER ROLE rotating PASSWORD 'rotating-pw-2'",
            "password authentication failed",
        ),
        ("ALTER ROLE rotating NOLOGIN", "not permitted to log in"),
    ];
    for (change, needle) in cases {
        let mut relay = Relay::start_streaming(&config).await?;
        let id = insert_event(&admin, "Order", "Created", "{}").await?;
        wait_for_id(&js, &id, &relay).await?;
        admin.batch_execute(change).await?;
        admin
            .batch_execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'rotating'",
            )
            .await?;
        let log = expect_exit(
            &mut relay,
            EX_CONFIG,
            FAST,
            &[
                needle,
                "refused the login of role `rotating`",
                &target,
                "3 of 3 attempts",
            ],
        )
        .await?;
        assert!(!log.contains("rotating-pw-"), "a password leaked:\n{log}");
        admin
            .batch_execute("ALTER ROLE rotating LOGIN PASSWORD 'rotating-pw-1'")
            .await?;
    }
    Ok(())
}
