//! A transaction's events go out once its Commit is read: a row that cannot be routed stops the
//! relay before anything of its transaction is published.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_bad_row_in_the_middle_of_a_transaction_publishes_nothing_of_it() {
    let mut events = preamble();
    events.extend(tx(1, &["a"]));
    // Row "b" routes, the empty id does not, "c" would.
    events.extend(tx(2, &["b", "", "c"]));
    let (result, h) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    assert!(
        matches!(
            result,
            Err(PipelineError::Route {
                error: RouteError::MissingEventId { .. },
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(stream_ids(&h), ["a"], "nothing of the bad transaction");
    assert_eq!(h.saved.lock().unwrap().last(), Some(&Lsn(1000)));
    let calls = h.broker.0.lock().unwrap().calls.clone();
    assert!(
        !calls.iter().any(|c| c == "send b"),
        "b was handed to the publisher: {calls:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_publisher_hears_begin_then_every_event_then_end() {
    let mut events = preamble();
    events.extend(tx(1, &["a", "b"]));
    events.extend(tx(2, &["c"]));
    let (result, h) = run_script(
        events,
        FakeBroker::default(),
        PipelineConfig::default(),
        false,
    )
    .await;
    assert_eq!(result.unwrap().confirmed, Lsn(2000));
    let calls = h.broker.0.lock().unwrap().calls.clone();
    assert_eq!(
        calls,
        ["begin", "send a", "send b", "end", "begin", "send c", "end"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_transaction_larger_than_the_window_sends_its_first_part_before_its_end() {
    // Documented bound: what is held and what awaits its acknowledgement never exceed the
    // in-flight window, so a transaction of more events than `max_in_flight` publishes its
    // first events before its end is read; never anything after the bad row.
    let mut events = preamble();
    let ids: Vec<String> = (0..10).map(|i| format!("e{i}")).collect();
    let mut refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    refs.insert(7, "");
    events.extend(tx(1, &refs));
    let config = PipelineConfig {
        max_in_flight: 4,
        ..PipelineConfig::default()
    };
    let (result, h) = run_script(events, FakeBroker::default(), config, false).await;
    assert!(result.is_err());
    let stored = stream_ids(&h);
    assert!(
        stored.len() >= 4 && stored.len() <= 7 && stored[..] == ids[..stored.len()],
        "a prefix of the transaction before the bad row: {stored:?}"
    );
    assert!(
        h.saved.lock().unwrap().iter().all(|l| *l < Lsn(1000)),
        "nothing of the transaction confirmed"
    );
}
