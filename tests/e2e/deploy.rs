//! Packaging is checked for syntax and for what operators rely on: the Kubernetes manifests
//! (one replica, Recreate, probes on the HTTP endpoints, a config map the relay accepts), the
//! systemd unit (Type=notify, the preflight, hardening; `systemd-analyze verify` where
//! available), and the compose/Docker health checks.

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
