//! The retention window the retention alerts stand on: how long a stopped relay has before
//! PostgreSQL invalidates its slot, as `validate --connect`, `status` and `/metrics` report it
//! against real servers. Numbers are checked, not only their presence: the WAL rate against
//! WAL actually written, the window against safe_wal_size / rate, and the gauges moving when
//! WAL is written behind a pinned slot. (`deploy.rs` checks the alert rules and the dashboard.)

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use relay_testkit::PgOptions;
use serde_json::Value;

use crate::support::*;

const MB: f64 = 1048576.0;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A server with `settings`, the relay's objects created by `setup --create-stream`, and a
/// table `pad` outside the publication to write WAL into.
async fn env_with(settings: &[(&str, &str)], extra: &str) -> Result<(Env, std::path::PathBuf)> {
    let env = Env::start_with_pg(PgOptions {
        settings: settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..PgOptions::default()
    })
    .await?;
    env.db()
        .await?
        .batch_execute("CREATE TABLE pad (id bigserial PRIMARY KEY, t text)")
        .await?;
    let config = env.config(extra);
    let out = relay_cmd(&config, &["setup", "--create-stream"]).await?;
    assert!(out.status.success(), "{}", describe(&out));
    Ok((env, config))
}

/// About `mb` MB of WAL into `pad` (rows of 1 kB, uncompressed).
async fn write_wal(db: &tokio_postgres::Client, mb: u32) -> Result<()> {
    for _ in 0..mb {
        db.execute(
            "INSERT INTO pad (t) SELECT repeat(md5(random()::text), 32) FROM generate_series(1, 1000)",
            &[],
        )
        .await?;
    }
    Ok(())
}

/// Writes WAL steadily (about 1 MB every 250 ms) until stopped.
struct WalWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl WalWriter {
    async fn start(env: &Env) -> Result<Self> {
        let db = env.db().await?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            while !flag.load(Ordering::Relaxed) {
                write_wal(&db, 1).await?;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(())
        });
        Ok(Self { stop, task })
    }

    async fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// `status --json` (which samples the WAL rate for 2 s).
async fn status_json(config: &Path) -> Result<Value> {
    let out = relay_cmd(config, &["status", "--json"]).await?;
    assert!(out.status.success(), "{}", describe(&out));
    serde_json::from_str(&stdout(&out)).with_context(|| describe(&out))
}

/// The line of `text` that starts with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?}:\n{text}"))
}

/// A size as the relay prints it (`512 bytes`, `1.5 MB`, `64 MB`) in bytes.
fn parse_size(text: &str) -> f64 {
    let mut parts = text.split_whitespace();
    let n: f64 = parts
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {text:?}"));
    let unit = match parts.next().map(|u| u.trim_end_matches("/s")) {
        Some("bytes") => 1.0,
        Some("kB") => 1024.0,
        Some("MB") => MB,
        Some("GB") => MB * 1024.0,
        other => panic!("unit {other:?} in {text:?}"),
    };
    n * unit
}

/// The text between `before` and the next `after` in `text`.
fn between<'a>(text: &'a str, before: &str, after: &str) -> &'a str {
    let start = text
        .find(before)
        .unwrap_or_else(|| panic!("{before:?} not in {text:?}"))
        + before.len();
    let len = text[start..]
        .find(after)
        .unwrap_or_else(|| panic!("{after:?} not after {before:?} in {text:?}"));
    &text[start..start + len]
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn bounded_retention_is_reported_with_its_numbers_and_warned() -> Result<()> {
    // No relay streams the slot here, so all WAL written stays behind it: a limit with room
    // for the ~10 s of writing below (64 MB would be used up and the slot `unreserved`).
    let (env, config) = env_with(&[("max_slot_wal_keep_size", "256MB")], "").await?;
    let limit = 256.0 * MB;

    // validate --connect while WAL is written: the rate of its 2 s sample must be the rate
    // the server really wrote at (measured here over the whole run; the writer's 1 MB steps
    // make a 2 s sample vary by about a sixth, so within a factor of 1.6, which a rate off by
    // 2x, e.g. bytes per sample, still fails).
    let writer = WalWriter::start(&env).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (from, started) = (env.current_wal().await?, Instant::now());
    let out = relay_cmd(&config, &["validate", "--connect"]).await?;
    let actual = (env.current_wal().await? - from) as f64 / started.elapsed().as_secs_f64();
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    let numbers = line(&text, "PASS  retention: ");
    assert!(
        numbers.starts_with("PASS  retention: max_slot_wal_keep_size 256 MB, safe_wal_size "),
        "{text}"
    );
    // "slot not streamed now", or on 17+ "slot inactive since <time> (<n> ago)".
    assert!(numbers.contains("(a 2s sample), slot "), "{text}");
    let safe = parse_size(between(numbers, "safe_wal_size ", ","));
    let rate = parse_size(between(numbers, "WAL rate ", " ("));
    assert!(safe > 0.0 && safe <= limit + 32.0 * MB, "{safe}: {text}");
    assert!(
        rate > actual / 1.6 && rate < actual * 1.6,
        "sampled {rate} B/s, the server wrote {actual} B/s: {text}"
    );
    // About safe / rate seconds, which is well under the default budget of an hour.
    let warn = line(&text, "WARN  retention window: about ");
    assert!(
        warn.ends_with("(a 2s sample)): shorter than [relay] takeover_budget (1h)"),
        "{text}"
    );
    let hint = text
        .lines()
        .skip_while(|l| !l.starts_with("WARN  retention window: "))
        .nth(1)
        .unwrap_or_default();
    assert!(
        hint.starts_with("      hint: set max_slot_wal_keep_size to at least the WAL written in [relay] takeover_budget (1h): ")
            && hint.contains("ALTER SYSTEM SET max_slot_wal_keep_size = '")
            && hint.contains("docs/operations.md, \"Retention window\""),
        "{text}"
    );
    // The default wal_sender_timeout of the test servers (10 s) + standby_poll_interval (1 s).
    assert!(
        text.contains(
            "within about 11s after the active relay's host vanished (wal_sender_timeout 10s + [relay] standby_poll_interval 1s"
        ),
        "{text}"
    );

    // status: the same window, as JSON with the numbers, and as text.
    let doc = status_json(&config).await?;
    let r = &doc["retention"];
    assert_eq!(f(&r["max_slot_wal_keep_size_bytes"]), limit, "{r}");
    assert_eq!(r["unbounded"], false, "{r}");
    assert_eq!(r["wal_rate"]["source"], "short_sample", "{r}");
    let over = f(&r["wal_rate"]["over_seconds"]);
    assert!((2.0..3.0).contains(&over), "{r}");
    let (safe, rate, seconds) = (
        f(&r["safe_wal_bytes"]),
        f(&r["wal_rate"]["bytes_per_second"]),
        f(&r["seconds"]),
    );
    assert!(rate > 100_000.0, "the writer writes ~4 MB/s: {r}");
    assert!(
        (seconds - safe / rate).abs() <= 0.01 * seconds + 0.01,
        "window = safe_wal_size / rate: {r}"
    );
    assert!(seconds < 3600.0, "{r}");
    assert_eq!(f(&r["takeover_budget_seconds"]), 3600.0, "{r}");
    assert_eq!(f(&r["takeover_seconds"]), 11.0, "{r}");
    assert_eq!(r["checks"][0]["check"], "retention window", "{r}");
    assert_eq!(r["checks"][0]["verdict"], "warn", "{r}");
    // safe_wal_size as PostgreSQL reports it, within the WAL written meanwhile.
    let pg_safe: i64 = env
        .db()
        .await?
        .query_one(
            "SELECT safe_wal_size FROM pg_replication_slots WHERE slot_name = 'relay_slot'",
            &[],
        )
        .await?
        .get(0);
    assert!(
        (pg_safe as f64 - safe).abs() < 48.0 * MB,
        "{pg_safe} vs {safe}"
    );

    let out = relay_cmd(&config, &["status"]).await?;
    writer.stop().await?;
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    assert!(
        line(&text, "retention window: ")
            .ends_with("before the slot is invalidated if the relay stops"),
        "{text}"
    );
    assert!(
        text.contains("\n  max_slot_wal_keep_size 256 MB, safe_wal_size "),
        "{text}"
    );
    assert!(
        text.contains("\n    WARN  retention window: about "),
        "{text}"
    );
    assert!(
        text.contains("\n          hint: set max_slot_wal_keep_size to at least"),
        "{text}"
    );

    // A budget that the window covers: no warning (the server is quiet again, so the window
    // is long, or there is no estimate at all).
    let short_budget = env.config("takeover_budget = \"1s\"");
    let out = relay_cmd(&short_budget, &["validate", "--connect"]).await?;
    let text = stdout(&out);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        line(&text, "PASS  retention window: ").contains("takeover_budget"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn unlimited_retention_is_reported_as_unbounded() -> Result<()> {
    let (env, base) = env_with(&[("max_slot_wal_keep_size", "-1")], "").await?;
    let out = relay_cmd(&base, &["validate", "--connect"]).await?;
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    assert!(
        line(&text, "PASS  retention: ")
            .starts_with("PASS  retention: max_slot_wal_keep_size -1 (unlimited), WAL rate "),
        "{text}"
    );
    assert!(
        text.contains(
            "WARN  retention window: unbounded: the slot keeps WAL until the disk fills (max_slot_wal_keep_size = -1)"
        ),
        "{text}"
    );
    assert!(
        text.contains("      hint: set max_slot_wal_keep_size to"),
        "{text}"
    );
    let postgres_18 = env.pg.version_num() >= 180000;
    if postgres_18 {
        assert!(
            text.contains("PASS  idle_replication_slot_timeout: 0 (off)"),
            "{text}"
        );
    } else {
        assert!(!text.contains("idle_replication_slot_timeout:"), "{text}");
    }

    let out = relay_cmd(&base, &["status"]).await?;
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        stdout(&out).contains(
            "retention window: unbounded: the slot keeps WAL until the disk fills (max_slot_wal_keep_size = -1)\n"
        ),
        "{}",
        describe(&out)
    );
    let doc = status_json(&base).await?;
    let r = &doc["retention"];
    assert_eq!(r["unbounded"], true, "{r}");
    assert!(r["seconds"].is_null(), "{r}");
    assert!(r["max_slot_wal_keep_size_bytes"].is_null(), "{r}");
    assert!(r["safe_wal_bytes"].is_null(), "{r}");

    // The running relay: a WAL rate and the budget, but no window and no limit.
    let (listen, addr) = http_listen();
    let config = env.config(&format!(
        "takeover_budget = \"90m\"\n{listen}sample_interval = \"200ms\"\n"
    ));
    let relay = Relay::start_streaming(&config).await?;
    let budget = wait_metric(
        &addr,
        "outbox_relay_takeover_budget_seconds",
        Duration::from_secs(15),
        |_| true,
    )
    .await;
    assert_eq!(budget, Some(5400.0), "{}", relay.log());
    let db = env.db().await?;
    let rate = wait_metric(
        &addr,
        "outbox_relay_wal_rate_bytes_per_second",
        Duration::from_secs(15),
        |v| v > 0.0,
    )
    .await;
    if rate.is_none_or(|v| v <= 0.0) {
        write_wal(&db, 1).await?;
    }
    let rate = wait_metric(
        &addr,
        "outbox_relay_wal_rate_bytes_per_second",
        Duration::from_secs(15),
        |v| v > 0.0,
    )
    .await;
    assert!(rate.is_some_and(|v| v > 0.0), "{rate:?}");
    let metrics = scrape(&addr).await?;
    for absent in [
        "outbox_relay_slot_retention_seconds",
        "outbox_relay_max_slot_wal_keep_size_bytes",
        "outbox_relay_slot_safe_wal_size_bytes",
    ] {
        assert!(!metrics.contains_key(absent), "{absent}: {metrics:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_metrics_follow_wal_traffic() -> Result<()> {
    let (env, _) = env_with(&[("max_slot_wal_keep_size", "64MB")], "").await?;
    let (listen, addr) = http_listen();
    let config = env.config(&format!(
        "takeover_budget = \"2h\"\n{listen}sample_interval = \"200ms\"\n"
    ));
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    insert_event(&db, "Order", "Created", "{}").await?;
    let t = Duration::from_secs(20);

    // Quiet: the relay's own checkpoints are about all the WAL there is.
    let retention = wait_metric(&addr, "outbox_relay_slot_retention_seconds", t, |v| v > 0.0)
        .await
        .with_context(|| format!("no retention window; log:\n{}", relay.log()))?;
    let m = scrape(&addr).await?;
    let get = |m: &std::collections::HashMap<String, f64>, k: &str| {
        m.get(k)
            .copied()
            .unwrap_or_else(|| panic!("{k} missing: {m:?}"))
    };
    assert_eq!(
        get(&m, "outbox_relay_max_slot_wal_keep_size_bytes"),
        64.0 * MB
    );
    assert_eq!(get(&m, "outbox_relay_takeover_budget_seconds"), 7200.0);
    let quiet_rate = get(&m, "outbox_relay_wal_rate_bytes_per_second");
    let quiet_safe = get(&m, "outbox_relay_slot_safe_wal_size_bytes");
    assert!(quiet_safe > 32.0 * MB, "{m:?}");
    // The window is safe_wal_size over the moving rate.
    let window = get(&m, "outbox_relay_slot_retention_seconds");
    assert!(
        (window - quiet_safe / quiet_rate).abs() <= 0.01 * window,
        "{window} vs {quiet_safe} / {quiet_rate}"
    );
    assert!(retention > 0.0);

    // An open transaction pins the slot's restart_lsn; 24 MB of WAL behind it use up
    // safe_wal_size, raise the rate and shorten the window.
    let mut pin = env.db().await?;
    let pin_tx = pin.transaction().await?;
    pin_tx
        .execute("INSERT INTO pad (t) VALUES ('pin')", &[])
        .await?;
    write_wal(&db, 24).await?;
    let safe = wait_metric(&addr, "outbox_relay_slot_safe_wal_size_bytes", t, |v| {
        v < quiet_safe - 12.0 * MB
    })
    .await;
    assert!(
        safe.is_some_and(|v| v < quiet_safe - 12.0 * MB),
        "safe_wal_size {safe:?}, was {quiet_safe}; log:\n{}",
        relay.log()
    );
    let m = scrape(&addr).await?;
    let busy_rate = get(&m, "outbox_relay_wal_rate_bytes_per_second");
    let busy_window = get(&m, "outbox_relay_slot_retention_seconds");
    assert!(
        busy_rate > quiet_rate + 50_000.0,
        "rate {busy_rate}, was {quiet_rate}"
    );
    assert!(
        busy_window < window / 2.0,
        "window {busy_window}, was {window}"
    );
    // The relay's own /status, through `status` (which finds it at [http] listen).
    let doc = status_json(&config).await?;
    let r = &doc["relay_status"]["postgres"]["retention"];
    assert_eq!(r["wal_rate"]["source"], "moving", "{r}");
    assert_eq!(r["slot_active"], true, "{r}");

    // Released: the slot moves on and safe_wal_size comes back.
    pin_tx.rollback().await?;
    // (A checkpoint logs the running transactions, which lets restart_lsn move.)
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        db.batch_execute("CHECKPOINT").await?;
        let now = metric(&addr, "outbox_relay_slot_safe_wal_size_bytes").await?;
        if now > quiet_safe - 8.0 * MB {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "safe_wal_size stayed at {now} after the pin was released; log:\n{}",
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_replication_slot_timeout_is_reported_on_postgres_18() -> Result<()> {
    let (_env, config) = match env_with(&[("idle_replication_slot_timeout", "30min")], "").await {
        Ok(pair) => pair,
        // PostgreSQL before 18 does not start with a setting it does not know.
        Err(e) if format!("{e:#}").contains("unrecognized configuration parameter") => {
            eprintln!(
                "this PostgreSQL has no idle_replication_slot_timeout (18+): skipped; run with `eval \"$(scripts/ensure-deps.sh --new-servers)\"` for PostgreSQL 18"
            );
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let out = relay_cmd(&config, &["validate", "--connect"]).await?;
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    // The slot made by `setup` has not been streamed: inactive since its creation (17+).
    let numbers = line(&text, "PASS  retention: ");
    let ago = between(numbers, "slot inactive since ", " ago)");
    assert!(ago.contains(" ("), "{text}");
    let warn = line(&text, "WARN  idle_replication_slot_timeout: ");
    assert!(
        warn.starts_with(
            "WARN  idle_replication_slot_timeout: 30m: a slot not streamed for that long is invalidated at the next checkpoint; the slot has been inactive, about 29m"
        ) && warn.ends_with("; shorter than [relay] takeover_budget (1h)"),
        "{text}"
    );
    assert!(
        line(&text, "WARN  retention window: unbounded: ").contains("max_slot_wal_keep_size = -1"),
        "{text}"
    );

    let doc = status_json(&config).await?;
    let r = &doc["retention"];
    assert_eq!(
        f(&r["idle_replication_slot_timeout_seconds"]),
        1800.0,
        "{r}"
    );
    assert!(r["inactive_since"].is_string(), "{r}");
    let inactive = f(&r["inactive_seconds"]);
    assert!((0.0..120.0).contains(&inactive), "{r}");
    // The idle timeout is what bounds the slot here.
    let idle = f(&r["idle_seconds"]);
    assert!((idle - (1800.0 - inactive)).abs() < 5.0, "{r}");
    assert!((f(&r["seconds"]) - idle).abs() < 1e-6, "{r}");
    assert_eq!(r["unbounded"], false, "{r}");
    let out = relay_cmd(&config, &["status"]).await?;
    let text = stdout(&out);
    assert!(
        text.contains("idle_replication_slot_timeout invalidates it in about 29m"),
        "{text}"
    );
    assert!(
        text.contains("\n    WARN  idle_replication_slot_timeout: 30m: "),
        "{text}"
    );
    Ok(())
}
