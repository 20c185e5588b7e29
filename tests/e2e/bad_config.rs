//! Bad configuration or server state: a clear error naming the thing and the fix, and a
//! distinct non-zero exit code.

use std::time::Duration;

use anyhow::Result;

use crate::support::*;

const EX_UNAVAILABLE: i32 = 69;
const EX_CONFIG: i32 = 78;

async fn expect_exit(config: &std::path::Path, code: i32, needles: &[&str]) -> Result<()> {
    let mut relay = Relay::start(config)?;
    let status = relay.wait_exit(Duration::from_secs(30)).await?;
    let log = relay.log();
    assert_eq!(status.code(), Some(code), "exit code; log:\n{log}");
    for needle in needles {
        assert!(
            log.contains(needle),
            "log should mention {needle:?}:\n{log}"
        );
    }
    assert!(!log.contains("panicked"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_configuration_and_server_state_fail_fast_and_clearly() -> Result<()> {
    let env = Env::start().await?;

    // The stream is missing and may not be created (first: later cases create it).
    let no_stream = env.config_full("", "");
    expect_exit(
        &no_stream,
        EX_CONFIG,
        &["stream `OUTBOX` does not exist", "create_stream"],
    )
    .await?;

    // A missing outbox table.
    let missing_table = env.config("[[outbox]]\ntable = \"public.nope\"\n");
    expect_exit(
        &missing_table,
        EX_CONFIG,
        &["public.nope", "does not exist"],
    )
    .await?;

    // NATS unreachable.
    let port = relay_testkit::free_port();
    let text = std::fs::read_to_string(env.config(""))?
        .replace(&env.nats.url(), &format!("nats://127.0.0.1:{port}"));
    let unreachable = env.dir.path().join("unreachable.toml");
    std::fs::write(&unreachable, text)?;
    expect_exit(
        &unreachable,
        EX_UNAVAILABLE,
        &["cannot connect to NATS", &port.to_string()],
    )
    .await?;

    // A typo in the file.
    let typo = env.dir.path().join("typo.toml");
    std::fs::write(&typo, "[postgres]\nslott = \"x\"\n")?;
    expect_exit(&typo, EX_CONFIG, &["slott"]).await?;

    // A slot name that could inject SQL.
    let bad_slot = env.dir.path().join("bad_slot.toml");
    std::fs::write(&bad_slot, "[postgres]\nslot = \"x; DROP TABLE outbox\"\n")?;
    expect_exit(&bad_slot, EX_CONFIG, &["slot name", "lower-case letters"]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn wal_level_replica_is_refused_with_the_fix() -> Result<()> {
    let env = Env::start_with_pg(relay_testkit::PgOptions {
        settings: vec![("wal_level".into(), "replica".into())],
        ..Default::default()
    })
    .await?;
    expect_exit(
        &env.config(""),
        EX_CONFIG,
        &["wal_level is `replica`", "wal_level = logical"],
    )
    .await?;
    Ok(())
}
