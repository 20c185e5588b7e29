//! The assessment's judgement, without servers (the e2e `ops::durability` tests use real ones).

use std::collections::BTreeMap;

use super::probe::{JszAnswer, ServerSetting, judge, server_setting, version_before_2_10};
use super::*;

fn answer(text: &str) -> JszAnswer {
    serde_json::from_str(text).expect("answer")
}

fn assessment(replicas: usize, sync: Option<ServerSync>) -> Durability {
    Durability {
        stream: "OUTBOX".into(),
        storage: if sync.is_some() {
            Storage::File
        } else {
            Storage::Memory
        },
        replicas,
        async_persist: false,
        servers: vec!["n1".into()],
        sync,
    }
}

#[test]
fn reads_the_servers_sync_setting_by_version() {
    let lazy = answer(
        r#"{"server":{"name":"n1","ver":"2.12.1"},"data":{"config":{"sync_interval":120000000000}}}"#,
    );
    assert_eq!(
        server_setting(&lazy),
        ServerSetting::Every {
            interval: Duration::from_secs(120),
            configurable: true
        }
    );
    let always = answer(
        r#"{"server":{"name":"n1","ver":"2.15.1"},"data":{"config":{"sync_interval":120000000000,"sync_always":true}}}"#,
    );
    assert_eq!(server_setting(&always), ServerSetting::Always);
    let old = answer(r#"{"server":{"name":"n1","ver":"2.9.10"},"data":{"config":{}}}"#);
    assert_eq!(
        server_setting(&old),
        ServerSetting::Every {
            interval: Duration::from_secs(60),
            configurable: false
        }
    );
    let silent = answer(r#"{"server":{"name":"n1","ver":"2.11.0"},"data":{"config":{}}}"#);
    assert_eq!(server_setting(&silent), ServerSetting::Unreported);
    assert!(version_before_2_10("2.9.25"));
    assert!(!version_before_2_10("2.10.0-RC.1"));
    assert!(!version_before_2_10("3.0.0"));
}

#[test]
fn the_worst_server_holding_the_stream_decides() {
    let mut settings = BTreeMap::new();
    settings.insert(
        "n1".to_owned(),
        ("2.12.1".to_owned(), ServerSetting::Always),
    );
    settings.insert(
        "n2".to_owned(),
        (
            "2.12.1".to_owned(),
            ServerSetting::Every {
                interval: Duration::from_secs(120),
                configurable: true,
            },
        ),
    );
    let expected = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        judge(&expected(&["n1"]), &settings),
        ServerSync::Always {
            servers: vec!["n1".into()]
        }
    );
    assert!(matches!(
        judge(&expected(&["n1", "n2"]), &settings),
        ServerSync::Interval { servers } if servers.len() == 1 && servers[0].name == "n2"
    ));
    assert_eq!(
        judge(&expected(&["n1", "n3"]), &settings),
        ServerSync::Unknown {
            reason: "no answer on $SYS.REQ.SERVER.PING.JSZ from n3 within 2s".into()
        }
    );
    // Without names from the stream info, every answer counts.
    assert!(matches!(judge(&[], &settings), ServerSync::Interval { .. }));
    assert!(matches!(
        judge(&[], &BTreeMap::new()),
        ServerSync::Unknown { .. }
    ));
}

#[test]
fn warns_about_r1_memory_and_lazy_or_unknown_sync_only() {
    let safe = assessment(
        3,
        Some(ServerSync::Always {
            servers: vec!["n1".into(), "n2".into(), "n3".into()],
        }),
    );
    assert!(safe.warnings().is_empty(), "{:?}", safe.warnings());
    assert_eq!(safe.checks().len(), 3);

    let r1 = assessment(
        1,
        Some(ServerSync::Unknown {
            reason: "why".into(),
        }),
    );
    let aspects: Vec<Aspect> = r1.warnings().iter().map(|c| c.aspect).collect();
    assert_eq!(aspects, [Aspect::Replicas, Aspect::ServerSync]);

    // Memory: no sync line, the storage warning says it all.
    let memory = assessment(3, None);
    let aspects: Vec<Aspect> = memory.warnings().iter().map(|c| c.aspect).collect();
    assert_eq!(aspects, [Aspect::Storage]);

    let old = assessment(
        3,
        Some(ServerSync::Interval {
            servers: vec![LazyServer {
                name: "n1".into(),
                version: "2.9.10".into(),
                interval: Duration::from_secs(60),
                configurable: false,
            }],
        }),
    );
    let warning = &old.warnings()[0];
    assert!(warning.detail.starts_with(
        "n1 (nats-server 2.9.10) syncs to disk every 1m, after acknowledging: a power loss or OS crash of several"
    ));
    assert_eq!(
        warning.hint.as_deref(),
        Some(
            "upgrade n1 to nats-server 2.10 or later and set `sync_interval: always` in its `jetstream {}` block"
        )
    );
    assert_eq!(old.to_json()["server_sync"]["servers"][0]["interval"], "1m");
}
