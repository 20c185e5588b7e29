//! Locked-down PostgreSQL connections: TLS with verify-full, hostssl-only servers,
//! certificate name mismatches, wrong passwords, cleartext passwords, client-certificate login.
//! Each case ends in the documented outcome (docs/security.md). Roles: `security_roles.rs`;
//! NATS: `security_nats.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use relay_testkit::{NatsOptions, NatsServer, PgOptions, PgSecurity, PostgresServer, TestCa};

use crate::support::*;

pub(crate) const EX_CONFIG: i32 = 78;
/// A refusal is reported at once: no retry loop.
pub(crate) const FAST: Duration = Duration::from_secs(15);
/// The superuser's password in these tests: distinctive, so the logs can be searched for it.
const PG_SECRET: &str = "pg-S3cret-never-logged";

/// Servers for one test. With a custom pg_hba (the kit then administers over the unix socket),
/// the superuser's password becomes [`PG_SECRET`].
pub(crate) async fn secured_env(security: PgSecurity, nats: NatsOptions) -> Result<Env> {
    let own_hba = security.hba.is_some();
    let (pg, nats) = tokio::try_join!(
        PostgresServer::start_secured(PgOptions::default(), security),
        NatsServer::start_with(nats)
    )?;
    pg.create_database(DB).await?;
    let client = pg.connect(DB).await?;
    for sql in migrations() {
        client.batch_execute(&sql).await?;
    }
    if own_hba {
        client
            .batch_execute(&format!("ALTER ROLE postgres PASSWORD '{PG_SECRET}'"))
            .await?;
    }
    Ok(Env {
        pg,
        nats,
        dir: tempfile::tempdir()?,
    })
}

/// The test CA's certificate path of a TLS-enabled test PostgreSQL.
fn pg_ca(env: &Env) -> String {
    env.pg
        .ca_cert_path()
        .expect("TLS server has a CA")
        .display()
        .to_string()
}

/// `config` with `lines` added to its `[postgres]` section and its URL replaced by `url`.
pub(crate) fn pg_config(env: &Env, config: &Path, url: &str, lines: &str) -> PathBuf {
    let text = std::fs::read_to_string(config)
        .expect("read config")
        .replace(&env.pg.url(DB), url)
        .replacen("[postgres]\n", &format!("[postgres]\n{lines}\n"), 1);
    std::fs::write(config, text).expect("write config");
    config.to_path_buf()
}

pub(crate) fn secret_file(env: &Env, name: &str, contents: &str) -> PathBuf {
    let path = env.dir.path().join(name);
    std::fs::write(&path, contents).expect("write secret file");
    path
}

/// Starts the relay: it must exit with `code` within [`FAST`], say every needle, and never print
/// [`PG_SECRET`]. Returns the log.
pub(crate) async fn fast_exit(config: &Path, code: i32, needles: &[&str]) -> Result<String> {
    let log = expect_exit(&mut Relay::start(config)?, code, FAST, needles).await?;
    assert!(
        !log.contains(PG_SECRET),
        "the password leaked into the log:\n{log}"
    );
    Ok(log)
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_tls_verify_full_and_every_refusal_is_fast_and_clear() -> Result<()> {
    let env = secured_env(
        PgSecurity {
            tls: true,
            // Only the DNS name: connecting to 127.0.0.1 with verify-full is a name mismatch.
            tls_server_names: vec!["localhost".into()],
            hba: Some(
                "hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl all all ::1/128 scram-sha-256"
                    .into(),
            ),
        },
        NatsOptions::default(),
    )
    .await?;
    let ca = pg_ca(&env);
    let port = env.pg.port();
    let pw_file = secret_file(&env, "pg-password", &format!("{PG_SECRET}\n"));
    let by_name = format!("postgres://postgres@localhost:{port}/{DB}");
    let by_ip = format!("postgres://postgres@127.0.0.1:{port}/{DB}");

    // verify-full against the kit's CA, password from a file: events flow.
    let good = pg_config(
        &env,
        &env.config(""),
        &by_name,
        &format!(
            "sslmode = \"verify-full\"\nsslrootcert = \"{ca}\"\npassword_file = \"{}\"",
            pw_file.display()
        ),
    );
    let relay = Relay::start_streaming(&good).await?;
    let id = insert_event(&env.db().await?, "Order", "Created", r#"{"tls": true}"#).await?;
    wait_for_id(&env.jetstream().await?, &id, &relay).await?;
    assert!(!relay.log().contains(PG_SECRET), "{}", relay.log());
    // The relay's sessions really were encrypted.
    let plain: i64 = env
        .db()
        .await?
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.client_addr IS NOT NULL AND NOT s.ssl",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(plain, 0);
    drop(relay);

    // hostssl-only server, TLS off.
    let no_tls = pg_config(
        &env,
        &env.config(""),
        &by_name,
        &format!(
            "sslmode = \"disable\"\npassword_file = \"{}\"",
            pw_file.display()
        ),
    );
    fast_exit(
        &no_tls,
        EX_CONFIG,
        &["refused the connection", "no encryption"],
    )
    .await?;

    // Certificate name mismatch: the certificate names localhost, the URL 127.0.0.1.
    let mismatch = pg_config(
        &env,
        &env.config(""),
        &by_ip,
        &format!(
            "sslmode = \"verify-full\"\nsslrootcert = \"{ca}\"\npassword_file = \"{}\"",
            pw_file.display()
        ),
    );
    fast_exit(
        &mismatch,
        EX_CONFIG,
        &["TLS with PostgreSQL", "not valid for name"],
    )
    .await?;

    // A CA that did not sign the server's certificate.
    let other_ca = TestCa::new(env.dir.path(), "other")?;
    let wrong_ca = pg_config(
        &env,
        &env.config(""),
        &by_name,
        &format!(
            "sslmode = \"verify-ca\"\nsslrootcert = \"{}\"\npassword_file = \"{}\"",
            other_ca.cert_path().display(),
            pw_file.display()
        ),
    );
    fast_exit(
        &wrong_ca,
        EX_CONFIG,
        &["TLS with PostgreSQL", "invalid peer certificate"],
    )
    .await?;

    // Wrong password.
    let wrong_pw = secret_file(&env, "wrong-password", "not-it\n");
    let bad_login = pg_config(
        &env,
        &env.config(""),
        &by_name,
        &format!(
            "sslmode = \"verify-full\"\nsslrootcert = \"{ca}\"\npassword_file = \"{}\"",
            wrong_pw.display()
        ),
    );
    fast_exit(&bad_login, EX_CONFIG, &["password authentication failed"]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn cleartext_password_is_refused_unless_allowed() -> Result<()> {
    let env = secured_env(
        PgSecurity {
            hba: Some(
                "host all md5user 127.0.0.1/32 md5\nhost all all 127.0.0.1/32 password".into(),
            ),
            ..Default::default()
        },
        NatsOptions::default(),
    )
    .await?;
    let url = format!(
        "postgres://postgres:{PG_SECRET}@127.0.0.1:{}/{DB}",
        env.pg.port()
    );
    let refused = pg_config(&env, &env.config(""), &url, "");
    fast_exit(
        &refused,
        EX_CONFIG,
        &[
            "asked for a cleartext password",
            "scram-sha-256",
            "allow_insecure_password",
        ],
    )
    .await?;

    // An MD5-hashed password behind a pg_hba `md5` line: refused the same way.
    env.db()
        .await?
        .batch_execute(
            "SET password_encryption = 'md5'; \
             CREATE ROLE md5user LOGIN REPLICATION PASSWORD 'md5-pw-never-logged'",
        )
        .await?;
    let md5_url = format!(
        "postgres://md5user:md5-pw-never-logged@127.0.0.1:{}/{DB}",
        env.pg.port()
    );
    let md5 = pg_config(&env, &env.config(""), &md5_url, "");
    let log = fast_exit(
        &md5,
        EX_CONFIG,
        &["asked for an MD5 password", "scram-sha-256"],
    )
    .await?;
    assert!(!log.contains("md5-pw-never-logged"), "{log}");

    let allowed = pg_config(
        &env,
        &env.config(""),
        &url,
        "allow_insecure_password = true",
    );
    let relay = Relay::start_streaming(&allowed).await?;
    let id = insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    wait_for_id(&env.jetstream().await?, &id, &relay).await?;
    assert!(!relay.log().contains(PG_SECRET), "{}", relay.log());
    Ok(())
}

/// Client-certificate login (pg_hba `cert`, no password anywhere): the plain sessions and the
/// replication session both present the certificate. A certificate from another CA, or none:
/// exit 78 at once, naming postgres.sslcert.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_client_certificate_login() -> Result<()> {
    let env = secured_env(
        PgSecurity {
            tls: true,
            hba: Some("hostssl all all 127.0.0.1/32 cert".into()),
            ..Default::default()
        },
        NatsOptions::default(),
    )
    .await?;
    let ca = pg_ca(&env);
    let url = format!("postgres://postgres@localhost:{}/{DB}", env.pg.port());
    let tls = format!("sslmode = \"verify-full\"\nsslrootcert = \"{ca}\"");
    let with_cert = |cert: &relay_testkit::IssuedCert| {
        format!(
            "{tls}\nsslcert = \"{}\"\nsslkey = \"{}\"",
            cert.cert_path.display(),
            cert.key_path.display()
        )
    };

    // No client certificate configured.
    fast_exit(
        &pg_config(&env, &env.config(""), &url, &tls),
        EX_CONFIG,
        &["requires a valid client certificate", "postgres.sslcert"],
    )
    .await?;
    // A certificate for the right role, from a CA the server does not trust.
    let other_ca = TestCa::new(env.dir.path(), "other")?;
    let foreign = other_ca.issue_client(env.dir.path(), "foreign", "postgres")?;
    fast_exit(
        &pg_config(&env, &env.config(""), &url, &with_cert(&foreign)),
        EX_CONFIG,
        &[
            "rejected the client certificate postgres.sslcert",
            "foreign.crt",
        ],
    )
    .await?;

    // A certificate from the right CA for another role.
    let stranger = env.pg.issue_client_cert("someone_else")?;
    fast_exit(
        &pg_config(&env, &env.config(""), &url, &with_cert(&stranger)),
        EX_CONFIG,
        &["certificate authentication failed", "must be the role"],
    )
    .await?;

    let cert = env.pg.issue_client_cert("postgres")?;
    let good = pg_config(&env, &env.config(""), &url, &with_cert(&cert));
    let relay = Relay::start_streaming(&good).await?;
    let id = insert_event(&env.db().await?, "Order", "Created", r#"{"cert": true}"#).await?;
    wait_for_id(&env.jetstream().await?, &id, &relay).await?;
    // (walsenders, other sessions, sessions without the certificate) of the relay.
    let row = env
        .db()
        .await?
        .query_one(
            "SELECT count(*) FILTER (WHERE a.backend_type = 'walsender'), \
                    count(*) FILTER (WHERE a.backend_type <> 'walsender'), \
                    count(*) FILTER (WHERE s.client_dn IS DISTINCT FROM '/CN=postgres') \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'outbox-relay'",
            &[],
        )
        .await?;
    let (walsenders, plain, without): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert!(
        walsenders >= 1 && plain >= 1,
        "{walsenders} walsenders, {plain} plain sessions"
    );
    assert_eq!(without, 0, "every relay session presented the certificate");
    Ok(())
}
