use relay_testkit::{PgOptions, PgSecurity, PostgresServer, TestCa};

use super::*;
use crate::connect::connect;

fn settings(url: String, mode: SslMode, root: Option<&Path>) -> PostgresSettings {
    PostgresSettings {
        url,
        sslmode: Some(mode),
        sslrootcert: root.map(Path::to_path_buf),
        ..Default::default()
    }
}

#[test]
fn each_sslmode_gets_its_configuration() {
    let url = || "postgres://u@127.0.0.1/db".to_owned();
    let plain = settings(url(), SslMode::Disable, None);
    assert!(client_config(&plain).unwrap().is_none());
    for mode in [SslMode::Prefer, SslMode::Require] {
        assert!(
            client_config(&settings(url(), mode, None))
                .unwrap()
                .is_some()
        );
    }
    let no_root = client_config(&settings(url(), SslMode::VerifyCa, None)).unwrap_err();
    assert!(
        no_root.to_string().contains("postgres.sslrootcert"),
        "{no_root}"
    );
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.crt");
    let unreadable =
        client_config(&settings(url(), SslMode::VerifyFull, Some(&missing))).unwrap_err();
    assert!(
        unreadable.to_string().contains("postgres.sslrootcert"),
        "{unreadable}"
    );

    let ca = TestCa::new(dir.path(), "unit").unwrap();
    let mut full = settings(url(), SslMode::VerifyFull, Some(ca.cert_path()));
    assert!(client_config(&full).unwrap().is_some());
    full.sslcert = Some(dir.path().join("client.crt"));
    full.sslkey = Some(dir.path().join("client.key"));
    let wire = replication_tls(&full, "127.0.0.1").unwrap();
    assert_eq!(wire.sni_hostname.as_deref(), Some("127.0.0.1"));
    assert_eq!(wire.ca_pem_path.as_deref(), Some(ca.cert_path()));
    assert_eq!(wire.client_cert_pem_path, full.sslcert);
    assert_eq!(wire.client_key_pem_path, full.sslkey);
    let ca_only = replication_tls(
        &settings(url(), SslMode::VerifyCa, Some(ca.cert_path())),
        "h",
    )
    .unwrap();
    assert_eq!(ca_only.sni_hostname, None);
}

/// The server's certificate names another host: `verify-ca` accepts it (the chain is the
/// CA's), `verify-full` does not, and neither accepts a certificate of another CA.
#[tokio::test]
async fn verify_ca_checks_the_chain_and_verify_full_also_the_name() {
    let security = PgSecurity {
        tls: true,
        tls_server_names: vec!["elsewhere.example".into()],
        ..Default::default()
    };
    let pg = PostgresServer::start_secured(PgOptions::default(), security)
        .await
        .unwrap();
    let root = pg.ca_cert_path().unwrap();
    let url = || pg.url("postgres");
    for mode in [SslMode::Require, SslMode::VerifyCa] {
        let client = connect(&settings(url(), mode, Some(root))).await.unwrap();
        let on: bool = client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(on, "{mode:?}");
    }
    let wrong_name = connect(&settings(url(), SslMode::VerifyFull, Some(root)))
        .await
        .unwrap_err();
    assert!(matches!(wrong_name, PgError::Tls { .. }), "{wrong_name:?}");
    assert!(!wrong_name.is_transient());

    let dir = tempfile::tempdir().unwrap();
    let other = TestCa::new(dir.path(), "other").unwrap();
    let wrong_ca = connect(&settings(url(), SslMode::VerifyCa, Some(other.cert_path())))
        .await
        .unwrap_err();
    assert!(matches!(wrong_ca, PgError::Tls { .. }), "{wrong_ca:?}");
}
