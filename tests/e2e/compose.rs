//! docker-compose.yml cannot be run here (no Docker engine): parse it and check that it wires
//! what the relay needs, and that the relay accepts its environment.

use std::path::Path;

use anyhow::Result;
use serde_yaml_ng::Value;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn command_text(service: &Value) -> String {
    match &service["command"] {
        Value::Sequence(parts) => parts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" "),
        Value::String(s) => s.clone(),
        _ => String::new(),
    }
}

#[test]
fn docker_compose_wires_postgres_nats_and_the_relay() -> Result<()> {
    let text = std::fs::read_to_string(repo().join("docker-compose.yml"))?;
    let doc: Value = serde_yaml_ng::from_str(&text)?;
    let services = &doc["services"];

    let pg = &services["postgres"];
    let pg_command = command_text(pg);
    assert!(pg_command.contains("wal_level=logical"), "{pg_command}");
    assert!(
        pg_command.contains("max_slot_wal_keep_size="),
        "{pg_command}"
    );
    let volumes = format!("{:?}", pg["volumes"]);
    assert!(
        volumes.contains("./migrations:/docker-entrypoint-initdb.d"),
        "{volumes}"
    );
    assert!(pg["healthcheck"]["test"].is_sequence());

    let nats = &services["nats"];
    assert!(command_text(nats).contains("-js"));
    assert!(format!("{:?}", nats["healthcheck"]).contains("js-enabled-only"));

    let relay = &services["relay"];
    assert_eq!(relay["build"].as_str(), Some("."));
    assert!(repo().join("Dockerfile").exists());
    for dep in ["postgres", "nats"] {
        assert_eq!(
            relay["depends_on"][dep]["condition"].as_str(),
            Some("service_healthy"),
            "relay waits for {dep}"
        );
    }
    let env = relay["environment"].as_mapping().expect("environment map");
    let url = env
        .get("RELAY_POSTGRES__URL")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(url.contains("@postgres:5432/app"), "{url}");

    // The relay accepts exactly this environment.
    let mut validate = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"));
    validate.arg("validate").env_remove("RELAY_CONFIG");
    for (k, v) in env {
        let (Some(k), Some(v)) = (k.as_str(), v.as_str()) else {
            continue;
        };
        if k.starts_with("RELAY_") {
            validate.env(k, v);
        }
    }
    let out = validate.output()?;
    assert!(
        out.status.success(),
        "relay refuses the compose environment: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("nats://nats:4222"), "{printed}");
    assert!(
        printed.contains("<redacted>"),
        "password redacted in the printed config"
    );
    Ok(())
}
