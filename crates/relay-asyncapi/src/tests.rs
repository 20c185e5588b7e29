use super::*;

#[test]
fn the_server_is_the_first_url_without_user_or_password() {
    for (url, expected) in [
        (
            "nats://127.0.0.1:4222",
            Some((Some("nats"), "127.0.0.1:4222", None)),
        ),
        (
            "nats://relay:s3cret@broker:4222",
            Some((Some("nats"), "broker:4222", None)),
        ),
        (
            "tls://relay:s3cret@a:4222, tls://relay:s3cret@b:4222",
            Some((Some("tls"), "a:4222", None)),
        ),
        ("a:4222,b:4222", Some((None, "a:4222", None))),
        ("nats://a:4222,b:4222", Some((Some("nats"), "a:4222", None))),
        // A password may hold `,`, `/` and `@`: none of it may reach the host.
        (
            "nats://relay:p,a/s@s@broker:4222",
            Some((Some("nats"), "broker:4222", None)),
        ),
        (
            "wss://broker:443/nats",
            Some((Some("wss"), "broker:443", Some("/nats"))),
        ),
        ("nats://relay:pw@", None),
        ("", None),
    ] {
        assert_eq!(first_server(url), expected, "{url}");
    }
}

#[test]
fn a_url_without_a_host_is_an_error_that_shows_no_password() {
    let nats = NatsSettings {
        url: "nats://relay:s3cret@".into(),
        ..NatsSettings::default()
    };
    let error = server(&nats).unwrap_err().to_string();
    assert!(!error.contains("s3cret"), "{error}");
    assert!(error.contains("names no server host"), "{error}");
}

#[test]
fn keys_hold_only_what_asyncapi_allows_and_never_twice() {
    assert_eq!(
        component_key("table.billing.\"in voices\""),
        "table.billing._in_voices_"
    );
    assert_eq!(component_key(""), "_");
    let taken = ["a", "a-2"];
    assert_eq!(unique("a", |k| taken.contains(&k)), "a-3");
    assert_eq!(unique("b", |k| taken.contains(&k)), "b");
}

#[test]
fn channels_of_tables_whose_names_reduce_alike_get_their_own_ids() {
    let mut document = Document::default();
    for name in ["a b", "a_b"] {
        document.add(Channel {
            id: format!("table.{name}"),
            address: Some("x".into()),
            title: name.into(),
            description: String::new(),
            parameters: Map::new(),
            messages: vec![("event".into(), json!({}))],
        });
    }
    let mut ids: Vec<&String> = document.channels.keys().collect();
    ids.sort();
    assert_eq!(ids, ["table.a_b", "table.a_b-2"]);
    let mut messages: Vec<&String> = document.messages.keys().collect();
    messages.sort();
    assert_eq!(messages, ["table.a_b-2.event", "table.a_b.event"]);
    assert_eq!(
        document.operations["send.table.a_b-2"]["messages"][0]["$ref"],
        "#/channels/table.a_b-2/messages/event"
    );
}
