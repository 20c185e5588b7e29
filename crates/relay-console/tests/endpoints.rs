//! The `[http]` endpoints of a relay that was built and not run (building connects to nothing):
//! bound before it runs, a taken port is a configuration failure; served, they answer from the
//! relay's own telemetry, and they end with the relay.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use relay_console::Endpoints;
use relay_ops::client::get_text;
use relay_runtime::{FailureKind, Fleet, FleetConfig, RelayOptions};
use relay_telemetry::BuildInfo;

const WAIT: Duration = Duration::from_secs(5);

/// The fleet of `toml` (after an `[http] listen` section), built.
async fn fleet(listen: &str, toml: &str) -> Result<(Fleet, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("relay.toml");
    std::fs::write(&file, format!("[http]\nlisten = \"{listen}\"\n{toml}"))?;
    let config = FleetConfig::load(Some(&file), &[])?;
    let options = RelayOptions {
        accept_slot_position: false,
        build: BuildInfo {
            version: "1.2.3",
            commit: "0123456789ab",
        },
        sample: true,
    };
    let fleet = Fleet::build(config, options)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    Ok((fleet, dir))
}

const ONE: &str = "[postgres]\nslot = \"slot_endpoints\"\n[nats]\nstream = \"ENDPOINTS\"\n";

async fn relay(listen: &str) -> Result<(Fleet, tempfile::TempDir)> {
    fleet(listen, ONE).await
}

#[tokio::test]
async fn the_endpoints_answer_from_the_relays_telemetry_until_it_ended() -> Result<()> {
    let (relay, _dir) = relay("127.0.0.1:0").await?;
    let endpoints = Endpoints::bind(&relay.config().http)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?
        .context("[http] listen is set")?;
    let addr = endpoints.local_addr()?.to_string();
    endpoints.serve(relay.view(), relay.ended());

    let (code, body) = get_text(&addr, "/livez", WAIT).await?;
    ensure!(
        code == 200 && body == r#"{"live":true}"#,
        "/livez: {code} {body}"
    );
    // Not running: not streaming, NATS not connected.
    let (code, body) = get_text(&addr, "/readyz", WAIT).await?;
    ensure!(
        code == 503 && body.contains(r#""ready":false"#),
        "/readyz: {code} {body}"
    );
    let (code, body) = get_text(&addr, "/status", WAIT).await?;
    let status: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(code == 200, "/status: {code} {body}");
    ensure!(
        status["postgres"]["slot"] == "slot_endpoints",
        "/status: {body}"
    );
    ensure!(status["nats"]["stream"] == "ENDPOINTS", "/status: {body}");
    let (code, body) = get_text(&addr, "/metrics", WAIT).await?;
    ensure!(
        code == 200
            && body.contains(r#"outbox_relay_build_info{version="1.2.3",commit="0123456789ab"} 1"#),
        "/metrics: {code} {body}"
    );
    // The console is served only with `[http] console = true`.
    let (code, _) = get_text(&addr, "/console", WAIT).await?;
    ensure!(code == 404, "/console without [http] console: {code}");

    // The relay ends (here: dropped without running): so do its endpoints.
    let ended = relay.ended();
    drop(relay);
    ensure!(ended.is_cancelled(), "a dropped relay is not marked ended");
    let deadline = Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        ensure!(
            Instant::now() < deadline,
            "the endpoints still answer after their relay ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test]
async fn a_taken_port_is_a_configuration_failure_naming_it() -> Result<()> {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let listen = taken.local_addr()?.to_string();
    let (relay, _dir) = relay(&listen).await?;
    let failure = Endpoints::bind(&relay.config().http)
        .await
        .err()
        .context("bound a port that is taken")?;
    ensure!(failure.kind == FailureKind::Config, "{failure}");
    ensure!(
        failure
            .to_string()
            .starts_with(&format!("[http] listen: cannot listen on {listen}: ")),
        "{failure}"
    );
    Ok(())
}

#[tokio::test]
async fn a_fleets_endpoints_name_each_pipeline() -> Result<()> {
    let pipelines = "[[pipeline]]\nname = \"orders\"\n[pipeline.postgres]\nslot = \"orders\"\npublication = \"orders\"\n[pipeline.nats]\nstream = \"ORDERS\"\n\n[[pipeline]]\nname = \"billing\"\n[pipeline.postgres]\nslot = \"billing\"\npublication = \"billing\"\n[pipeline.nats]\nstream = \"BILLING\"\n";
    let (fleet, _dir) = fleet("127.0.0.1:0", pipelines).await?;
    let endpoints = Endpoints::bind(&fleet.config().http)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?
        .context("[http] listen is set")?;
    let addr = endpoints.local_addr()?.to_string();
    endpoints.serve(fleet.view(), fleet.ended());

    let (code, body) = get_text(&addr, "/readyz", WAIT).await?;
    ensure!(code == 503, "/readyz: {code} {body}");
    ensure!(
        body.contains("orders: postgres: slot `orders` is not streaming")
            && body.contains("billing: postgres: slot `billing` is not streaming"),
        "/readyz names each pipeline not ready: {body}"
    );
    let (code, body) = get_text(&addr, "/status", WAIT).await?;
    ensure!(code == 200, "/status: {code} {body}");
    let status: relay_runtime::fleet::FleetStatus = serde_json::from_str(&body)?;
    let names: Vec<&str> = status.pipelines.iter().map(|p| p.name.as_str()).collect();
    ensure!(names == ["billing", "orders"], "/status: {body}");
    ensure!(!status.ready, "/status: {body}");
    let orders = &status.pipelines[1];
    ensure!(
        orders.state == relay_runtime::fleet::PipelineState::Running
            && orders
                .relay
                .as_ref()
                .is_some_and(|r| r.nats.stream == "ORDERS"),
        "/status: {body}"
    );
    let (code, body) = get_text(&addr, "/status/billing", WAIT).await?;
    let one: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        code == 200 && one["postgres"]["slot"] == "billing",
        "/status/billing: {code} {body}"
    );
    let (code, body) = get_text(&addr, "/status/nope", WAIT).await?;
    ensure!(
        code == 404 && body.contains("no pipeline named `nope`"),
        "{code} {body}"
    );
    let (code, body) = get_text(&addr, "/metrics", WAIT).await?;
    ensure!(code == 200, "/metrics: {code}");
    for pipeline in ["orders", "billing"] {
        ensure!(
            body.contains(&format!(
                r#"outbox_relay_build_info{{pipeline="{pipeline}",version="1.2.3",commit="0123456789ab"}} 1"#
            )),
            "/metrics: {body}"
        );
    }
    ensure!(
        // OpenMetrics names an info family without its `_info` suffix.
        body.matches("# TYPE outbox_relay_build info").count() == 1,
        "each family described once: {body}"
    );
    Ok(())
}

const TWO: &str = "[[pipeline]]\nname = \"orders\"\n[pipeline.postgres]\nslot = \"orders\"\npublication = \"orders\"\n[pipeline.nats]\nstream = \"ORDERS\"\n\n[[pipeline]]\nname = \"billing\"\n[pipeline.postgres]\nslot = \"billing\"\npublication = \"billing\"\n[pipeline.nats]\nstream = \"BILLING\"\n";

/// The endpoints of the fleet (or relay) of `toml`, served; their address.
async fn served(toml: &str) -> Result<(String, Fleet, tempfile::TempDir)> {
    let (fleet, dir) = fleet("127.0.0.1:0", toml).await?;
    let endpoints = Endpoints::bind(&fleet.config().http)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?
        .context("[http] listen is set")?;
    let addr = endpoints.local_addr()?.to_string();
    endpoints.serve(fleet.view(), fleet.ended());
    Ok((addr, fleet, dir))
}

#[tokio::test]
async fn a_fleets_console_lists_each_pipeline_and_serves_each_ones_console_under_its_name()
-> Result<()> {
    let (addr, _fleet, _dir) = served(&format!("console = true\n{TWO}")).await?;

    let (code, body) = get_text(&addr, "/console", WAIT).await?;
    ensure!(
        code == 200 && body.contains("/console/fleet.js"),
        "/console is the fleet page: {code} {body}"
    );
    let (code, body) = get_text(&addr, "/console/api/fleet", WAIT).await?;
    ensure!(code == 200, "/console/api/fleet: {code} {body}");
    let listed: serde_json::Value = serde_json::from_str(&body)?;
    let rows = listed["pipelines"].as_array().context("pipelines")?;
    let names: Vec<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
    ensure!(names == ["billing", "orders"], "{body}");
    // Built, not run: nothing streams yet.
    for row in rows {
        ensure!(
            row["phase"] == "connecting" && row["ready"] == false,
            "{body}"
        );
        ensure!(row["events_published"] == 0, "{body}");
    }
    ensure!(
        rows[1]["href"] == "/console/p/orders/"
            && rows[1]["slot"] == "orders"
            && rows[1]["stream"] == "ORDERS",
        "{body}"
    );
    ensure!(listed["ready"] == false, "{body}");

    // Each pipeline's console reads its own relay under its base.
    for path in ["/console/p/orders/", "/console/p/orders"] {
        let (code, body) = get_text(&addr, path, WAIT).await?;
        ensure!(
            code == 200
                && body.contains(r#"data-base="/console/p/orders/""#)
                && body.contains(r#"<span id="pipeline-name">orders</span>"#),
            "{path}: {code} {body}"
        );
    }
    let (code, body) = get_text(&addr, "/console/p/orders/api/overview", WAIT).await?;
    let overview: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        code == 200
            && overview["status"]["postgres"]["slot"] == "orders"
            && overview["status"]["nats"]["stream"] == "ORDERS",
        "{code} {body}"
    );
    let (code, body) = get_text(&addr, "/console/p/billing/api/config", WAIT).await?;
    ensure!(
        code == 200 && body.contains(r#"["postgres.slot","\"billing\""]"#),
        "{code} {body}"
    );
    let (code, body) = get_text(&addr, "/console/p/billing/api/ready", WAIT).await?;
    ensure!(
        code == 503 && body.contains("slot `billing` is not streaming"),
        "{code} {body}"
    );
    // A sequence is read by its name beside the pipeline's.
    let (code, body) = get_text(&addr, "/console/p/billing/api/message/x", WAIT).await?;
    ensure!(code == 400 && body.contains("seq"), "{code} {body}");
    for path in [
        "/console/p/nope/",
        "/console/p/nope/api/overview",
        "/console/p/nope/api/ready",
    ] {
        let (code, body) = get_text(&addr, path, WAIT).await?;
        ensure!(
            code == 404 && body.contains("no pipeline named `nope`"),
            "{path}: {code} {body}"
        );
    }
    // A fleet's JSON is each pipeline's: there is no one relay's.
    let (code, _) = get_text(&addr, "/console/api/overview", WAIT).await?;
    ensure!(code == 404, "/console/api/overview in a fleet: {code}");
    let (code, body) = get_text(&addr, "/console/app.js", WAIT).await?;
    ensure!(code == 200 && body.contains("dataset.base"), "{code}");
    Ok(())
}

#[tokio::test]
async fn one_relays_console_keeps_its_paths() -> Result<()> {
    let (addr, _relay, _dir) = served(&format!("console = true\n{ONE}")).await?;
    let (code, body) = get_text(&addr, "/console", WAIT).await?;
    ensure!(
        code == 200
            && body.contains(r#"data-base="/console/""#)
            && body.contains(r#"data-ready="/readyz""#)
            && !body.contains("fleet.js"),
        "{code} {body}"
    );
    let (code, body) = get_text(&addr, "/console/api/overview", WAIT).await?;
    let overview: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        code == 200 && overview["status"]["postgres"]["slot"] == "slot_endpoints",
        "{code} {body}"
    );
    let (code, _) = get_text(&addr, "/console/api/fleet", WAIT).await?;
    ensure!(code == 404, "no fleet page for one relay: {code}");
    Ok(())
}
