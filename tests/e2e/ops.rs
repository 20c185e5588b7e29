//! Operator surface against real servers: `validate --connect`, `setup`, `status`,
//! `config print`, `health`, and the HTTP endpoints (`/livez`, `/readyz`, `/metrics`,
//! `/status`) of a running relay, including readiness flipping while NATS is down.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Empty};

use crate::support::*;

mod durability;

const EX_DATA_SAFETY: i32 = 65;
const EX_UNAVAILABLE: i32 = 69;
const EX_CONFIG: i32 = 78;

/// Runs the binary with `args` (after `--config`), without the caller's RELAY_* overrides.
fn relay_cmd(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run outbox-relay")
}

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

/// The line of a preflight that starts with `verdict` and names `check`.
fn has_line(text: &str, verdict: &str, check: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(verdict) && l.contains(check))
}

/// GET `http://addr/path`: status and body.
pub(crate) async fn get(addr: &str, path: &str) -> Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header("host", addr)
        .body(Empty::<hyper::body::Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let code = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// Polls `path` until it answers `code`.
pub(crate) async fn wait_http(
    addr: &str,
    path: &str,
    code: u16,
    timeout: Duration,
    relay: &Relay,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = get(addr, path).await;
        if let Ok((c, body)) = &last
            && *c == code
        {
            return Ok(body.clone());
        }
        if Instant::now() > deadline {
            bail!(
                "{path} never answered {code} (last: {last:?}); relay log:\n{}",
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prometheus/OpenMetrics text → `name{labels}` → value. Checks every sample line parses.
fn parse_metrics(text: &str) -> Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("bad sample line {line:?}"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .with_context(|| format!("bad value in {line:?}"))?,
        };
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

fn metric(metrics: &BTreeMap<String, f64>, key: &str) -> f64 {
    *metrics
        .get(key)
        .unwrap_or_else(|| panic!("metric {key} missing; have {:?}", metrics.keys()))
}

#[tokio::test(flavor = "multi_thread")]
async fn validate_connect_then_setup_then_validate_passes() -> Result<()> {
    let env = Env::start().await?;
    // No create_stream, no slot yet, no publication: the preflight names the stream.
    let config = env.config_full("", "");
    let out = relay_cmd(&config, &["validate", "--connect"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(EX_CONFIG), "{}", describe(&out));
    for check in [
        "postgres connection",
        "wal_level",
        "max_replication_slots",
        "max_wal_senders",
        "role replication",
        "table public.outbox",
        "publication relay_pub",
        "slot relay_slot",
        "nats connection",
        "jetstream",
    ] {
        assert!(has_line(&text, "PASS", check), "PASS {check}:\n{text}");
    }
    assert!(has_line(&text, "FAIL", "stream OUTBOX"), "{text}");
    // Answers on the account's shared inbox prefix: said, with the fix.
    assert!(has_line(&text, "WARN", "nats inbox_prefix"), "{text}");
    assert!(
        text.contains("hint: JetStream stream `OUTBOX` does not exist"),
        "{text}"
    );

    // setup creates everything, twice is fine.
    let out = relay_cmd(&config, &["setup", "--create-stream"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    for line in [
        "created  publication relay_pub",
        "created  slot relay_slot",
        "created  checkpoint",
        "created  stream OUTBOX",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
    let out = relay_cmd(&config, &["setup", "--create-stream"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    assert!(!text.contains("created"), "idempotent:\n{text}");
    assert!(text.contains("ok       slot relay_slot"), "{text}");

    let out = relay_cmd(&config, &["validate", "--connect"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!text.contains("FAIL"), "{text}");
    for check in [
        "stream OUTBOX captures outbox.x.x",
        "stream OUTBOX storage",
        "stream OUTBOX duplicate_window",
        "stream OUTBOX discard",
        "slot relay_slot wal_status",
        "slot relay_slot position",
        "checkpoint table",
        "position map",
    ] {
        assert!(has_line(&text, "PASS", check), "PASS {check}:\n{text}");
    }
    assert!(text.contains("preflight passed"), "{text}");

    // A slot ahead of the checkpoint is a data-safety failure.
    env.db()
        .await?
        .batch_execute(
            "UPDATE outbox_relay.checkpoint SET confirmed_lsn = '0/1' WHERE slot_name = 'relay_slot'",
        )
        .await?;
    let out = relay_cmd(&config, &["validate", "--connect"]);
    assert_eq!(
        out.status.code(),
        Some(EX_DATA_SAFETY),
        "{}",
        describe(&out)
    );
    assert!(has_line(&stdout(&out), "FAIL", "slot relay_slot position"));
    let out = relay_cmd(&config, &["status"]);
    assert_eq!(
        out.status.code(),
        Some(EX_DATA_SAFETY),
        "{}",
        describe(&out)
    );
    assert!(stdout(&out).contains("SLOT AHEAD"), "{}", describe(&out));

    // Unreachable servers: 69, with a FAIL line each.
    let port = relay_testkit::free_port();
    let text = std::fs::read_to_string(&config)?
        .replace(&env.nats.url(), &format!("nats://127.0.0.1:{port}"))
        .replace(
            &format!(":{}/", env.pg.port()),
            &format!(":{}/", relay_testkit::free_port()),
        );
    let unreachable = env.dir.path().join("unreachable.toml");
    std::fs::write(&unreachable, text)?;
    let out = relay_cmd(&unreachable, &["validate", "--connect"]);
    assert_eq!(
        out.status.code(),
        Some(EX_UNAVAILABLE),
        "{}",
        describe(&out)
    );
    assert!(has_line(&stdout(&out), "FAIL", "postgres connection"));
    assert!(has_line(&stdout(&out), "FAIL", "nats connection"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn endpoints_metrics_status_and_readiness_follow_nats() -> Result<()> {
    let mut env = Env::start().await?;
    let addr = format!("127.0.0.1:{}", relay_testkit::free_port());
    let config = env.config(&format!(
        "[http]\nlisten = \"{addr}\"\nsample_interval = \"200ms\"\n"
    ));
    let relay = Relay::start(&config)?;
    let t = Duration::from_secs(15);
    wait_http(&addr, "/readyz", 200, t, &relay).await?;
    let (code, _) = get(&addr, "/livez").await?;
    assert_eq!(code, 200);

    let db = env.db().await?;
    for i in 0..3 {
        insert_event(&db, "Order", "Created", &format!("{{\"n\": {i}}}")).await?;
    }
    let js = env.jetstream().await?;
    let received = wait_for_messages(&js, 3, t, Some(&relay)).await?;
    let last_commit = received
        .iter()
        .filter_map(|m| {
            m.header("Outbox-Commit-Lsn")
                .parse::<relay_core::Lsn>()
                .ok()
        })
        .map(|lsn| lsn.0)
        .max()
        .expect("commit LSN headers");

    // Metrics: wait until the checkpoint and a slot sample are there, then check each family.
    let deadline = Instant::now() + t;
    let metrics = loop {
        let (code, body) = get(&addr, "/metrics").await?;
        assert_eq!(code, 200);
        let m = parse_metrics(&body)?;
        let published = m.get("outbox_relay_events_published_total").copied();
        let reserved = m
            .get("outbox_relay_slot_wal_status{status=\"reserved\"}")
            .copied();
        let lag = m.get("outbox_relay_slot_lag_bytes").copied();
        let last_seq = m.get("outbox_relay_stream_last_sequence").copied();
        // The checkpoint is stored after the acks (every checkpoint_interval): published can
        // reach 3 first.
        let checkpointed = m
            .get("outbox_relay_checkpoint_lsn")
            .is_some_and(|lsn| *lsn > last_commit as f64);
        if published == Some(3.0)
            && reserved == Some(1.0)
            && lag.is_some()
            && last_seq == Some(3.0)
            && checkpointed
        {
            break m;
        }
        if Instant::now() > deadline {
            bail!("metrics never settled:\n{body}\nlog:\n{}", relay.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(metric(&metrics, "outbox_relay_events_received_total"), 3.0);
    assert_eq!(metric(&metrics, "outbox_relay_outstanding_acks"), 0.0);
    assert_eq!(
        metric(&metrics, "outbox_relay_events_already_published_total"),
        0.0
    );
    assert_eq!(
        metric(&metrics, "outbox_relay_duplicates_acknowledged_total"),
        0.0
    );
    assert_eq!(
        metric(
            &metrics,
            "outbox_relay_publish_errors_total{kind=\"rejected\"}"
        ),
        0.0
    );
    assert_eq!(
        metric(&metrics, "outbox_relay_commit_to_ack_seconds_count"),
        3.0
    );
    assert_eq!(
        metric(
            &metrics,
            "outbox_relay_commit_to_ack_seconds_bucket{le=\"+Inf\"}"
        ),
        3.0
    );
    // Three real commit-to-ack latencies: more than nothing, less than the wait.
    let latency_sum = metric(&metrics, "outbox_relay_commit_to_ack_seconds_sum");
    assert!(
        latency_sum > 0.0 && latency_sum < 3.0 * t.as_secs_f64(),
        "{latency_sum}"
    );
    // The checkpoint moved over the traffic: past the last event's commit.
    assert!(
        metric(&metrics, "outbox_relay_checkpoint_lsn") > last_commit as f64,
        "checkpoint {} not past the last commit {last_commit}",
        metric(&metrics, "outbox_relay_checkpoint_lsn")
    );
    // restart_lsn <= confirmed_flush_lsn: the retained WAL covers at least the lag.
    let (lag, retained) = (
        metric(&metrics, "outbox_relay_slot_lag_bytes"),
        metric(&metrics, "outbox_relay_slot_retained_wal_bytes"),
    );
    assert!(
        lag >= 0.0 && retained >= lag,
        "lag {lag}, retained {retained}"
    );
    assert_eq!(
        metric(&metrics, "outbox_relay_slot_wal_status{status=\"lost\"}"),
        0.0
    );
    assert_eq!(metric(&metrics, "outbox_relay_stream_last_sequence"), 3.0);
    for dep in ["postgres", "nats", "stream"] {
        assert_eq!(
            metric(
                &metrics,
                &format!("outbox_relay_connected{{dependency=\"{dep}\"}}")
            ),
            1.0
        );
    }
    assert_eq!(
        metric(
            &metrics,
            "outbox_relay_reconnects_total{dependency=\"nats\"}"
        ),
        0.0
    );
    assert_eq!(metric(&metrics, "outbox_relay_ready"), 1.0);
    assert!(
        metrics
            .keys()
            .any(|k| k.starts_with("outbox_relay_build_info{version=")),
        "{:?}",
        metrics.keys()
    );

    // /status JSON.
    let (code, body) = get(&addr, "/status").await?;
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(status["pipeline"]["events_published"], 3, "{status}");
    assert_eq!(status["pipeline"]["last_stream_seq"], 3, "{status}");
    assert!(status["pipeline"]["last_acked_commit_time"].is_string());
    assert_eq!(
        status["postgres"]["slot_state"]["wal_status"], "reserved",
        "{status}"
    );

    // The status command, text and JSON, with the running relay's health.
    let out = relay_cmd(&config, &["status"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    for needle in [
        "slot relay_slot: wal_status reserved",
        "lag ",
        "checkpoint ",
        "stream OUTBOX: last sequence 3",
        &format!("relay {addr}: ready"),
    ] {
        assert!(text.contains(needle), "{needle}:\n{text}");
    }
    let out = relay_cmd(&config, &["status", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    assert_eq!(doc["stream_state"]["last_sequence"], 3, "{doc}");
    assert_eq!(doc["relay_status"]["ready"], true, "{doc}");
    assert!(doc["checkpoint"]["lsn"].is_string(), "{doc}");
    let out = relay_cmd(&config, &["health", "--ready"]);
    assert!(out.status.success(), "{}", describe(&out));

    // NATS goes away: not ready, with the reason; live all the same.
    env.nats.stop().await?;
    let body = wait_http(&addr, "/readyz", 503, t, &relay).await?;
    let doc: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(doc["ready"], false);
    assert!(body.contains("nats: not connected"), "{body}");
    assert_eq!(get(&addr, "/livez").await?.0, 200);
    let m = parse_metrics(&get(&addr, "/metrics").await?.1)?;
    assert_eq!(
        metric(&m, "outbox_relay_connected{dependency=\"nats\"}"),
        0.0
    );
    assert_eq!(metric(&m, "outbox_relay_ready"), 0.0);
    let out = relay_cmd(&config, &["health", "--ready"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));

    // And back.
    env.nats.start_again().await?;
    wait_http(&addr, "/readyz", 200, Duration::from_secs(20), &relay).await?;
    let m = parse_metrics(&get(&addr, "/metrics").await?.1)?;
    assert!(metric(&m, "outbox_relay_reconnects_total{dependency=\"nats\"}") >= 1.0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn config_print_redacts_secrets_and_names_sources() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        "[postgres]\nurl = \"postgres://relay:filesecret@db:5432/app\"\nslot = \"orders\"\n\n[http]\nlisten = \"0.0.0.0:9464\"\n",
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["--config"])
        .arg(&config)
        .args(["config", "print"])
        .env("RELAY_POSTGRES__PASSWORD", "envsecret")
        .env("RELAY_NATS__URL", "nats://broker:4222")
        .output()?;
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    assert!(
        !text.contains("filesecret") && !text.contains("envsecret"),
        "{text}"
    );
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("{key} missing:\n{text}"))
            .to_owned()
    };
    assert!(line("postgres.slot").ends_with(&format!("# file {}", config.display())));
    assert!(line("postgres.password").contains("<redacted>"));
    assert!(line("postgres.password").ends_with("# environment RELAY_POSTGRES__PASSWORD"));
    assert!(line("nats.url").contains("nats://broker:4222"));
    assert!(line("nats.stream").ends_with("# default"));
    assert!(line("http.listen").contains("0.0.0.0:9464"));
    assert!(line("outbox.0.table").contains("public.outbox"));
    Ok(())
}

/// `--version` names the version and the commit the binary was built from, which matches the
/// checkout's HEAD when built from one.
#[test]
fn version_names_the_commit_it_was_built_from() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--version")
        .output()?;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    let expected = format!("outbox-relay {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&expected), "{text}");
    let commit = text[expected.len()..].trim_end().trim_end_matches(')');
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()?;
    if head.status.success() {
        let head = String::from_utf8(head.stdout)?;
        assert_eq!(
            commit.trim_end_matches("-dirty"),
            head.trim(),
            "built from this checkout"
        );
    } else {
        assert_eq!(commit, "unknown", "no git: {text}");
    }
    Ok(())
}
