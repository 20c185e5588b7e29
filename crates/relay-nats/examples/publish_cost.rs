//! Publishes `N` events through one of the publish paths against a nats-server it
//! starts, for instruction counts of the publish path alone:
//!
//! ```text
//! valgrind --tool=callgrind cargo-built/examples/publish_cost lean 10000
//! valgrind --tool=callgrind cargo-built/examples/publish_cost async-nats 10000
//! valgrind --tool=callgrind cargo-built/examples/publish_cost atomic 10000
//! ```
//!
//! `atomic` is the lean connection with `publish_mode = "atomic-batch"`: each transaction of
//! 100 events one batch (nats-server 2.12.1+).
//!
//! Run each at two sizes; the difference over the difference in events is the cost per event
//! without start-up. The nats-server child is not instrumented (no `--trace-children`).
//!
//! Each event names the one before it as the pipeline does while that one is unacknowledged
//! (`Nats-Expected-Last-Msg-Id`, the commit-order condition), except the first; `lean-unchained`
//! is `lean` without that condition, to tell its cost apart.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use relay_core::Lsn;
use relay_core::message::OutboundMessage;
use relay_core::stage::Publisher as _;
use relay_nats::{JetStreamPublisher, NatsSettings, PublishMode, StreamTakes};
use relay_testkit::NatsServer;

/// Outstanding acks, as the pipeline keeps many in flight.
const WINDOW: usize = 256;
/// Events per transaction (they share the transaction's headers).
const TX_ROWS: usize = 100;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args
        .next()
        .context("usage: publish_cost lean|async-nats|atomic N")?;
    let count: usize = args.next().context("N")?.parse()?;
    let atomic = mode == "atomic";
    let chained = mode != "lean-unchained";
    let server = NatsServer::start().await?;
    let settings = NatsSettings {
        url: server.url(),
        ..Default::default()
    };
    let ack_timeout = Duration::from_secs(10);
    let publisher = match mode.as_str() {
        "lean" | "lean-unchained" | "atomic" => {
            let connection = relay_nats::connect(&settings).await?;
            JetStreamPublisher::new(&connection, "OUTBOX", ack_timeout, WINDOW)
        }
        "async-nats" => {
            let client = async_nats::connect(server.url()).await?;
            JetStreamPublisher::with_default_limits(client, "OUTBOX", ack_timeout, WINDOW)
        }
        other => bail!("unknown mode {other}"),
    };
    publisher
        .context()
        .get_or_create_stream(async_nats::jetstream::stream::Config {
            name: "OUTBOX".into(),
            subjects: vec!["outbox.>".into()],
            allow_atomic_publish: atomic,
            ..Default::default()
        })
        .await?;
    let publisher = if atomic {
        let batching =
            publisher.with_publish_mode(PublishMode::AtomicBatch, StreamTakes::BATCHES, WINDOW);
        if !batching.framing().atomic_batches() {
            bail!(
                "nats-server {} takes no atomic batches (2.12.1+)",
                server.version()
            );
        }
        batching
    } else {
        publisher
    };
    let payload = Bytes::from(vec![b'x'; 200]);
    let mut outstanding = VecDeque::new();
    let mut tx: Vec<(Arc<str>, Arc<str>)> = Vec::new();
    let mut previous: Option<Arc<OutboundMessage>> = None;
    for i in 0..count {
        if i % TX_ROWS == 0 {
            // Per message, the transaction calls do nothing: left out so the counts stay
            // comparable with the earlier ones.
            if atomic {
                if i > 0 {
                    publisher.end_transaction();
                }
                publisher.begin_transaction(Lsn((i / TX_ROWS) as u64));
            }
            tx = vec![
                ("Outbox-Commit-Lsn".into(), format!("0/{i:X}").into()),
                ("Outbox-Xid".into(), i.to_string().into()),
                ("Outbox-Table".into(), "public.outbox".into()),
            ];
        }
        let mut headers = tx.clone();
        headers.push(("Outbox-Tx-Index".into(), (i % TX_ROWS).to_string().into()));
        let msg = Arc::new(OutboundMessage {
            subject: "outbox.order".into(),
            event_id: format!("ev-{i}"),
            headers,
            shared_headers: tx.len(),
            payload: payload.clone(),
            table: "public.outbox".into(),
            // A batch member carries its transaction's commit LSN.
            commit_lsn: Lsn(if atomic { i / TX_ROWS } else { i } as u64),
            commit_time_micros: 0,
        });
        let after = previous
            .as_ref()
            .filter(|_| chained)
            .map(|m| m.event_id.as_str());
        outstanding.push_back(publisher.send(&msg, after).await?);
        previous = Some(msg);
        if outstanding.len() >= WINDOW
            && let Some(ack) = outstanding.pop_front()
        {
            ack.await?;
        }
    }
    if atomic {
        publisher.end_transaction();
    }
    for ack in outstanding {
        ack.await?;
    }
    println!(
        "{mode}: {count} events published (lean: {})",
        publisher.publishes_lean()
    );
    Ok(())
}
