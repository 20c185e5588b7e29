use bytes::Bytes;
use pgoutput::Lsn;

use super::*;
use crate::frontier::AckFrontier;

fn policy() -> RetryPolicy {
    RetryPolicy {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(5),
        no_stream_grace: Duration::from_secs(30),
    }
}

/// A window holding messages `ids`, all sent.
fn window(ids: &[&str]) -> Window {
    let mut frontier = AckFrontier::new(Lsn(0));
    frontier.begin().expect("begin");
    let mut window = Window::new(policy());
    for id in ids {
        let msg = Arc::new(OutboundMessage::bare("outbox.a", *id, Bytes::new(), Lsn(1)));
        let ticket = frontier.event().expect("ticket");
        window.push(msg, ticket, 0);
    }
    window
}

fn stored() -> Result<PubReceipt, PublishError> {
    Ok(PubReceipt {
        stream_seq: 1,
        duplicate: false,
    })
}

fn closed() -> Result<PubReceipt, PublishError> {
    Err(PublishError::closed_by_server(
        "-ERR 'maximum control line exceeded'",
    ))
}

fn timeout() -> Result<PubReceipt, PublishError> {
    Err(PublishError::new(PublishErrorKind::Unknown, "timed out"))
}

/// Fails message 0 with `outcome` and re-sends it (as a round does); the outcome.
fn fail_and_resend(window: &mut Window, outcome: Result<PubReceipt, PublishError>) -> Outcome {
    let stats = PipelineStats::default();
    let outcome = window.on_attempt((0, outcome), || 5, &stats);
    if matches!(outcome, Outcome::Again) {
        let (seq, _) = window.start_round(&stats).expect("a round");
        assert_eq!(seq, 0);
    }
    outcome
}

#[test]
fn a_message_the_server_closes_the_connection_on_every_time_is_refused() {
    let mut window = window(&["a"]);
    for _ in 0..4 {
        assert!(matches!(
            fail_and_resend(&mut window, closed()),
            Outcome::Again
        ));
    }
    let Outcome::Refused(_, _, error, _) = fail_and_resend(&mut window, closed()) else {
        panic!("refused on the fifth close");
    };
    assert_eq!(error.kind, PublishErrorKind::Rejected);
    assert!(error.message.contains("5 times in a row"), "{error}");
    assert!(error.message.contains("maximum control line"), "{error}");
}

#[test]
fn any_other_outcome_in_between_starts_the_count_again() {
    let mut window = window(&["a"]);
    for _ in 0..4 {
        for _ in 0..4 {
            assert!(matches!(
                fail_and_resend(&mut window, closed()),
                Outcome::Again
            ));
        }
        assert!(matches!(
            fail_and_resend(&mut window, timeout()),
            Outcome::Again
        ));
    }
    assert!(matches!(
        fail_and_resend(&mut window, stored()),
        Outcome::Stored(..)
    ));
}

#[tokio::test(start_paused = true)]
async fn no_stream_is_retried_for_the_grace_then_refused() {
    let mut window = window(&["a"]);
    let no_stream = || {
        Err(PublishError::new(
            PublishErrorKind::NoStream,
            "no responders",
        ))
    };
    assert!(matches!(
        fail_and_resend(&mut window, no_stream()),
        Outcome::Again
    ));
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(matches!(
        fail_and_resend(&mut window, no_stream()),
        Outcome::Again
    ));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(matches!(
        fail_and_resend(&mut window, no_stream()),
        Outcome::Refused(..)
    ));
}

#[test]
fn the_condition_is_the_nearest_earlier_message_not_yet_stored() {
    let stats = PipelineStats::default();
    let mut window = window(&["a", "b", "c"]);
    assert_eq!(window.after(), Some("c"));
    // c stored before a and b answered (its own condition says b was stored): b is still
    // the nearest not known stored.
    let Outcome::Stored(..) = window.on_attempt((2, stored()), || 5, &stats) else {
        panic!("stored");
    };
    assert_eq!(window.after(), Some("b"));
    for seq in [0, 1] {
        window.on_attempt((seq, stored()), || 5, &stats);
    }
    assert_eq!(window.after(), None, "everything stored: no condition");
    assert_eq!(window.len(), 0);
}

#[test]
fn a_failure_halts_the_window_until_the_first_failed_message_is_stored_again() {
    let stats = PipelineStats::default();
    let mut window = window(&["a", "b", "c"]);
    assert!(window.open());
    window.on_attempt((1, timeout()), || 5, &stats);
    assert!(!window.open(), "nothing new is sent");
    window.on_attempt((2, timeout()), || 5, &stats);
    // a is still out: no round yet.
    window.settle(1);
    assert!(window.resend_at().is_none());
    window.on_attempt((0, stored()), || 5, &stats);
    window.settle(0);
    assert!(window.resend_at().is_some());
    let (probe, msg) = window.start_round(&stats).expect("a round");
    assert_eq!((probe, msg.event_id.as_str()), (1, "b"));
    assert!(window.take_burst(&stats).is_empty(), "c waits for b");
    window.on_attempt((1, stored()), || 5, &stats);
    assert_eq!(window.take_burst(&stats), [2]);
    assert!(window.open());
    let (msg, after) = window.resend_args(2).expect("c");
    assert_eq!((msg.event_id.as_str(), after), ("c", None), "b is stored");
}

#[tokio::test(start_paused = true)]
async fn no_stream_stops_when_the_grace_has_passed_not_a_backoff_later() {
    let stats = PipelineStats::default();
    let policy = RetryPolicy {
        no_stream_grace: Duration::from_secs(8),
        ..policy()
    };
    let mut window = Window::new(policy);
    let mut frontier = AckFrontier::new(Lsn(0));
    frontier.begin().expect("begin");
    let msg = Arc::new(OutboundMessage::bare("outbox.a", "a", Bytes::new(), Lsn(1)));
    window.push(msg, frontier.event().expect("ticket"), 0);
    let started = Instant::now();
    let no_stream = || {
        Err(PublishError::new(
            PublishErrorKind::NoStream,
            "no responders",
        ))
    };
    let mut outcome = window.on_attempt((0, no_stream()), || 5, &stats);
    while matches!(outcome, Outcome::Again) {
        window.settle(0);
        tokio::time::sleep_until(window.resend_at().expect("a round")).await;
        window.start_round(&stats).expect("the first failed");
        outcome = window.on_attempt((0, no_stream()), || 5, &stats);
    }
    assert!(matches!(outcome, Outcome::Refused(..)));
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(8),
        "at the end of the grace"
    );
}
