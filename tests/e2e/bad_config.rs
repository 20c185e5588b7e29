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

/// The files `run` reads before it connects, `validate` without --connect reads too: a missing
/// or too short `[http] console_token_file`, a missing `[nats] password_file`. Each is refused
/// by both with exit 78 naming the setting; the file's good version passes `validate`.
#[tokio::test(flavor = "multi_thread")]
async fn offline_validate_refuses_the_files_run_refuses() -> Result<()> {
    let env = Env::start().await?;
    let dir = env.dir.path();
    let missing = dir.join("missing.secret");
    let short = dir.join("short.token");
    std::fs::write(&short, "short\n")?;
    let good = dir.join("good.token");
    std::fs::write(&good, "0123456789abcdef0123456789abcdef\n")?;
    let console = |token: &std::path::Path| {
        env.config(&format!(
            "[http]\nlisten = \"127.0.0.1:{}\"\nconsole = true\nconsole_token_file = \"{}\"\n",
            relay_testkit::free_port(),
            token.display()
        ))
    };
    let password = format!(
        "user = \"relay\"\npassword_file = \"{}\"\n",
        missing.display()
    );
    let cases = [
        (console(&missing), "console_token_file"),
        (console(&short), "at least 16 characters"),
        (env.config_full(&password, ""), "nats.password_file"),
    ];
    for (config, needle) in &cases {
        let out = relay_cmd(config, &["validate"]).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EX_CONFIG), "validate: {stderr}");
        assert!(
            stderr.contains(needle),
            "validate names {needle:?}: {stderr}"
        );
        assert!(!stderr.contains("configuration is valid"), "{stderr}");
        expect_exit(&mut Relay::start(config)?, EX_CONFIG, WITHIN, &[needle]).await?;
    }
    let out = relay_cmd(&console(&good), &["validate"]).await?;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
