//! nats-server in operator mode with the kit's JWTs: a `.creds` user reaches JetStream, and a
//! user's publish permissions are enforced. Runs against whichever nats-server the kit finds
//! (2.9 from Debian and the current release in CI).

use std::time::Duration;

use async_nats::jetstream;
use relay_testkit::{NatsOperator, NatsOptions, NatsServer, UserPermissions};

#[tokio::test]
async fn creds_users_reach_jetstream_and_permissions_hold() -> anyhow::Result<()> {
    let operator = NatsOperator::new("APP")?;
    let server = NatsServer::start_with(NatsOptions {
        config: Some(operator.server_config()),
        ..Default::default()
    })
    .await?;

    // Without credentials the server refuses the connection.
    let anonymous = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(2));
    assert!(
        tokio::time::timeout(Duration::from_secs(10), anonymous.connect(server.url()))
            .await
            .map_or(true, |r| r.is_err()),
        "anonymous connection accepted in operator mode"
    );

    let admin = async_nats::ConnectOptions::with_credentials(&operator.user_creds("admin", None)?)?
        .connect(server.url())
        .await?;
    let js = jetstream::new(admin);
    js.create_stream(jetstream::stream::Config {
        name: "T".into(),
        subjects: vec!["t.>".into()],
        ..Default::default()
    })
    .await?;
    js.publish("t.1", "one".into()).await?.await?;

    let limited = UserPermissions {
        publish: vec!["t.allowed".into()],
        subscribe: vec!["_INBOX.>".into()],
    };
    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let user = async_nats::ConnectOptions::with_credentials(
        &operator.user_creds("limited", Some(&limited))?,
    )?
    .event_callback(move |event| {
        let errors_tx = errors_tx.clone();
        async move {
            if let async_nats::Event::ServerError(e) = event {
                let _ = errors_tx.send(e.to_string());
            }
        }
    })
    .connect(server.url())
    .await?;
    user.publish("t.denied", "x".into()).await?;
    user.flush().await?;
    let error = tokio::time::timeout(Duration::from_secs(10), errors.recv())
        .await?
        .unwrap_or_default();
    assert!(
        error.contains("Permissions Violation for Publish to \"t.denied\""),
        "{error}"
    );

    let mut stream = js.get_stream("T").await?;
    assert_eq!(stream.info().await?.state.messages, 1);
    let first = stream.get_raw_message(1).await?;
    assert_eq!(&first.payload[..], b"one");
    Ok(())
}
