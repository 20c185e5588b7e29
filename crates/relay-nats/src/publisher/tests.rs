//! The publisher's headers: the transaction template, and the same set on the lean path's frames.

use std::time::Duration;

use super::*;
use bytes::Bytes;
use relay_core::Lsn;
use relay_core::message::HEADER_MSG_ID;

fn event(id: &str, tx: &[(Arc<str>, Arc<str>)], index: &str) -> OutboundMessage {
    let mut headers = tx.to_vec();
    headers.push(("Outbox-Tx-Index".into(), index.into()));
    OutboundMessage {
        subject: "outbox.a".into(),
        event_id: id.into(),
        headers,
        shared_headers: tx.len(),
        payload: Bytes::new(),
        table: "public.outbox".into(),
        commit_lsn: Lsn(1),
        commit_time_micros: 0,
    }
}

fn tx(lsn: &str) -> Vec<(Arc<str>, Arc<str>)> {
    vec![
        ("Outbox-Commit-Lsn".into(), lsn.into()),
        ("Outbox-Table".into(), "public.outbox".into()),
    ]
}

#[tokio::test]
async fn headers_come_from_the_transaction_template_and_the_event() {
    // No server needed: the client connects in the background and nothing is published.
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect("127.0.0.1:1")
        .await
        .expect("a client that connects lazily");
    let publisher =
        JetStreamPublisher::with_default_limits(client, "OUTBOX", Duration::from_secs(1), 8);
    let first_tx = tx("0/10");
    let second_tx = tx("0/20");
    let cases = [
        (event("a", &first_tx, "0"), "0/10", "0"),
        (event("b", &first_tx, "1"), "0/10", "1"),
        (event("c", &second_tx, "0"), "0/20", "0"),
    ];
    for (msg, lsn, index) in &cases {
        let headers = publisher.headers(msg);
        let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        assert_eq!(get(HEADER_MSG_ID).as_deref(), Some(msg.event_id.as_str()));
        assert_eq!(get(HEADER_EXPECTED_STREAM).as_deref(), Some("OUTBOX"));
        assert_eq!(get("Outbox-Commit-Lsn").as_deref(), Some(*lsn));
        assert_eq!(get("Outbox-Table").as_deref(), Some("public.outbox"));
        assert_eq!(get("Outbox-Tx-Index").as_deref(), Some(*index));
        assert_eq!(headers.iter().count(), 5, "no header of another event");
    }
    // Every outstanding ack holds one of these: keep it small (the rare paths are boxed).
    let ack = publisher
        .send(&Arc::new(cases[2].0.clone()), None)
        .await
        .expect("queued while the client connects");
    assert!(
        std::mem::size_of_val(&*ack) <= 512,
        "ack future is {} bytes",
        std::mem::size_of_val(&*ack)
    );
    // The lean path frames exactly these headers: one list feeds both.
    for (msg, _, _) in &cases {
        let map = publisher.headers(msg);
        let mut from_map: Vec<(String, String)> = map
            .iter()
            .flat_map(|(n, vs)| vs.iter().map(move |v| (n.to_string(), v.to_string())))
            .collect();
        let mut framed = nats_wire::framed_header_lines::<crate::wire::Outbox>("OUTBOX", msg);
        let names = framed.len();
        framed.sort();
        framed.dedup_by(|a, b| a.0 == b.0);
        assert_eq!(framed.len(), names, "no name twice on the wire");
        from_map.sort();
        assert_eq!(framed, from_map);
    }
    // A name set twice (an event header named like a shared one): the later value, once,
    // on both paths.
    let mut twice = event("d", &first_tx, "2");
    twice
        .headers
        .push(("Outbox-Table".into(), "public.other".into()));
    let framed = nats_wire::framed_header_lines::<crate::wire::Outbox>("OUTBOX", &twice);
    let tables: Vec<_> = framed.iter().filter(|(n, _)| n == "Outbox-Table").collect();
    assert_eq!(tables.len(), 1, "{framed:?}");
    assert_eq!(tables[0].1, "public.other");
    let map = publisher.headers(&twice);
    assert_eq!(
        map.get("Outbox-Table")
            .map(|v| v.as_str().to_owned())
            .as_deref(),
        Some("public.other")
    );
    assert_eq!(framed.len(), map.iter().count());
    // Back to the last transaction, for the template check below.
    let _ = publisher.headers(&cases[2].0);
    let state = publisher.core.template.lock().expect("not poisoned");
    assert!(
        state
            .template
            .as_ref()
            .is_some_and(|t| t.matches(&second_tx)),
        "the template follows the transaction"
    );
    assert!(
        state.names.iter().any(|(n, _)| &**n == "Outbox-Tx-Index"),
        "header names are converted once"
    );
}
