use super::*;
use std::time::Duration;

#[test]
fn urls_are_parsed_and_redacted() {
    let s = PostgresSettings {
        url: "postgres://relay:s3cret@db.example:6543/app".into(),
        ..Default::default()
    };
    let p = s.parts().unwrap();
    assert_eq!(
        (p.host.as_str(), p.port, p.user.as_str()),
        ("db.example", 6543, "relay")
    );
    assert_eq!(
        (p.password.as_str(), p.database.as_str()),
        ("s3cret", "app")
    );
    assert_eq!(
        redact_url(&s.url),
        "postgres://relay:<redacted>@db.example:6543/app"
    );
    assert!(!format!("{s:?}").contains("s3cret"));
    let with_env_password = PostgresSettings {
        password: Some("fromenv".into()),
        ..s
    };
    assert_eq!(with_env_password.parts().unwrap().password, "fromenv");
    let bad = PostgresSettings {
        url: "not a url".into(),
        ..Default::default()
    };
    assert!(bad.validate().is_err());
}

#[test]
fn a_multi_host_url_gives_one_candidate_per_host_bound_to_read_write() {
    use tokio_postgres::config::{Host, TargetSessionAttrs};
    let s = PostgresSettings {
        url: "postgres://relay:s3cret@db1.example:5432,db2.example:5433/app?target_session_attrs=read-write&connect_timeout=7".into(),
        ..Default::default()
    };
    s.validate().unwrap();
    assert_eq!(s.host_count().unwrap(), 2);
    assert!(s.wants_primary().unwrap());
    assert_eq!(s.display_target(), "db1.example:5432,db2.example:5433/app");
    let candidates = s.candidates().unwrap();
    let targets: Vec<(String, u16)> = candidates
        .iter()
        .map(|c| {
            let p = c.parts().unwrap();
            assert_eq!((p.user.as_str(), p.password.as_str()), ("relay", "s3cret"));
            assert_eq!(p.database, "app");
            (p.host, p.port)
        })
        .collect();
    assert_eq!(
        targets,
        [
            ("db1.example".to_owned(), 5432),
            ("db2.example".to_owned(), 5433)
        ]
    );
    let second = &candidates[1];
    assert!(second.is_pinned());
    assert_eq!(
        second.candidates().unwrap(),
        std::slice::from_ref(second),
        "bound: stays bound"
    );
    assert_eq!(second.display_target(), "db2.example:5433/app");
    let config = second.client_config().unwrap();
    assert_eq!(config.get_hosts(), [Host::Tcp("db2.example".into())]);
    assert_eq!(config.get_ports(), [5433]);
    assert_eq!(
        config.get_target_session_attrs(),
        TargetSessionAttrs::ReadWrite
    );
    assert_eq!(
        config.get_connect_timeout(),
        Some(&Duration::from_secs(10)),
        "postgres.connect_timeout wins over the URL's, as for one host"
    );
    assert_eq!(config.get_application_name(), Some("outbox-relay"));
    // The pinned host is never serialized or printed; the URL is, redacted.
    let printed = format!("{second:?}");
    assert!(
        !printed.contains("s3cret") && !printed.contains("pinned"),
        "{printed}"
    );

    // Several hosts without target_session_attrs: still the read-write one; a single
    // host without it: whatever answers, as before.
    let plain = PostgresSettings {
        url: "postgres://relay@10.0.0.1,10.0.0.2/app".into(),
        ..Default::default()
    };
    assert!(plain.wants_primary().unwrap());
    let ports: Vec<u16> = plain
        .candidates()
        .unwrap()
        .iter()
        .map(|c| c.parts().unwrap().port)
        .collect();
    assert_eq!(ports, [5432, 5432]);
    let one = PostgresSettings {
        url: "postgres://relay@db/app".into(),
        ..Default::default()
    };
    assert!(!one.wants_primary().unwrap());
    assert_eq!(one.candidates().unwrap(), std::slice::from_ref(&one));
    assert!(!one.candidates().unwrap()[0].is_pinned());

    // key=value form, with one port for every host and hostaddr per host.
    let kv = PostgresSettings {
        url: "host=a,b hostaddr=127.0.0.1,127.0.0.2 port=6000 user=relay dbname=app".into(),
        ..Default::default()
    };
    let second = &kv.candidates().unwrap()[1];
    let config = second.client_config().unwrap();
    assert_eq!(config.get_hosts(), [Host::Tcp("b".into())]);
    assert_eq!(
        config.get_hostaddrs(),
        ["127.0.0.2".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(config.get_ports(), [6000]);

    let hosts = s.each_host().unwrap();
    assert_eq!(hosts.len(), 2);
    assert_eq!(
        hosts[1].client_config().unwrap().get_target_session_attrs(),
        TargetSessionAttrs::Any,
        "the preflight reaches standbys too"
    );
    assert!(one.each_host().unwrap().is_empty());

    let read_only = PostgresSettings {
        url: "postgres://relay@db1,db2/app?target_session_attrs=read-only".into(),
        ..Default::default()
    };
    assert!(
        read_only
            .validate()
            .unwrap_err()
            .to_string()
            .contains("read-write")
    );
}

#[test]
fn secrets_come_from_files_and_are_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "  filesecret\n").unwrap();
    let s = PostgresSettings {
        url: "postgres://relay:urlsecret@db.example/app".into(),
        password: Some("envsecret".into()),
        password_file: Some(file),
        ..Default::default()
    };
    assert_eq!(s.parts().unwrap().password, "filesecret");
    let printed = format!(
        "{s:?} {s:#?} {} {}",
        serde_json::to_string(&s).unwrap(),
        s.display_target()
    );
    for secret in ["filesecret", "urlsecret", "envsecret"] {
        assert!(!printed.contains(secret), "{printed}");
    }
    assert!(
        printed.contains("\"postgres://relay:<redacted>@db.example/app\""),
        "{printed}"
    );
    let missing = PostgresSettings {
        password_file: Some(dir.path().join("nope")),
        ..Default::default()
    };
    assert!(
        missing
            .validate()
            .unwrap_err()
            .to_string()
            .contains("password_file")
    );
    let no_ca = PostgresSettings {
        sslmode: Some(SslMode::VerifyFull),
        ..Default::default()
    };
    assert!(
        no_ca
            .validate()
            .unwrap_err()
            .to_string()
            .contains("sslrootcert")
    );
    let from_url = PostgresSettings {
        url: "postgres://u@h/db?sslmode=require".into(),
        ..Default::default()
    };
    assert_eq!(from_url.ssl_mode().unwrap(), SslMode::Require);
}
