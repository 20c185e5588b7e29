//! `backfill` on a terminal shows a progress bar with rate and ETA instead of the progress
//! lines; with `--log-format json` (and off a terminal, the other tests) the lines stay. The
//! terminal is a pseudo-terminal from `script(1)`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Result, ensure};

use super::seed;
use crate::support::*;

/// Runs `backfill` with `args` on a pseudo-terminal; returns what the terminal showed.
fn on_a_terminal(config: &Path, args: &[&str]) -> Result<String> {
    let mut line = format!(
        "{} --config {}",
        env!("CARGO_BIN_EXE_outbox-relay"),
        config.display()
    );
    for a in args {
        line.push(' ');
        line.push_str(a);
    }
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("RUST_LOG", "warn")
        .output()?;
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "{line}: {:?}\n{shown}", out.status);
    Ok(shown)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_shows_a_bar_with_rate_and_eta_and_json_logs_keep_the_lines() -> Result<()> {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no script(1) for a pseudo-terminal");
        return Ok(());
    }
    let env = Env::start().await?;
    let db = env.db().await?;
    seed(&db, 2000, "created").await?;
    let config = env.config("");
    let _relay = Relay::start_streaming(&config).await?;

    let args = [
        "backfill",
        "--table",
        "outbox",
        "--rate",
        "800",
        "--progress-interval",
        "200ms",
    ];
    let bar = tokio::task::spawn_blocking({
        let config = config.clone();
        move || on_a_terminal(&config, &args)
    })
    .await??;
    assert!(bar.contains("ETA"), "a bar with an ETA: {bar}");
    assert!(bar.contains("rows ("), "{bar}");
    assert!(bar.contains("/s, ETA"), "a rate: {bar}");
    assert!(!bar.contains("in progress"), "no progress lines: {bar}");
    assert!(
        bar.contains("backfill public.outbox finished:"),
        "the final line: {bar}"
    );

    let lines = tokio::task::spawn_blocking({
        let config = config.clone();
        move || {
            on_a_terminal(
                &config,
                &[&["--log-format", "json"][..], &args, &["--restart"]].concat(),
            )
        }
    })
    .await??;
    assert!(
        lines.contains("backfill public.outbox in progress:"),
        "{lines}"
    );
    assert!(!lines.contains("ETA"), "no bar with json logs: {lines}");
    assert!(
        lines.contains("backfill public.outbox finished:"),
        "{lines}"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}
