//! Locked-down NATS connections: TLS with a custom CA and client certificates, NKeys,
//! user/password and tokens from files, `.creds` files in operator mode, and a missing publish
//! permission. Each case ends in the documented outcome (docs/security.md).

use std::time::Duration;

use anyhow::Result;
use relay_testkit::{NatsOperator, NatsOptions, PgSecurity, UserPermissions};

use crate::security::{secret_file, secured_env};
use crate::support::*;

/// Least privilege (docs/security.md): the JetStream API calls the relay makes; the outbox
/// subjects are added per test.
const RELAY_JS_API: [&str; 9] = [
    "$JS.API.INFO",
    "$JS.API.STREAM.INFO.OUTBOX",
    "$JS.API.STREAM.MSG.GET.OUTBOX",
    "$JS.API.STREAM.CREATE.OUTBOX",
    "$JS.API.CONSUMER.CREATE.OUTBOX",
    "$JS.API.CONSUMER.CREATE.OUTBOX.>",
    "$JS.API.CONSUMER.MSG.NEXT.OUTBOX.*",
    "$JS.API.CONSUMER.INFO.OUTBOX.*",
    "$JS.API.CONSUMER.DELETE.OUTBOX.*",
];

/// A refusal is reported at once: no retry loop.
const FAST: Duration = Duration::from_secs(15);
const WAIT: Duration = Duration::from_secs(30);

/// What the relay's user may publish: [`RELAY_JS_API`] and `outbox`.
fn relay_publish(outbox: &str) -> Vec<String> {
    RELAY_JS_API
        .iter()
        .copied()
        .chain([outbox])
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_tls_client_certs_nkeys_passwords_and_a_denied_publish() -> Result<()> {
    let (seed, public) = relay_testkit::new_nkey_user()?;
    // Least privilege: the JetStream API calls, the outbox subjects, replies on _INBOX.
    let relay_perms = format!(
        "permissions: {{\n  publish: {{ allow: {:?} }}\n  subscribe: {{ allow: [\"_INBOX.>\"] }}\n}}",
        relay_publish("outbox.Order.>")
    );
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
    let relay = Relay::start_streaming(&good).await?;
    let id = insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    let got = wait_for_messages(&js, 1, Duration::from_secs(20), Some(&relay)).await?;
    assert_eq!(got[0].id(), id);
    assert!(!relay.log().contains(&seed), "{}", relay.log());
    // The durability probe's $SYS request is optional in the permissions: refused, it makes the
    // server sync "unknown" (a warning with a hint), not an error about publish permission.
    assert!(
        !relay.log().contains("lacks publish permission"),
        "{}",
        relay.log()
    );
    assert!(
        relay
            .log()
            .contains("may not publish to $SYS.REQ.SERVER.PING.JSZ"),
        "{}",
        relay.log()
    );
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
    let mut relay = Relay::start_streaming(&denied).await?;
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
    let log = expect_exit(
        &mut Relay::start(&bad)?,
        69,
        FAST,
        &["cannot connect to NATS"],
    )
    .await?;
    assert!(!log.contains("not-the-token"), "{log}");

    let token = secret_file(&env, "token", "tok-never-logged\n");
    let good = env.config_full(
        &format!("create_stream = true\ntoken_file = \"{}\"", token.display()),
        "",
    );
    let relay = Relay::start_streaming(&good).await?;
    let id = insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    let client = async_nats::ConnectOptions::with_token("tok-never-logged".into())
        .connect(env.nats.url())
        .await?;
    wait_for_id(&async_nats::jetstream::new(client), &id, &relay).await?;
    assert!(!relay.log().contains("tok-never-logged"), "{}", relay.log());
    Ok(())
}

/// A `.creds` file (operator mode: the test kit signs the operator, account and user JWTs; the
/// server resolves accounts from memory): the relay publishes with it; an event on a subject the
/// user's JWT does not allow stops it with 65 naming the permission; a missing or garbled file is
/// exit 78 naming nats.credentials_file.
#[tokio::test(flavor = "multi_thread")]
async fn nats_creds_file_in_operator_mode() -> Result<()> {
    let operator = NatsOperator::new("APP")?;
    let env = secured_env(
        PgSecurity::default(),
        NatsOptions {
            config: Some(operator.server_config()),
            ..Default::default()
        },
    )
    .await?;
    let admin = async_nats::ConnectOptions::with_credentials(&operator.user_creds("admin", None)?)?
        .connect(env.nats.url())
        .await?;
    let js = async_nats::jetstream::new(admin);
    let creds = operator.user_creds(
        "relay",
        Some(&UserPermissions {
            publish: relay_publish("outbox.Order.>"),
            subscribe: vec!["_INBOX.>".into()],
        }),
    )?;
    let seed = creds
        .lines()
        .find(|l| l.starts_with("SU"))
        .unwrap_or_default()
        .to_owned();
    assert!(!seed.is_empty(), "the creds file holds a user seed");
    let creds_file = secret_file(&env, "relay.creds", &creds);
    let nats_lines = |path: &std::path::Path| {
        format!(
            "create_stream = true\ncredentials_file = \"{}\"",
            path.display()
        )
    };

    // A missing file and a garbled one: configuration errors, before anything connects.
    let missing = env.config_full(&nats_lines(&env.dir.path().join("nope.creds")), "");
    expect_exit(
        &mut Relay::start(&missing)?,
        78,
        FAST,
        &["nats.credentials_file", "nope.creds"],
    )
    .await?;
    let garbled_file = secret_file(&env, "garbled.creds", "not a creds file\n");
    let garbled = env.config_full(&nats_lines(&garbled_file), "");
    expect_exit(
        &mut Relay::start(&garbled)?,
        78,
        FAST,
        &["nats.credentials_file", "garbled.creds", "cannot parse"],
    )
    .await?;

    // The .creds file: events flow; an event the JWT may not publish stops the relay.
    let mut relay = Relay::start_streaming(&env.config_full(&nats_lines(&creds_file), "")).await?;
    let id = insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    let got = wait_for_messages(&js, 1, WAIT, Some(&relay)).await?;
    assert_eq!(got[0].id(), id);
    insert_event(&env.db().await?, "Customer", "Registered", "{}").await?;
    let log = expect_exit(
        &mut relay,
        65,
        WAIT,
        &[
            "Permissions Violation for Publish to \"outbox.Customer.Registered\"",
            "publish permission",
        ],
    )
    .await?;
    assert!(
        !log.contains(&seed),
        "the NKey seed leaked into the log:\n{log}"
    );
    assert_eq!(stream_count(&js).await?, 1, "nothing more landed");
    Ok(())
}
