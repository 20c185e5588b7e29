//! Locked-down connections (issue 4): PostgreSQL TLS with verify-full, hostssl-only servers,
//! certificate name mismatches, wrong passwords, cleartext passwords; NATS TLS with client
//! certificates, NKeys, user/password from a file, and a missing publish permission. Each case
//! ends in the documented outcome (docs/security.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use relay_testkit::{NatsOptions, NatsServer, PgOptions, PgSecurity, PostgresServer, TestCa};

use crate::support::*;

const EX_CONFIG: i32 = 78;
/// The superuser's password in these tests: distinctive, so the logs can be searched for it.
const PG_SECRET: &str = "pg-S3cret-never-logged";

/// Servers for one test. With a custom pg_hba (the kit then administers over the unix socket),
/// the superuser's password becomes [`PG_SECRET`].
async fn secured_env(security: PgSecurity, nats: NatsOptions) -> Result<Env> {
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

/// `config` with `lines` added to its `[postgres]` section and its URL replaced by `url`.
fn pg_config(env: &Env, config: &Path, url: &str, lines: &str) -> PathBuf {
    let text = std::fs::read_to_string(config)
        .expect("read config")
        .replace(&env.pg.url(DB), url)
        .replacen("[postgres]\n", &format!("[postgres]\n{lines}\n"), 1);
    std::fs::write(config, text).expect("write config");
    config.to_path_buf()
}

fn secret_file(env: &Env, name: &str, contents: &str) -> PathBuf {
    let path = env.dir.path().join(name);
    std::fs::write(&path, contents).expect("write secret file");
    path
}

/// Runs the relay, expects exit `code` within 20 s (fast: no retry loop) and every needle.
async fn expect_exit(config: &Path, code: i32, needles: &[&str]) -> Result<String> {
    let started = Instant::now();
    let mut relay = Relay::start(config)?;
    let status = relay.wait_exit(Duration::from_secs(20)).await?;
    let log = relay.log();
    assert_eq!(status.code(), Some(code), "exit code; log:\n{log}");
    for needle in needles {
        assert!(
            log.contains(needle),
            "log should mention {needle:?}:\n{log}"
        );
    }
    assert!(
        !log.contains(PG_SECRET),
        "the password leaked into the log:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
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
    let ca = env
        .pg
        .ca_cert_path()
        .expect("TLS server has a CA")
        .display()
        .to_string();
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
    let relay = Relay::start(&good)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    let id = insert_event(&env.db().await?, "Order", "Created", r#"{"tls": true}"#).await?;
    let got = wait_for_messages(
        &env.jetstream().await?,
        1,
        Duration::from_secs(20),
        Some(&relay),
    )
    .await?;
    assert_eq!(got[0].id(), id);
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
    expect_exit(
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
    expect_exit(
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
    expect_exit(
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
    expect_exit(&bad_login, EX_CONFIG, &["password authentication failed"]).await?;
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
    expect_exit(
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
    let log = expect_exit(
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
    let relay = Relay::start(&allowed)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    let id = insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    let got = wait_for_messages(
        &env.jetstream().await?,
        1,
        Duration::from_secs(20),
        Some(&relay),
    )
    .await?;
    assert_eq!(got[0].id(), id);
    assert!(!relay.log().contains(PG_SECRET), "{}", relay.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_tls_client_certs_nkeys_passwords_and_a_denied_publish() -> Result<()> {
    let (seed, public) = relay_testkit::new_nkey_user()?;
    // Least privilege (docs/security.md): the JetStream API calls the relay makes, the outbox
    // subjects, and replies on _INBOX.
    let relay_perms = r#"permissions: {
        publish: { allow: ["$JS.API.INFO", "$JS.API.STREAM.INFO.OUTBOX", "$JS.API.STREAM.CREATE.OUTBOX", "$JS.API.CONSUMER.CREATE.OUTBOX", "$JS.API.CONSUMER.CREATE.OUTBOX.>", "$JS.API.CONSUMER.MSG.NEXT.OUTBOX.*", "$JS.API.CONSUMER.INFO.OUTBOX.*", "$JS.API.CONSUMER.DELETE.OUTBOX.*", "outbox.Order.>"] }
        subscribe: { allow: ["_INBOX.>"] }
      }"#;
    let config = format!(
        "authorization {{\n  users = [\n    {{ nkey: \"{public}\", {relay_perms} }}\n    {{ user: \"relay2\", password: \"nats-pw-never-logged\", {relay_perms} }}\n    {{ user: \"relay3\", password: \"relay3\", permissions: {{ publish: [\"$JS.API.INFO\", \"$JS.API.STREAM.INFO.OUTBOX\", \"outbox.>\"], subscribe: [\"_INBOX.>\"] }} }}\n    {{ user: \"admin\", password: \"admin\" }}\n  ]\n}}\n"
    );
    let env = secured_env(
        PgSecurity::default(),
        NatsOptions {
            tls: true,
            tls_verify_clients: true,
            config: Some(config),
            ..Default::default()
        },
    )
    .await?;
    let ca = env.nats.ca_cert_path().expect("CA").display().to_string();
    let client = env.nats.client_cert().expect("client cert").clone();
    let tls_lines = format!(
        "tls_ca_file = \"{ca}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\ntls_required = true",
        client.cert_path.display(),
        client.key_path.display()
    );
    relay_nats::install_crypto_provider();
    let admin = async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin".into())
        .add_root_certificates(ca.clone().into())
        .add_client_certificate(client.cert_path.clone(), client.key_path.clone())
        .connect(env.nats.url())
        .await?;
    let js = async_nats::jetstream::new(admin);

    // Without the client certificate: refused (TLS verify), exit non-zero, clearly.
    let no_cert = env.config_full(
        &format!("create_stream = true\ntls_ca_file = \"{ca}\"\nnkey_seed = \"{seed}\""),
        "",
    );
    let mut relay = Relay::start(&no_cert)?;
    let status = relay.wait_exit(Duration::from_secs(20)).await?;
    assert_eq!(status.code(), Some(69), "{}", relay.log());
    assert!(
        relay.log().contains("cannot connect to NATS"),
        "{}",
        relay.log()
    );
    assert!(!relay.log().contains(&seed), "{}", relay.log());

    // TLS with a client certificate and an NKey seed from a file: events flow.
    let seed_file = secret_file(&env, "nkey.seed", &format!("{seed}\n"));
    let good = env.config_full(
        &format!(
            "create_stream = true\n{tls_lines}\nnkey_seed_file = \"{}\"",
            seed_file.display()
        ),
        "",
    );
    let relay = Relay::start(&good)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    let id = insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    let got = wait_for_messages(&js, 1, Duration::from_secs(20), Some(&relay)).await?;
    assert_eq!(got[0].id(), id);
    assert!(!relay.log().contains(&seed), "{}", relay.log());
    drop(relay);

    // User and password (from a file); an event on a subject the user may not publish to:
    // a clear fatal error instead of endless ack timeouts.
    let pw_file = secret_file(&env, "nats-password", "nats-pw-never-logged\n");
    let denied = env.config_full(
        &format!(
            "{tls_lines}\nuser = \"relay2\"\npassword_file = \"{}\"",
            pw_file.display()
        ),
        "",
    );
    let mut relay = Relay::start(&denied)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    insert_event(&env.db().await?, "Customer", "Registered", "{}").await?;
    let status = relay.wait_exit(Duration::from_secs(30)).await?;
    let log = relay.log();
    assert_eq!(status.code(), Some(65), "{log}");
    assert!(log.contains("Permissions Violation for Publish"), "{log}");
    assert!(log.contains("publish permission"), "{log}");
    assert!(!log.contains("nats-pw-never-logged"), "{log}");
    assert_eq!(stream_count(&js).await?, 1, "nothing more landed");

    // A JetStream API call the user may not make (the read-back consumer): the retried start-up
    // error names the subject and the fix.
    let no_consumer = env.config_full(
        &format!("{tls_lines}\nuser = \"relay3\"\npassword = \"relay3\""),
        "",
    );
    let relay = Relay::start(&no_consumer)?;
    relay
        .wait_log(
            "$JS.API.CONSUMER.CREATE.OUTBOX\"; allow that subject",
            Duration::from_secs(30),
        )
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn least_privilege_postgres_role_is_enough() -> Result<()> {
    let env = Env::start().await?;
    let admin = env.db().await?;
    // docs/security.md: REPLICATION, SELECT on the outbox, a publication made beforehand by the
    // table owner, CREATE on the database for the relay's own schema.
    admin
        .batch_execute(
            "DROP SCHEMA outbox_relay CASCADE;
             CREATE ROLE outbox_relay LOGIN REPLICATION PASSWORD 'relay-pw-never-logged';
             GRANT SELECT ON public.outbox TO outbox_relay;
             GRANT CREATE ON DATABASE app TO outbox_relay;
             CREATE PUBLICATION relay_pub FOR TABLE public.outbox WITH (publish = 'insert');",
        )
        .await?;
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
    let relay = Relay::start(&config)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    let id = insert_event(&admin, "Order", "Created", "{}").await?;
    let got = wait_for_messages(
        &env.jetstream().await?,
        1,
        Duration::from_secs(20),
        Some(&relay),
    )
    .await?;
    assert_eq!(got[0].id(), id);
    let log = relay.log();
    assert!(!log.contains("relay-pw-never-logged"), "{log}");
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

#[tokio::test(flavor = "multi_thread")]
async fn nats_token_from_a_file() -> Result<()> {
    let env = secured_env(
        PgSecurity::default(),
        NatsOptions {
            config: Some("authorization { token: \"tok-never-logged\" }\n".into()),
            ..Default::default()
        },
    )
    .await?;
    let wrong = secret_file(&env, "wrong-token", "not-the-token\n");
    let bad = env.config_full(
        &format!("create_stream = true\ntoken_file = \"{}\"", wrong.display()),
        "",
    );
    let log = expect_exit(&bad, 69, &["cannot connect to NATS"]).await?;
    assert!(!log.contains("not-the-token"), "{log}");

    let token = secret_file(&env, "token", "tok-never-logged\n");
    let good = env.config_full(
        &format!("create_stream = true\ntoken_file = \"{}\"", token.display()),
        "",
    );
    let relay = Relay::start(&good)?;
    relay
        .wait_log("replication started", Duration::from_secs(30))
        .await?;
    let id = insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    let client = async_nats::ConnectOptions::with_token("tok-never-logged".into())
        .connect(env.nats.url())
        .await?;
    let got = wait_for_messages(
        &async_nats::jetstream::new(client),
        1,
        Duration::from_secs(20),
        Some(&relay),
    )
    .await?;
    assert_eq!(got[0].id(), id);
    assert!(!relay.log().contains("tok-never-logged"), "{}", relay.log());
    Ok(())
}
