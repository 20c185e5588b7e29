//! The lean per-message publish path against real nats-servers the tests start: PubAcks with
//! sequence and duplicate flag, the header set on the wire, refusals (too large, no stream,
//! no permission), a server restart with publishes outstanding, and every way to authenticate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use bytes::Bytes;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::{PublishErrorKind, Publisher as _};
use relay_nats::{JetStreamPublisher, NatsSettings, StreamTakes};
use relay_testkit::{NatsOperator, NatsOptions, NatsServer};

const STREAM: &str = "OUTBOX";
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

fn event(id: &str, subject: &str, payload: &[u8]) -> Arc<OutboundMessage> {
    let tx: Vec<(Arc<str>, Arc<str>)> = vec![
        ("Outbox-Commit-Lsn".into(), "0/10".into()),
        ("Outbox-Table".into(), "public.outbox".into()),
    ];
    let mut headers = tx;
    headers.push(("Outbox-Tx-Index".into(), "0".into()));
    Arc::new(OutboundMessage {
        subject: subject.into(),
        event_id: id.into(),
        headers,
        shared_headers: 2,
        payload: Bytes::copy_from_slice(payload),
        table: "public.outbox".into(),
        commit_lsn: Lsn(0x10),
        commit_time_micros: 0,
    })
}

/// A publisher made as the relay makes it, on `settings`, with the stream created.
async fn publisher(settings: &NatsSettings) -> Result<JetStreamPublisher> {
    let connection = relay_nats::connect(settings).await?;
    let publisher = JetStreamPublisher::new(&connection, STREAM, ACK_TIMEOUT, 64);
    ensure!(publisher.publishes_lean(), "the lean path is on");
    publisher
        .context()
        .get_or_create_stream(async_nats::jetstream::stream::Config {
            name: STREAM.into(),
            subjects: vec!["outbox.>".into()],
            ..Default::default()
        })
        .await
        .context("creating the stream")?;
    Ok(publisher)
}

fn settings(url: String) -> NatsSettings {
    NatsSettings {
        url,
        ack_timeout: ACK_TIMEOUT,
        ..Default::default()
    }
}

#[tokio::test]
async fn pub_acks_carry_sequence_duplicate_and_the_relays_headers() -> Result<()> {
    let server = NatsServer::start().await?;
    let publisher = publisher(&settings(server.url())).await?;
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let ack = publisher.send(&event(id, "outbox.x", b"{}"), None).await?;
        // Every outstanding ack holds one of these: small, as on the async-nats path.
        assert!(
            std::mem::size_of_val(&*ack) <= 512,
            "ack future is {} bytes",
            std::mem::size_of_val(&*ack)
        );
        let receipt = ack.await?;
        assert_eq!(receipt.stream_seq, i as u64 + 1);
        assert!(!receipt.duplicate);
    }
    // The same event again: JetStream drops it by Nats-Msg-Id, and the stored copy matches.
    let again = publisher
        .resend(&event("b", "outbox.x", b"{}"), None)
        .await?
        .await?;
    assert_eq!((again.stream_seq, again.duplicate), (2, true));
    // A second row reusing the id with another payload: a collision, not a silent success.
    let collision = publisher
        .send(&event("b", "outbox.x", b"{\"other\":1}"), None)
        .await?
        .await
        .expect_err("a collision");
    assert_eq!(collision.kind, PublishErrorKind::Collision);
    // What is stored carries exactly the headers `headers()` returns.
    let msg = event("c", "outbox.x", b"{}");
    let stored = publisher
        .context()
        .get_stream(STREAM)
        .await?
        .get_raw_message(3)
        .await?;
    let expected = publisher.headers(&msg);
    let stored_headers = stored.headers;
    let mut got: Vec<(String, String)> = stored_headers
        .iter()
        .flat_map(|(n, vs)| vs.iter().map(move |v| (n.to_string(), v.to_string())))
        .collect();
    let mut want: Vec<(String, String)> = expected
        .iter()
        .flat_map(|(n, vs)| vs.iter().map(move |v| (n.to_string(), v.to_string())))
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(want.len(), 5);
    Ok(())
}

#[tokio::test]
async fn refusals_too_large_no_stream_and_no_permission() -> Result<()> {
    let config = "max_payload: 2048\nauthorization {\n  users = [\n    { user: \"relay\", password: \"pw\", permissions: { publish: { allow: [\">\"], deny: [\"outbox.secret\"] } } }\n  ]\n}\n";
    let server = NatsServer::start_with(NatsOptions {
        config: Some(config.into()),
        ..Default::default()
    })
    .await?;
    let mut settings = settings(server.url());
    settings.user = Some("relay".into());
    settings.password = Some("pw".into());
    let publisher = publisher(&settings).await?;
    // The lean connection's max_payload once it is up.
    publisher
        .send(&event("ok", "outbox.x", b"{}"), None)
        .await?
        .await?;
    assert_eq!(publisher.limits().max_payload, 2048);
    let big = publisher
        .send(&event("big", "outbox.x", &[b'x'; 4096]), None)
        .await
        .err()
        .context("too large is refused before sending")?;
    assert_eq!(big.kind, PublishErrorKind::Rejected);
    assert!(big.to_string().contains("too large"), "{big}");
    // A subject no stream captures: 503 no responders.
    let none = publisher
        .send(&event("none", "elsewhere.x", b"{}"), None)
        .await?
        .await
        .expect_err("no stream");
    assert_eq!(none.kind, PublishErrorKind::NoStream, "{none}");
    // A subject the user may not publish to: refused at once, naming the subject and the fix.
    let started = Instant::now();
    let denied = publisher
        .send(&event("secret", "outbox.secret", b"{}"), None)
        .await?
        .await
        .expect_err("denied");
    assert_eq!(denied.kind, PublishErrorKind::Rejected, "{denied}");
    let text = denied.to_string();
    assert!(
        text.contains("`outbox.secret`")
            && text.contains("grant the relay's NATS user publish permission"),
        "{text}"
    );
    assert!(started.elapsed() < ACK_TIMEOUT, "not after the ack timeout");
    // And the connection still publishes.
    let next = publisher
        .send(&event("after", "outbox.x", b"{}"), None)
        .await?
        .await?;
    assert_eq!(next.stream_seq, 2);
    Ok(())
}

#[tokio::test]
async fn a_server_restart_resolves_outstanding_acks_and_the_resend_dedupes() -> Result<()> {
    let mut server = NatsServer::start().await?;
    let publisher = publisher(&settings(server.url())).await?;
    publisher
        .send(&event("first", "outbox.x", b"{}"), None)
        .await?
        .await?;
    // Frozen: the publish goes out, no PubAck comes back.
    server.pause()?;
    wait_stopped(server.pid().context("a pid")?).await?;
    let ack = publisher
        .send(&event("second", "outbox.x", b"{}"), None)
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill9()?;
    let started = Instant::now();
    let lost = ack.await.expect_err("no ack from a killed server");
    assert_eq!(lost.kind, PublishErrorKind::Unknown, "{lost}");
    assert!(!lost.closed_by_server, "an outage is not a server close");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "at once, not after the ack timeout: {:?}",
        started.elapsed()
    );
    server.start_again().await?;
    // The re-send reconnects (waiting for the server) and is stored once.
    let mut receipt = None;
    for _ in 0..20 {
        match publisher
            .resend(&event("second", "outbox.x", b"{}"), None)
            .await
        {
            Ok(ack) => match ack.await {
                Ok(r) => {
                    receipt = Some(r);
                    break;
                }
                Err(e) => assert_ne!(e.kind, PublishErrorKind::Rejected, "{e}"),
            },
            Err(e) => assert_eq!(e.kind, PublishErrorKind::Unknown, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let receipt = receipt.context("stored after the restart")?;
    assert_eq!(receipt.stream_seq, 2, "{receipt:?}");
    let again = publisher
        .resend(&event("second", "outbox.x", b"{}"), None)
        .await?
        .await?;
    assert_eq!((again.stream_seq, again.duplicate), (2, true));
    let info = publisher
        .context()
        .get_stream(STREAM)
        .await?
        .info()
        .await?
        .state
        .messages;
    assert_eq!(info, 2, "each event stored once");
    Ok(())
}

/// Publishes event `id` with `settings` and checks it is stored as new.
async fn publishes_with(settings: &NatsSettings, id: &str) -> Result<()> {
    let publisher = publisher(settings).await?;
    let receipt = publisher
        .send(&event(id, "outbox.x", b"{}"), None)
        .await?
        .await?;
    ensure!(receipt.stream_seq >= 1 && !receipt.duplicate, "{receipt:?}");
    Ok(())
}

#[tokio::test]
async fn every_way_to_authenticate() -> Result<()> {
    let (seed, public) = relay_testkit::new_nkey_user()?;
    let config = format!(
        "authorization {{\n  users = [\n    {{ nkey: \"{public}\" }}\n    {{ user: \"relay\", password: \"pw\" }}\n  ]\n}}\n"
    );
    // TLS with a client certificate, NKey and user/password.
    let server = NatsServer::start_with(NatsOptions {
        tls: true,
        tls_verify_clients: true,
        config: Some(config),
        ..Default::default()
    })
    .await?;
    let ca = server.ca_cert_path().context("a CA")?.to_path_buf();
    let client = server.client_cert().context("a client certificate")?;
    let tls = |url: String| NatsSettings {
        tls_ca_file: Some(ca.clone()),
        tls_cert_file: Some(client.cert_path.clone()),
        tls_key_file: Some(client.key_path.clone()),
        tls_required: true,
        ..settings(url)
    };
    let mut nkey = tls(server.url());
    nkey.nkey_seed = Some(seed.as_str().into());
    publishes_with(&nkey, "nkey")
        .await
        .context("nkey over TLS")?;
    let mut password = tls(server.url());
    password.user = Some("relay".into());
    password.password = Some("pw".into());
    publishes_with(&password, "password")
        .await
        .context("user and password over TLS")?;
    // tls:// without tls_required.
    let mut scheme = tls(server.url().replace("nats://", "tls://"));
    scheme.tls_required = false;
    scheme.nkey_seed = Some(seed.as_str().into());
    publishes_with(&scheme, "scheme")
        .await
        .context("tls:// URL")?;

    // A token.
    let server = NatsServer::start_with(NatsOptions {
        config: Some("authorization { token: \"tok\" }\n".into()),
        ..Default::default()
    })
    .await?;
    let mut token = settings(server.url());
    token.token = Some("tok".into());
    publishes_with(&token, "token").await.context("token")?;

    // A .creds file in operator mode.
    let operator = NatsOperator::new("APP")?;
    let server = NatsServer::start_with(NatsOptions {
        config: Some(operator.server_config()),
        ..Default::default()
    })
    .await?;
    let dir = tempfile_dir("creds")?;
    let creds = dir.join("relay.creds");
    std::fs::write(&creds, operator.user_creds("relay", None)?)?;
    let mut jwt = settings(server.url());
    jwt.credentials_file = Some(creds);
    publishes_with(&jwt, "creds").await.context(".creds")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir(name: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("relay-nats-lean-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[tokio::test]
async fn a_refused_second_connection_falls_back_to_async_nats() -> Result<()> {
    // One connection allowed: async-nats' takes it, the lean one is refused.
    let server = NatsServer::start_with(NatsOptions {
        config: Some("max_connections: 1\n".into()),
        ..Default::default()
    })
    .await?;
    let publisher = publisher(&settings(server.url())).await?;
    let started = Instant::now();
    for (i, id) in ["a", "b"].iter().enumerate() {
        let receipt = publisher
            .send(&event(id, "outbox.x", b"{}"), None)
            .await?
            .await?;
        assert_eq!(receipt.stream_seq, i as u64 + 1);
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "no wait for a connection that cannot come: {:?}",
        started.elapsed()
    );
    assert!(
        !publisher.publishes_lean(),
        "the lean connection was refused"
    );
    Ok(())
}

/// Waits until process `pid` is stopped: SIGSTOP takes effect asynchronously.
async fn wait_stopped(pid: u32) -> Result<()> {
    for _ in 0..100 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // `pid (comm) state ...`: the state follows the last `)`.
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        if state.is_some_and(|s| s.starts_with('T')) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("nats-server {pid} did not stop")
}

/// A second client that sees the relay's publishes (a core subscriber of their subjects) and may
/// publish to `_INBOX.>` answers first with a PubAck of its own: one naming another stream is
/// refused on both publish paths, never counted as stored.
#[tokio::test]
async fn a_forged_pub_ack_naming_another_stream_is_refused() -> Result<()> {
    use futures::StreamExt as _;
    let server = NatsServer::start().await?;
    let forger = async_nats::connect(server.url()).await?;
    // The stream does not capture `forge.>`: the forger's answer is the only one.
    let mut seen = forger.subscribe("forge.>").await?;
    let answering = forger.clone();
    tokio::spawn(async move {
        while let Some(msg) = seen.next().await {
            if let Some(reply) = msg.reply {
                let _ = answering
                    .publish(
                        reply,
                        Bytes::from_static(br#"{"stream":"FORGED", "seq":1}"#),
                    )
                    .await;
            }
        }
    });
    forger.flush().await?;
    let lean = publisher(&settings(server.url())).await?;
    let client = async_nats::connect(server.url()).await?;
    let plain = JetStreamPublisher::with_default_limits(client, STREAM, ACK_TIMEOUT, 64);
    for (path, publisher) in [("lean", &lean), ("async-nats", &plain)] {
        let outcome = publisher
            .send(&event(&format!("forged-{path}"), "forge.x", b"{}"), None)
            .await?
            .await;
        let Err(error) = outcome else {
            panic!("{path}: a forged ack was taken for a stored message");
        };
        assert_eq!(error.kind, PublishErrorKind::Rejected, "{path}: {error}");
        assert!(
            error.message.contains("`FORGED`") && error.message.contains("docs/security.md"),
            "{path}: {error}"
        );
    }
    Ok(())
}

/// The same forger against the batch modes (where the server takes them): an atomic batch's
/// commit answer and a fast batch's PubAck naming another stream are refused, never counted as
/// the batch stored.
#[tokio::test]
async fn a_forged_batch_answer_naming_another_stream_is_refused() -> Result<()> {
    use futures::StreamExt as _;
    let server = NatsServer::start().await?;
    let forger = async_nats::connect(server.url()).await?;
    let mut seen = forger.subscribe("forge.>").await?;
    let answering = forger.clone();
    tokio::spawn(async move {
        while let Some(msg) = seen.next().await {
            let Some(reply) = msg.reply else { continue };
            let batch = msg
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Batch-Id"))
                .map_or_else(|| "fast".to_owned(), ToString::to_string);
            let forged = format!(r#"{{"stream":"FORGED","seq":2,"batch":"{batch}","count":2}}"#);
            let _ = answering.publish(reply, Bytes::from(forged)).await;
        }
    });
    forger.flush().await?;
    for mode in [
        relay_nats::PublishMode::AtomicBatch,
        relay_nats::PublishMode::FastBatch,
    ] {
        let publisher = publisher(&settings(server.url())).await?.with_publish_mode(
            mode,
            StreamTakes::BATCHES,
            64,
        );
        if !(publisher.framing().atomic_batches() || publisher.framing().fast_batches()) {
            eprintln!(
                "{mode:?}: nats-server {} has no such batches",
                server.version()
            );
            continue;
        }
        publisher.begin_transaction(Lsn(0x10));
        let mut acks = Vec::new();
        for n in 0..2 {
            let msg = event(&format!("forged-{mode:?}-{n}"), "forge.x", b"{}");
            acks.push(publisher.send(&msg, None).await?);
        }
        publisher.end_transaction();
        let first = acks.remove(0).await;
        let Err(error) = first else {
            panic!("{mode:?}: a forged answer was taken for a stored batch");
        };
        assert_eq!(error.kind, PublishErrorKind::Rejected, "{mode:?}: {error}");
        assert!(error.message.contains("`FORGED`"), "{mode:?}: {error}");
        for ack in acks {
            assert!(ack.await.is_err(), "{mode:?}: a member counted as stored");
        }
    }
    Ok(())
}
