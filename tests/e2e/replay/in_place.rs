//! `replay` on an existing durable: reset in place where nats-server has the consumer reset API
//! (2.14+), keeping its configuration and creation time; deleted and re-created (with `--yes`)
//! on older servers. Run once per server: the default one and `RELAY_TEST_NATS_SERVER`.

use std::time::Duration;

use anyhow::{Result, ensure};
use async_nats::jetstream::{self, consumer};

use super::{describe, drain, insert, ok, relay_cmd, settled};
use crate::support::*;

/// Whether the server's INFO version is 2.14 or later, read here on its own terms.
pub(super) fn has_reset_api(js: &jetstream::Context) -> bool {
    let version = js.client().server_info().version;
    let mut parts = version.trim_start_matches('v').split('.');
    let major: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u64 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    major > 2 || (major == 2 && minor >= 14)
}

/// The stream sequence of the next message `name` delivers (acked).
async fn next_delivered(js: &jetstream::Context, name: &str) -> Result<u64> {
    crate::support::fetch_acked(js, name, 1)
        .await?
        .first()
        .copied()
        .ok_or_else(|| anyhow::anyhow!("{name} delivered nothing"))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_existing_consumer_is_reset_in_place_where_the_server_can_and_recreated_where_not()
-> Result<()> {
    let env = Env::start().await?;
    let config = env.config("");
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    insert(&db, 20, "n").await?;
    let js = env.jetstream().await?;
    let events = settled(&env, &js, 20, &relay).await?;
    let x = events[6].clone();
    let in_place = has_reset_api(&js);

    // A service's durable with settings of its own, that has read everything.
    let stream = js.get_stream(STREAM).await?;
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            description: Some("billing service".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(45),
            max_deliver: 7,
            max_ack_pending: 123,
            ..Default::default()
        })
        .await?;
    assert_eq!(drain(&js, "billing", 20).await?.len(), 20);
    let before = js
        .get_stream(STREAM)
        .await?
        .consumer_info("billing")
        .await?;

    let args = ["replay", "--from-lsn", &x.lsn_text, "--consumer", "billing"];
    let dry = ok(&config, &[&args[..], &["--dry-run"]].concat())?;
    let without_yes = relay_cmd(&config, &args);
    if in_place {
        assert!(dry.contains("replay would reset it in place"), "{dry}");
        ensure!(
            without_yes.status.success(),
            "in place needs no --yes: {}",
            describe(&without_yes)
        );
        let out = String::from_utf8_lossy(&without_yes.stdout);
        assert!(
            out.contains("reset durable consumer billing in place"),
            "{out}"
        );
        assert!(out.contains("consumer reset API"), "{out}");
    } else {
        assert!(
            dry.contains("replay would delete it and create it again"),
            "{dry}"
        );
        assert!(!without_yes.status.success(), "{}", describe(&without_yes));
        let err = String::from_utf8_lossy(&without_yes.stderr);
        assert!(err.contains("--yes"), "{err}");
        assert!(err.contains("no consumer reset API"), "{err}");
        let out = ok(&config, &[&args[..], &["--yes"]].concat())?;
        assert!(
            out.contains("deleted and re-created durable consumer billing"),
            "{out}"
        );
    }
    let after = js
        .get_stream(STREAM)
        .await?
        .consumer_info("billing")
        .await?;
    assert_eq!(after.config.description.as_deref(), Some("billing service"));
    assert_eq!(after.config.ack_wait, Duration::from_secs(45));
    assert_eq!(after.config.max_deliver, 7);
    assert_eq!(after.config.max_ack_pending, 123);
    if in_place {
        assert_eq!(
            after.config, before.config,
            "the configuration is kept whole"
        );
        assert_eq!(after.created, before.created, "the same consumer");
    } else {
        assert_ne!(after.created, before.created, "a new consumer");
    }
    assert_eq!(
        next_delivered(&js, "billing").await?,
        x.seq,
        "the next message is the one at the target sequence"
    );

    if in_place {
        // A consumer the server will not reset (deliver policy `new`): the error names the
        // consumer, the stream and the fix, and the consumer is left as it was.
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("fresh".into()),
                deliver_policy: consumer::DeliverPolicy::New,
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await?;
        let created = stream.consumer_info("fresh").await?.created;
        let refused = relay_cmd(
            &config,
            &["replay", "--from-lsn", &x.lsn_text, "--consumer", "fresh"],
        );
        assert_eq!(refused.status.code(), Some(78), "{}", describe(&refused));
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(err.contains("consumer fresh on stream"), "{err}");
        assert!(err.contains(STREAM), "{err}");
        assert!(err.contains("nats consumer rm"), "{err}");
        assert_eq!(stream.consumer_info("fresh").await?.created, created);
    }
    Ok(())
}
