//! Broker durability: `validate --connect`, `status` and the start-up log warn (with a hint) when
//! the stream has one replica or its servers do not sync each write before acknowledging
//! (`sync_interval: always`), and say "unknown" when the relay cannot read the setting.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use async_nats::jetstream::{self, stream};
use relay_testkit::{NatsCluster, NatsOptions, NatsServer};

use super::{describe, has_line, relay_cmd, stdout};
use crate::support::*;

const SERVER_NAME: &str = "relay-durability";

const R1: &str = "WARN  stream OUTBOX replicas: 1: each acknowledged event is on one server only; a failed disk, a corrupted file or (without `sync_interval: always`) a power loss of that server loses it\n      hint: run a JetStream cluster of 3 servers and `nats stream edit OUTBOX --replicas 3`";

const UNKNOWN_SYNC: &str = "WARN  stream OUTBOX server sync: unknown (no answer on $SYS.REQ.SERVER.PING.JSZ: the relay's account does not import it from the system account); nats-server's default is to sync every 2m after acknowledging, and then a power loss or OS crash of that server loses events acknowledged in that time\n      hint: make sure every nats-server holding the stream has `sync_interval: always` in its `jetstream {}` block (its monitoring endpoint shows it: /varz, jetstream.config.sync_always); to let the relay check, import the service $SYS.REQ.SERVER.PING.JSZ from the system account into the relay's account (docs/guarantees.md)";

/// The sync warning for [`SERVER_NAME`] at nats-server `version`'s default.
fn lazy_sync(version: &str) -> String {
    if before_2_10(version) {
        format!(
            "WARN  stream OUTBOX server sync: {SERVER_NAME} (nats-server {version}) syncs to disk every 1m, after acknowledging: a power loss or OS crash of that server loses events acknowledged in that time\n      hint: upgrade {SERVER_NAME} to nats-server 2.10 or later and set `sync_interval: always` in its `jetstream {{}}` block"
        )
    } else {
        format!(
            "WARN  stream OUTBOX server sync: {SERVER_NAME} (nats-server {version}) syncs to disk every 2m, after acknowledging: a power loss or OS crash of that server loses events acknowledged in that time\n      hint: set `sync_interval: always` in the `jetstream {{}}` block of {SERVER_NAME} and restart it"
        )
    }
}

fn before_2_10(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) < (2, 10)
}

/// Accounts where the relay's (no-auth) user may ask the system account's
/// `$SYS.REQ.SERVER.PING.JSZ`, as docs/guarantees.md describes; `sync_always` adds
/// `sync_interval: always`.
fn accounts_config(server_name: Option<&str>, sync_always: bool) -> String {
    let mut text = String::new();
    if let Some(name) = server_name {
        text.push_str(&format!("server_name: \"{name}\"\n"));
    }
    if sync_always {
        text.push_str("jetstream { sync_interval: always }\n");
    }
    text.push_str(
        r#"system_account: SYS
no_auth_user: relay
accounts {
  SYS: {
    users: [{ user: sys, password: sys }]
    exports: [{ service: "$SYS.REQ.SERVER.PING.JSZ", response: stream }]
  }
  APP: {
    jetstream: enabled
    users: [
      { user: relay, password: relay }
      # docs/security.md's least privilege: no $SYS.REQ.SERVER.PING.JSZ
      { user: limited, password: limited, permissions: {
          publish: ["outbox.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.OUTBOX"]
          subscribe: ["_INBOX.>"] } }
    ]
    imports: [{ service: { account: SYS, subject: "$SYS.REQ.SERVER.PING.JSZ" } }]
  }
}
"#,
    );
    text
}

async fn start_nats(config: String) -> Result<NatsServer> {
    NatsServer::start_with(NatsOptions {
        config: Some(config),
        ..NatsOptions::default()
    })
    .await
}

/// The version of the nats-server binary the tests use.
async fn nats_version() -> Result<String> {
    let server = NatsServer::start_with(NatsOptions {
        jetstream: false,
        ..NatsOptions::default()
    })
    .await?;
    Ok(server.version())
}

/// A file stream OUTBOX (`outbox.>`) with `replicas`, through the server at `url`.
async fn create_stream(url: &str, replicas: usize) -> Result<()> {
    let js = jetstream::new(async_nats::connect(url).await?);
    js.create_stream(stream::Config {
        name: STREAM.into(),
        subjects: vec!["outbox.>".into()],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await?;
    Ok(())
}

/// The env's relay config (create_stream etc.), pointed at the NATS server(s) `url`.
fn config_for(env: &Env, url: &str) -> Result<PathBuf> {
    config_with(env, url, "")
}

/// [`config_for`] with `nats_extra` lines in `[nats]`.
fn config_with(env: &Env, url: &str, nats_extra: &str) -> Result<PathBuf> {
    let base = env.config_full(&format!("create_stream = true\n{nats_extra}"), "");
    let text = std::fs::read_to_string(&base)?.replace(&env.nats.url(), url);
    let path = base.with_extension("nats.toml");
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The durability warnings of a `validate --connect` output: each `WARN  stream OUTBOX …` line
/// with its hint line.
fn validate_warnings(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("WARN  stream OUTBOX"))
        .map(|(i, l)| match lines.get(i + 1) {
            Some(hint) if hint.starts_with("      hint: ") => format!("{l}\n{hint}"),
            _ => (*l).to_owned(),
        })
        .collect()
}

/// The same warnings as `status` prints them (indented under the stream, without the name).
fn as_status(warning: &str) -> String {
    warning
        .replacen("WARN  stream OUTBOX ", "  WARN  ", 1)
        .replacen("\n      hint: ", "\n        hint: ", 1)
}

/// Runs `validate --connect` and `status` against `config`: both succeed, validate prints
/// exactly `expected` as durability warnings and status the same under the stream line.
fn assert_reports(config: &std::path::Path, expected: &[String], status_summary: &str) {
    let out = relay_cmd(config, &["validate", "--connect"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    assert_eq!(validate_warnings(&text), expected, "{text}");
    assert!(has_line(&text, "PASS", "stream OUTBOX storage"), "{text}");

    let out = relay_cmd(config, &["status"]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = stdout(&out);
    let summary = format!("stream OUTBOX: last sequence 0, 0 messages\n  {status_summary}\n");
    assert!(text.contains(&summary), "{summary}:\n{text}");
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  WARN  ") || l.starts_with("        hint: "))
        .collect();
    let wanted: Vec<String> = expected.iter().map(|w| as_status(w)).collect();
    assert_eq!(shown.join("\n"), wanted.join("\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn r1_stream_warns_about_replicas_and_server_sync() -> Result<()> {
    let env = Env::start().await?;
    let (lazy, always) = tokio::try_join!(
        start_nats(accounts_config(Some(SERVER_NAME), false)),
        async {
            // `sync_interval` exists since nats-server 2.10; 2.9 refuses the key.
            let version = nats_version().await?;
            if before_2_10(&version) {
                eprintln!("nats-server {version}: no sync_interval, the `always` case is skipped");
                return Ok(None);
            }
            start_nats(accounts_config(Some(SERVER_NAME), true))
                .await
                .map(Some)
        }
    )?;
    let version = lazy.version();

    // Plain server, R1: the relay's account cannot read the sync setting, so it is unknown.
    create_stream(&env.nats.url(), 1).await?;
    let config = config_for(&env, &env.nats.url())?;
    assert_reports(
        &config,
        &[R1.to_owned(), UNKNOWN_SYNC.to_owned()],
        "durability: file storage, 1 replica(s), persist_mode default, server sync unknown",
    );
    let out = relay_cmd(&config, &["status", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    let durability = &doc["stream_state"]["durability"];
    assert_eq!(durability["replicas"], 1, "{doc}");
    assert_eq!(durability["server_sync"]["mode"], "unknown", "{doc}");

    // sync_interval: always: only the R1 warning is left.
    if let Some(always) = always {
        create_stream(&always.url(), 1).await?;
        let config = config_for(&env, &always.url())?;
        assert_reports(
            &config,
            &[R1.to_owned()],
            "durability: file storage, 1 replica(s), persist_mode default, server sync always",
        );
        let text = stdout(&relay_cmd(&config, &["validate", "--connect"]));
        assert!(
            text.contains(&format!(
                "PASS  stream OUTBOX server sync: sync_interval: always, each write synced before the ack ({SERVER_NAME})"
            )),
            "{text}"
        );
    }

    // The relay's account imports the system account's JSZ: default sync, named with its interval.
    create_stream(&lazy.url(), 1).await?;
    let config = config_for(&env, &lazy.url())?;
    assert_reports(
        &config,
        &[R1.to_owned(), lazy_sync(&version)],
        "durability: file storage, 1 replica(s), persist_mode default, server sync interval",
    );
    // A user that may not ask: unknown, and said why.
    let limited = config_with(
        &env,
        &lazy.url(),
        "user = \"limited\"\npassword = \"limited\"",
    )?;
    assert_reports(
        &limited,
        &[
            R1.to_owned(),
            UNKNOWN_SYNC.replace(
                "no answer on $SYS.REQ.SERVER.PING.JSZ: the relay's account does not import it from the system account",
                "the relay's NATS user may not publish to $SYS.REQ.SERVER.PING.JSZ",
            ),
        ],
        "durability: file storage, 1 replica(s), persist_mode default, server sync unknown",
    );

    // The start-up log says the same, once each, with the hint.
    let relay = Relay::start(&config)?;
    relay
        .wait_log("JetStream stream ready", Duration::from_secs(30))
        .await?;
    let log = relay.log();
    let startup = |w: &str| {
        let (line, hint) = w
            .strip_prefix("WARN  stream OUTBOX ")
            .and_then(|w| w.split_once("\n      hint: "))
            .expect("a warning with a hint");
        let (aspect, detail) = line.split_once(": ").expect("aspect: detail");
        format!("stream `OUTBOX` {aspect}: {detail} (hint: {hint})")
    };
    for warning in [R1.to_owned(), lazy_sync(&version)] {
        assert_eq!(log.matches(&startup(&warning)).count(), 1, "{log}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn r3_cluster_with_sync_always_has_no_durability_warning() -> Result<()> {
    let version = nats_version().await?;
    if before_2_10(&version) {
        eprintln!("nats-server {version}: no sync_interval, skipped");
        return Ok(());
    }
    let env = Env::start().await?;
    let cluster = NatsCluster::start_with(
        3,
        NatsOptions {
            config: Some(accounts_config(None, true)),
            ..NatsOptions::default()
        },
    )
    .await?;
    create_stream(&cluster.urls()[0], 3).await?;
    let config = config_for(&env, &cluster.url())?;
    assert_reports(
        &config,
        &[],
        "durability: file storage, 3 replica(s), persist_mode default, server sync always",
    );
    let text = stdout(&relay_cmd(&config, &["validate", "--connect"]));
    assert!(text.contains("PASS  stream OUTBOX replicas: 3\n"), "{text}");
    let out = relay_cmd(&config, &["status", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out))?;
    let sync = &doc["stream_state"]["durability"]["server_sync"];
    assert_eq!(sync["mode"], "always", "{doc}");
    let mut servers: Vec<String> =
        serde_json::from_value(sync["servers"].clone()).unwrap_or_default();
    servers.sort();
    let mut names: Vec<String> = (0..3).map(|i| cluster.server_name(i).to_owned()).collect();
    names.sort();
    assert_eq!(servers, names, "{doc}");
    Ok(())
}
