//! Packaging is checked for syntax and for what operators rely on: the Kubernetes manifests
//! (one replica, Recreate, probes on the HTTP endpoints, a config map the relay accepts), the
//! systemd unit (Type=notify, the preflight, hardening; `systemd-analyze verify` where
//! available), the compose/Docker health checks, and the Prometheus rules and Grafana dashboard
//! in `deploy/` (they parse, and use only metrics a running relay exports).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use serde::Deserialize as _;
use serde_yaml_ng::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn validate_config(text: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, text)?;
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("--config")
        .arg(&path)
        .arg("validate")
        .env_remove("RELAY_CONFIG")
        .output()?;
    assert!(
        out.status.success(),
        "relay refuses the config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

#[test]
fn kubernetes_manifests_run_one_replica_with_probes() -> Result<()> {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/outbox-relay.yaml"))?;
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(Value::deserialize)
        .collect::<Result<_, _>>()?;
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let deployment = find("Deployment");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"].as_u64(), Some(1));
    assert_eq!(spec["strategy"]["type"].as_str(), Some("Recreate"));
    let container = &spec["template"]["spec"]["containers"][0];
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/livez")
    );
    assert_eq!(container["ports"][0]["containerPort"].as_u64(), Some(9464));
    let args = format!("{:?}", container["args"]);
    assert!(args.contains("/etc/outbox-relay/relay.toml"), "{args}");

    let config = find("ConfigMap")["data"]["relay.toml"]
        .as_str()
        .expect("relay.toml in the config map");
    assert!(config.contains("listen = \"0.0.0.0:9464\""));
    validate_config(config)?;
    assert_eq!(
        find("Service")["spec"]["ports"][0]["port"].as_u64(),
        Some(9464)
    );
    validate_config(&std::fs::read_to_string(repo().join("deploy/relay.toml"))?)?;
    Ok(())
}

#[test]
fn systemd_unit_is_hardened_notify_with_preflight() -> Result<()> {
    let unit = std::fs::read_to_string(repo().join("deploy/systemd/outbox-relay.service"))?;
    for line in [
        "Type=notify",
        "ExecStartPre=/usr/local/bin/outbox-relay validate --connect",
        "ExecStart=/usr/local/bin/outbox-relay run",
        "RestartPreventExitStatus=65 78",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "DynamicUser=yes",
        "CapabilityBoundingSet=",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing {line}");
    }
    // `systemd-analyze verify` where it exists, with the unit pointed at the built binary.
    let Ok(which) = Command::new("sh")
        .args(["-c", "command -v systemd-analyze"])
        .output()
    else {
        return Ok(());
    };
    if !which.status.success() {
        eprintln!("systemd-analyze not installed: syntax checked by the assertions only");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("outbox-relay.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/outbox-relay",
            env!("CARGO_BIN_EXE_outbox-relay"),
        ),
    )?;
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Complaints about this unit (other units of the host are not ours to judge).
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("outbox-relay.service"))
        .collect();
    assert!(ours.is_empty(), "systemd-analyze verify:\n{text}");
    Ok(())
}

#[test]
fn compose_and_docker_check_relay_health_over_http() -> Result<()> {
    let text = std::fs::read_to_string(repo().join("docker-compose.yml"))?;
    let doc: Value = serde_yaml_ng::from_str(&text)?;
    let relay = &doc["services"]["relay"];
    assert_eq!(
        relay["environment"]["RELAY_HTTP__LISTEN"].as_str(),
        Some("0.0.0.0:9464")
    );
    let test = format!("{:?}", relay["healthcheck"]["test"]);
    assert!(
        test.contains("health") && test.contains("--ready"),
        "{test}"
    );
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile"))?;
    assert!(dockerfile.contains("HEALTHCHECK"));
    assert!(dockerfile.contains("EXPOSE 9464"));
    Ok(())
}

/// The Dockerfile's instructions: continuation lines joined, comments left out.
fn dockerfile_instructions(text: &str) -> Vec<String> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    instructions
}

/// The image ships the release build, and the release profile leaves the debug info out (the
/// build fails if line tables are still in the binary).
#[test]
fn the_image_ships_the_release_binary_without_debug_info() -> Result<()> {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile"))?;
    let instructions = dockerfile_instructions(&dockerfile);
    let build = instructions
        .iter()
        .find(|i| i.starts_with("RUN cargo build"))
        .expect("a cargo build step");
    assert!(
        build.contains("--release") && build.contains("-p outbox-relay"),
        "{build}"
    );
    assert!(
        build.contains("! readelf -S --wide target/release/outbox-relay")
            && build.contains(r"grep -qE '\.debug_(info|line)'"),
        "the build checks the binary has no debug info: {build}"
    );
    assert!(
        instructions.iter().any(|i| i
            == "COPY --from=build /src/target/release/outbox-relay /usr/local/bin/outbox-relay"),
        "the image copies that binary: {instructions:?}"
    );
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml"))?;
    let release: Vec<&str> = cargo
        .split("\n[profile.release]\n")
        .nth(1)
        .expect("[profile.release]")
        .lines()
        .take_while(|l| !l.starts_with('['))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(release, ["debug = false", "strip = \"debuginfo\""]);
    Ok(())
}

/// Metric names in a PromQL expression: identifiers starting with `outbox_relay_` (label
/// values in quotes skipped), e.g. `outbox_relay_commit_to_ack_seconds_bucket`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = expr.chars().peekable();
    let mut word = String::new();
    let flush = |word: &mut String, names: &mut Vec<String>| {
        if word.starts_with("outbox_relay_") {
            names.push(std::mem::take(word));
        }
        word.clear();
    };
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                flush(&mut word, &mut names);
                // Skip the quoted text (backslash escapes included).
                while let Some(q) = chars.next() {
                    if q == '\\' {
                        chars.next();
                    } else if q == c {
                        break;
                    }
                }
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == ':' => word.push(c),
            _ => flush(&mut word, &mut names),
        }
    }
    flush(&mut word, &mut names);
    names
}

/// GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Whether `link` (`docs/x.md#anchor`) names an existing heading of an existing file.
fn link_resolves(link: &str) -> bool {
    let Some((file, fragment)) = link.split_once('#') else {
        return false;
    };
    let Ok(text) = std::fs::read_to_string(repo().join(file)) else {
        return false;
    };
    text.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .any(|a| a == fragment)
}

/// Every string under a key named `key`, anywhere in `value`.
fn strings_under<'a>(value: &'a serde_json::Value, key: &str, out: &mut Vec<&'a str>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match v {
                    serde_json::Value::String(s) if k == key => out.push(s),
                    _ => strings_under(v, key, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                strings_under(v, key, out);
            }
        }
        _ => {}
    }
}

#[test]
fn metric_names_are_found_in_promql() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(outbox_relay_commit_to_ack_seconds_bucket{instance=~"outbox_relay_x"}[5m]))) > 30 and outbox_relay_ready"#
        ),
        [
            "outbox_relay_commit_to_ack_seconds_bucket",
            "outbox_relay_ready"
        ]
    );
    assert_eq!(anchor(" Alerts and dashboard"), "alerts-and-dashboard");
    assert_eq!(anchor("Dead-letter subject"), "dead-letter-subject");
}

/// `deploy/prometheus/alerts.yml` and `deploy/grafana/outbox-relay.json` parse, every rule says
/// what to do (a summary, a description, a runbook link into the docs that resolves), and
/// every `outbox_relay_*` name either file uses is one a running relay exports, in the form it
/// exports it (`_total`, `_bucket`, `_sum`, `_count`). `promtool check rules` too, where it is
/// installed.
#[tokio::test(flavor = "multi_thread")]
async fn alert_rules_and_dashboard_use_only_exported_metrics() -> Result<()> {
    use std::collections::{BTreeMap, BTreeSet};

    use crate::support::{Env, Relay, http_listen, insert_event, scrape};

    // Where each name is used.
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();

    let rules_path = repo().join("deploy/prometheus/alerts.yml");
    let rules: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&rules_path)?)?;
    let groups = rules["groups"].as_sequence().expect("groups");
    assert!(!groups.is_empty());
    let mut alerts = BTreeSet::new();
    for group in groups {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            assert!(alerts.insert(name.to_owned()), "{name} twice");
            let expr = rule["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(
                !names.is_empty() || expr.contains("up{"),
                "{name} watches no relay metric: {expr}"
            );
            for n in names {
                used.entry(n).or_default().insert(format!("alert {name}"));
            }
            if let Some(duration) = rule.get("for") {
                let d = duration.as_str().unwrap_or_default();
                let (n, unit) = d.split_at(d.len().saturating_sub(1));
                assert!(
                    n.parse::<u32>().is_ok() && ["s", "m", "h"].contains(&unit),
                    "{name}: for: {d}"
                );
            }
            assert!(
                ["critical", "warning", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or_default()),
                "{name}: severity"
            );
            let notes = &rule["annotations"];
            for key in ["summary", "description"] {
                assert!(
                    notes[key].as_str().is_some_and(|s| s.len() > 10),
                    "{name}: annotation {key}"
                );
            }
            let runbook = notes["runbook_url"].as_str().unwrap_or_default();
            assert!(
                link_resolves(runbook),
                "{name}: runbook_url {runbook:?} names no heading"
            );
        }
    }
    for wanted in [
        "OutboxRelayDown",
        "OutboxRelaySlotLagBytes",
        "OutboxRelayDeliveryLag",
        "OutboxRelaySlotWalStatusNotReserved",
        "OutboxRelayFrontierStuck",
        "OutboxRelayDeadLettered",
        "OutboxRelayRetentionWindowNearlyUsed",
        "OutboxRelayRetentionWindowShort",
    ] {
        assert!(alerts.contains(wanted), "no {wanted}: {alerts:?}");
    }

    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        repo().join("deploy/grafana/outbox-relay.json"),
    )?)?;
    assert_eq!(dashboard["uid"], "outbox-relay");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut exprs = Vec::new();
    strings_under(&dashboard, "expr", &mut exprs);
    strings_under(&dashboard["templating"], "query", &mut exprs);
    assert!(exprs.len() >= panels.len(), "{} queries", exprs.len());
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            panel["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "panel {title} has no query"
        );
        let mut queries = Vec::new();
        strings_under(panel, "expr", &mut queries);
        for n in queries.iter().flat_map(|q| metric_names(q)) {
            used.entry(n).or_default().insert(format!("panel {title}"));
        }
    }
    for q in &exprs {
        for n in metric_names(q) {
            used.entry(n).or_default().insert("dashboard".into());
        }
    }
    // The dashboard covers what operators look at.
    let on_dashboard: BTreeSet<String> = exprs.iter().flat_map(|q| metric_names(q)).collect();
    for wanted in [
        "outbox_relay_events_published_total",
        "outbox_relay_outstanding_acks",
        "outbox_relay_slot_lag_bytes",
        "outbox_relay_slot_retention_seconds",
        "outbox_relay_events_dead_lettered_total",
        "outbox_relay_duplicates_acknowledged_total",
        "outbox_relay_reconnects_total",
    ] {
        assert!(on_dashboard.contains(wanted), "dashboard lacks {wanted}");
    }

    // A relay with a bounded slot (so the retention gauges exist), the audit on (so its
    // families exist) and some traffic.
    let env = Env::start_with_pg(relay_testkit::PgOptions {
        settings: vec![("max_slot_wal_keep_size".into(), "64MB".into())],
        ..Default::default()
    })
    .await?;
    let (listen, addr) = http_listen();
    let relay = Relay::start_streaming(&env.config(&format!(
        "replay_retention = \"16MB\"\naudit_interval = \"1h\"\n{listen}sample_interval = \"200ms\"\n"
    )))
    .await?;
    insert_event(&env.db().await?, "Order", "Created", "{}").await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let missing = loop {
        let exported: BTreeSet<String> = scrape(&addr)
            .await?
            .into_keys()
            .map(|k| k.split('{').next().unwrap_or_default().to_owned())
            .collect();
        let missing: Vec<(&String, &BTreeSet<String>)> = used
            .iter()
            .filter(|(n, _)| !exported.contains(*n))
            .collect();
        if missing.is_empty() || std::time::Instant::now() > deadline {
            break format!("{missing:?}\nexported: {exported:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        missing.starts_with("[]"),
        "names not exported by the relay: {missing}\nlog:\n{}",
        relay.log()
    );
    assert!(used.len() >= 20, "{} names used", used.len());

    let promtool = Command::new("sh")
        .args(["-c", "command -v promtool"])
        .output()?;
    if !promtool.status.success() {
        eprintln!("promtool not installed: `promtool check rules` skipped, rules checked above");
        return Ok(());
    }
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules_path)
        .output()?;
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
