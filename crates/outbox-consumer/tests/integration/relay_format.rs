//! The test events are the relay's: their header set is the one relay-nats puts on the wire,
//! and that set is the one `outbox-contract` defines (docs/message-format.md). No server
//! needed.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_consumer::contract;
use relay_nats::JetStreamPublisher;

use crate::common::{STREAM, relay_message};

/// Header name → values of a header map, ordered for comparison.
fn sorted(headers: &async_nats::HeaderMap) -> BTreeMap<String, Vec<String>> {
    headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.iter().map(|v| v.to_string()).collect()))
        .collect()
}

#[tokio::test]
async fn test_events_carry_exactly_the_relays_wire_headers() -> anyhow::Result<()> {
    // A client that connects lazily: nothing is published, only headers are built.
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect("127.0.0.1:1")
        .await?;
    let relay = JetStreamPublisher::with_default_limits(client, STREAM, Duration::from_secs(1), 8);
    let msg = relay_message("e1", "outbox.Order.order-created", "{}")?;
    let wire = sorted(&relay.headers(&msg));
    // The contract's list, in its order, then the default mapping's headers.
    let values = [
        "e1",
        STREAM,
        "0/16B3748",
        "771",
        "2026-11-29T11:38:44.123456Z",
        "public.outbox",
        "0",
    ];
    let mapped = [
        (contract::HEADER_AGGREGATE_TYPE, "Order"),
        (contract::HEADER_AGGREGATE_ID, "7"),
        (contract::HEADER_EVENT_TYPE, "order-created"),
    ];
    let expected: BTreeMap<String, Vec<String>> = contract::RELAY_HEADERS
        .into_iter()
        .zip(values)
        .chain(mapped)
        .map(|(n, v)| (n.to_owned(), vec![v.to_owned()]))
        .collect();
    assert_eq!(wire, expected);
    assert_eq!(
        wire.get(contract::HEADER_COMMIT_LSN),
        Some(&vec![contract::Lsn(0x16B3748).to_string()]),
        "the LSN in its one text form"
    );

    // And the consumer reads every one of them.
    let event = outbox_consumer::Event::from_parts(
        &msg.subject,
        Some(&relay.headers(&msg)),
        msg.payload.clone(),
        1,
        1,
    )?;
    assert_eq!(event.id, "e1");
    assert_eq!(
        event.commit_lsn.map(|l| l.to_string()).as_deref(),
        Some("0/16B3748")
    );
    assert_eq!((event.xid, event.tx_index), (Some(771), Some(0)));
    assert!(event.commit_time.is_some());
    assert_eq!(event.table.as_deref(), Some("public.outbox"));
    assert_eq!(event.event_type.as_deref(), Some("order-created"));
    Ok(())
}
