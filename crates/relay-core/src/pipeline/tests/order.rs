//! Commit order under broker faults: a message lost with many in flight, a full stream that
//! frees room between two messages, an outage; the stream stays in commit order, and nothing
//! is confirmed past an event not stored.

use super::*;

/// `n` one-event transactions e0..e{n-1}.
fn one_event_transactions(n: u64) -> (Vec<SourceEvent>, Vec<String>) {
    let mut events = preamble();
    let ids: Vec<String> = (0..n).map(|i| format!("e{i}")).collect();
    for (t, id) in ids.iter().enumerate() {
        events.extend(tx(t as u64 + 1, &[id.as_str()]));
    }
    (events, ids)
}

/// `broker`, failing event `id`'s sends with `faults` in turn.
fn faulty<const N: usize>(broker: FakeBroker, id: &str, faults: [Fault; N]) -> FakeBroker {
    broker
        .0
        .lock()
        .unwrap()
        .faults
        .insert(id.into(), faults.into());
    broker
}

#[tokio::test(start_paused = true)]
async fn a_message_lost_with_others_in_flight_is_stored_before_them() {
    // e3 is lost (a leader change, a restart) while e4.. are in flight: without the condition
    // on the stream's last message they would be stored before its re-send.
    let (events, ids) = one_event_transactions(20);
    let broker = faulty(FakeBroker::default(), "e3", [Fault::FailBeforeWrite]);
    let (result, h) = run_script(events, broker, PipelineConfig::default(), false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(20_000));
    assert_eq!(stream_ids(&h), ids, "commit order");
    let broker = h.broker.0.lock().unwrap();
    assert!(
        broker.out_of_turn > 0,
        "the messages after the lost one were sent before its outcome was known, and refused"
    );
    assert!(h.stats.publish_errors_out_of_turn.load(Ordering::Relaxed) > 0);
    assert!(h.stats.publish_retries.load(Ordering::Relaxed) > 0);
}

#[tokio::test(start_paused = true)]
async fn without_the_condition_a_lost_message_lands_after_later_ones() {
    // The same fault on a broker that ignores the condition: the failure the chain prevents.
    let (events, ids) = one_event_transactions(20);
    let broker = faulty(FakeBroker::storing_on_ack(), "e3", [Fault::FailBeforeWrite]);
    let (result, h) = run_script(events, broker, PipelineConfig::default(), false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(20_000));
    assert_ne!(stream_ids(&h), ids, "stored out of order");
}

#[tokio::test(start_paused = true)]
async fn a_full_stream_holds_everything_back_until_there_is_room_and_keeps_order() {
    // The stream is full for e5's first three sends; e6.. would fit (a smaller message, a
    // message aged out): they must still wait for e5.
    let (events, ids) = one_event_transactions(12);
    let broker = faulty(
        FakeBroker::default(),
        "e5",
        [Fault::Full, Fault::Full, Fault::Full],
    );
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(10),
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, broker, config, false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(12_000));
    assert_eq!(stream_ids(&h), ids);
    assert_eq!(
        h.stats.publish_errors_stream_full.load(Ordering::Relaxed),
        3
    );
    assert_eq!(
        h.stats.stream_full.load(Ordering::Relaxed),
        0,
        "cleared once stored"
    );
    // CheckingStore held every save to the delivery rule; no save passed e5's transaction
    // before it was stored, and the last one is the end.
    assert_eq!(h.saved.lock().unwrap().last(), Some(&Lsn(12_000)));
}

#[tokio::test(start_paused = true)]
async fn while_the_stream_is_full_one_message_is_tried_per_round() {
    // A long outage costs one re-send per round, not the whole window.
    let (events, _) = one_event_transactions(50);
    let broker = faulty(FakeBroker::default(), "e0", [Fault::Full; 6]);
    let (result, h) = run_script(events, broker, PipelineConfig::default(), false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(50_000));
    let broker = h.broker.0.lock().unwrap();
    // The first send of each (e1.. refused out of turn behind e0), then e0 alone once per
    // round until it is stored on the sixth, then e1.. once more, in order.
    assert_eq!(broker.sends, 50 + 6 + 49, "sends {}", broker.sends);
    assert_eq!(broker.out_of_turn, 49);
}

#[tokio::test(start_paused = true)]
async fn an_ack_lost_after_the_store_is_answered_as_a_duplicate_and_order_holds() {
    let (events, ids) = one_event_transactions(10);
    let broker = faulty(FakeBroker::default(), "e2", [Fault::FailAfterWrite]);
    let (result, h) = run_script(events, broker, PipelineConfig::default(), false).await;
    assert_eq!(result.unwrap().confirmed, Lsn(10_000));
    assert_eq!(stream_ids(&h), ids);
    assert_eq!(h.stats.duplicates.load(Ordering::Relaxed), 1);
}
