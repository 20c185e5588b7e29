//! Going back in time (docs/replay.md) on the consumer side: a new durable starts at a stream
//! sequence, commit LSN or commit time; an existing one keeps its position; a re-apply runs
//! the handler again for events the ledger recorded, replacing each ledger row in the handler's
//! transaction, once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, SystemTime};

use anyhow::anyhow;
use async_nats::jetstream::consumer;
use futures::FutureExt as _;
use outbox_consumer::{Handler, Lsn, Reapply, StartAt, handler_fn};
use relay_core::message::pg_time_to_system;
use relay_core::stage::Publisher as _;

use crate::common::{Env, STREAM, record, recording_handler, relay_message_at, shutdown};

/// One published test event.
#[derive(Debug, Clone)]
struct Published {
    id: String,
    seq: u64,
    lsn: Lsn,
    time: SystemTime,
}

/// Publishes events `from..=to` through the relay's publisher: event `i` committed at LSN
/// `i * 0x1000`, one second after event `i - 1`.
async fn publish(env: &Env, from: u64, to: u64) -> anyhow::Result<Vec<Published>> {
    let base = (1_795_952_324 - 946_684_800) * 1_000_000;
    let mut out = Vec::new();
    for i in from..=to {
        let id = format!("ev-{i:02}");
        let lsn = Lsn(i * 0x1000);
        let micros = base + i as i64 * 1_000_000;
        let msg = relay_message_at(&id, "outbox.Order.Created", "{}", lsn, micros)?;
        let receipt = env
            .relay
            .send(&Arc::new(msg), None)
            .await
            .map_err(|e| anyhow!("{e}"))?
            .await
            .map_err(|e| anyhow!("{e}"))?;
        out.push(Published {
            id,
            seq: receipt.stream_seq,
            lsn,
            time: pg_time_to_system(micros),
        });
    }
    Ok(out)
}

fn ids(events: &[Published]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// Runs `service` (durable of the same name) with `start` and `handler` until `table_rows`
/// rows are applied for `label`, then stops it.
async fn run_until<H: Handler>(
    env: &Env,
    service: &'static str,
    label: &'static str,
    start: Option<StartAt>,
    reapply: Option<Reapply>,
    handler: H,
    rows: usize,
) -> anyhow::Result<Vec<String>> {
    let mut builder = env.builder(service);
    if let Some(start) = start {
        builder = builder.start_at(start);
    }
    if let Some(reapply) = reapply {
        builder = builder.reapply(reapply);
    }
    let (stop, signal) = shutdown();
    let run = tokio::spawn(builder.build()?.run(handler, signal));
    let applied = env.wait_applied(label, rows).await;
    stop.notify_one();
    run.await??;
    applied
}

#[tokio::test]
async fn a_new_durable_starts_at_a_sequence_lsn_or_time_and_an_existing_one_keeps_its_place()
-> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let events = publish(&env, 1, 10).await?;

    let lsn = StartAt::Lsn(events[5].lsn);
    let got = run_until(
        &env,
        "late",
        "late",
        Some(lsn),
        None,
        recording_handler("late"),
        5,
    )
    .await?;
    assert_eq!(got, ids(&events[5..]), "from commit LSN {}", events[5].lsn);

    let seq = StartAt::Sequence(events[7].seq);
    let got = run_until(
        &env,
        "seq",
        "seq",
        Some(seq),
        None,
        recording_handler("seq"),
        3,
    )
    .await?;
    assert_eq!(got, ids(&events[7..]), "from sequence {}", events[7].seq);

    let time = StartAt::Time(events[3].time);
    let got = run_until(
        &env,
        "timed",
        "timed",
        Some(time),
        None,
        recording_handler("timed"),
        7,
    )
    .await?;
    assert_eq!(got, ids(&events[3..]), "from commit time");

    // The durable exists: a start position no longer applies, it goes on where it was.
    let more = publish(&env, 11, 11).await?;
    let again = StartAt::Sequence(1);
    let got = run_until(
        &env,
        "late",
        "late",
        Some(again),
        None,
        recording_handler("late"),
        6,
    )
    .await?;
    let mut want = ids(&events[5..]);
    want.extend(ids(&more));
    assert_eq!(got, want, "an existing durable keeps its position");

    // A durable `outbox-relay replay` re-created with a start sequence is accepted as it is.
    let stream = env.js.get_stream(STREAM).await?;
    stream.delete_consumer("seq").await?;
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("seq".into()),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: events[9].seq,
            },
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    env.db
        .execute(
            "DELETE FROM outbox_consumer_ledger WHERE consumer = 'seq'",
            &[],
        )
        .await?;
    let got = run_until(&env, "seq", "seq", None, None, recording_handler("seq"), 5).await?;
    let mut want = ids(&events[7..]);
    want.extend(ids(&events[9..]));
    want.extend(ids(&more));
    assert_eq!(got, want, "re-created at a sequence: applies from there");
    Ok(())
}

#[tokio::test]
async fn a_reapply_runs_the_handler_again_in_the_handlers_transaction_once_per_event()
-> anyhow::Result<()> {
    let env = Env::start(Duration::from_secs(120)).await?;
    let events = publish(&env, 1, 8).await?;
    // Version 1 applies everything.
    let got = run_until(&env, "svc", "v1", None, None, recording_handler("v1"), 8).await?;
    assert_eq!(got, ids(&events));
    let ledger_seq = |id: &str| {
        let id = id.to_owned();
        let db = &env.db;
        async move {
            let row = db
                .query_one(
                    "SELECT stream_seq, applied_at FROM outbox_consumer_ledger \
                     WHERE consumer = 'svc' AND event_id = $1",
                    &[&id],
                )
                .await?;
            anyhow::Ok((row.get::<_, i64>(0), row.get::<_, SystemTime>(1)))
        }
    };
    let (_, v1_applied_at) = ledger_seq(&events[3].id).await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let fixed_at = SystemTime::now();

    // The fix: re-apply events 3..6 (LSN range [ev-03, ev-07)). Reposition the durable to
    // ev-03, as `outbox-relay replay --from-lsn` does.
    let reposition = || async {
        let stream = env.js.get_stream(STREAM).await?;
        stream.delete_consumer("svc").await?;
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("svc".into()),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: events[2].seq,
                },
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await?;
        anyhow::Ok(())
    };
    reposition().await?;
    let reapply = Reapply::new(events[2].lsn, fixed_at).until(events[6].lsn);
    // Version 2 fails ev-04 once: its first re-apply rolls back, ledger row included.
    let failures = Arc::new(AtomicU64::new(0));
    let v2 = {
        let failures = failures.clone();
        handler_fn(move |tx, ev| {
            let failures = failures.clone();
            async move {
                if !ev.reapplied {
                    return Err("version 2 only sees re-applied events here".into());
                }
                if ev.id == "ev-04" && failures.fetch_add(1, AtomicOrdering::SeqCst) == 0 {
                    return Err("transient".into());
                }
                record(tx, ev, "v2").await
            }
            .boxed()
        })
    };
    let got = run_until(&env, "svc", "v2", None, Some(reapply), v2, 4).await?;
    assert_eq!(got, ids(&events[2..6]), "re-applied, once each, in order");
    assert_eq!(
        failures.load(AtomicOrdering::SeqCst),
        2,
        "ev-04 failed once, then applied"
    );
    for e in &events[2..6] {
        let (seq, at) = ledger_seq(&e.id).await?;
        assert_eq!(
            seq as u64, e.seq,
            "{}: the ledger row records the copy",
            e.id
        );
        assert!(at > fixed_at, "{}: the ledger row was replaced", e.id);
    }
    let (_, untouched) = ledger_seq(&events[1].id).await?;
    assert!(untouched < fixed_at, "outside the range: not replaced");
    let (_, after) = ledger_seq(&events[6].id).await?;
    assert!(after < fixed_at, "at `until`: not replaced");
    assert!(v1_applied_at < fixed_at);

    // Delivered again (a second replay, redeliveries): applied at or after `fixed_at`, skipped.
    reposition().await?;
    let v3 = handler_fn(|tx, ev| record(tx, ev, "v3").boxed());
    let consumer = env.builder("svc").reapply(reapply).build()?;
    let stats = consumer.stats();
    let (stop, signal) = shutdown();
    let run = tokio::spawn(consumer.run(v3, signal));
    crate::common::wait_for(30, "6 duplicates", || async {
        Ok(stats.snapshot().duplicates >= 6)
    })
    .await?;
    stop.notify_one();
    run.await??;
    assert!(
        env.applied("v3").await?.is_empty(),
        "nothing re-applied twice"
    );
    Ok(())
}
