//! Bad configuration or server state: a clear error naming the thing and the fix, and a
//! distinct non-zero exit code.

use std::time::Duration;

use anyhow::Result;

use crate::support::*;

const EX_UNAVAILABLE: i32 = 69;
const EX_CONFIG: i32 = 78;

/// Bad configuration is reported at start-up, without retries.
const WITHIN: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn bad_configuration_and_server_state_fail_fast_and_clearly() -> Result<()> {
    let env = Env::start().await?;

    // The stream is missing and may not be created (first: later cases create it).
    let no_stream = env.config_full("", "");
    expect_exit(
        &mut Relay::start(&no_stream)?,
        EX_CONFIG,
        WITHIN,
        &["stream `OUTBOX` does not exist", "create_stream"],
    )
    .await?;

    // A missing outbox table.
    let missing_table = env.config("[[outbox]]\ntable = \"public.nope\"\n");
    expect_exit(
        &mut Relay::start(&missing_table)?,
        EX_CONFIG,
        WITHIN,
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
        &mut Relay::start(&unreachable)?,
        EX_UNAVAILABLE,
        WITHIN,
        &["cannot connect to NATS", &port.to_string()],
    )
    .await?;

    // A typo in the file.
    let typo = env.dir.path().join("typo.toml");
    std::fs::write(&typo, "[postgres]\nslott = \"x\"\n")?;
    expect_exit(&mut Relay::start(&typo)?, EX_CONFIG, WITHIN, &["slott"]).await?;

    // A slot name that could inject SQL.
    let bad_slot = env.dir.path().join("bad_slot.toml");
    std::fs::write(&bad_slot, "[postgres]\nslot = \"x; DROP TABLE outbox\"\n")?;
    expect_exit(
        &mut Relay::start(&bad_slot)?,
        EX_CONFIG,
        WITHIN,
        &["slot name", "lower-case letters"],
    )
    .await?;
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
        &mut Relay::start(&env.config(""))?,
        EX_CONFIG,
        WITHIN,
        &["wal_level is `replica`", "wal_level = logical"],
    )
    .await?;
    Ok(())
}
