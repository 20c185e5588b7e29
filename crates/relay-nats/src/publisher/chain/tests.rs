use std::time::Duration;

use super::*;

fn chain() -> Arc<Chain> {
    Arc::new(Chain::default())
}

/// A conditional batch opening in a task of its own, asserted to be waiting still after a
/// moment (`why` names what it must not pass); its result is the base it was given.
async fn waiting_batch(
    chain: &Arc<Chain>,
    why: &str,
) -> tokio::task::JoinHandle<Result<Option<u64>, NoBase>> {
    let waiting = tokio::spawn({
        let chain = chain.clone();
        async move { chain.open_batch(true).await.map(|link| link.base) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "{why}");
    waiting
}

#[tokio::test]
async fn a_batch_after_an_unsettled_one_names_the_predicted_sequence() {
    let chain = chain();
    // Nothing known yet: the first batch goes without a condition.
    let mut first = chain.open_batch(false).await.unwrap();
    assert_eq!(first.base, None);
    chain.close(&mut first, 3);
    first.answered(Some((10, false)));
    // Everything answered: the next starts from the last sequence seen.
    let mut second = chain.open_batch(true).await.unwrap();
    assert_eq!(second.base, Some(10));
    chain.close(&mut second, 5);
    // In flight: the third is chained on the second's predicted end.
    let mut third = chain.open_batch(true).await.unwrap();
    assert_eq!(third.base, Some(15));
    chain.close(&mut third, 2);
    second.answered(Some((15, false)));
    let mut fourth = chain.open_batch(true).await.unwrap();
    assert_eq!(fourth.base, Some(17));
    chain.close(&mut fourth, 1);
}

#[tokio::test]
async fn a_conditional_batch_waits_for_what_is_in_flight_when_nothing_is_predicted() {
    let chain = chain();
    let mut first = chain.open_batch(false).await.unwrap();
    chain.close(&mut first, 4);
    // The first batch's base was unknown: the next must wait for its answer.
    let waiting = waiting_batch(&chain, "a batch went before its base was known").await;
    first.answered(Some((8, false)));
    assert_eq!(waiting.await.unwrap().unwrap(), Some(8));
}

#[tokio::test]
async fn a_failure_a_duplicate_or_another_writer_forgets_the_prediction() {
    for stored in [None, Some((12, true)), Some((13, false))] {
        let chain = chain();
        let mut first = chain.open_batch(false).await.unwrap();
        chain.close(&mut first, 2);
        first.answered(Some((10, false)));
        let mut second = chain.open_batch(true).await.unwrap();
        chain.close(&mut second, 2);
        // Predicted end 12; the answer differs (or there is none).
        second.answered(stored);
        let third = chain.open_batch(true).await;
        match stored {
            // Failed: its messages are missing until re-sent, so nothing tells where the next
            // one's predecessor is.
            None => assert!(matches!(third, Err(NoBase))),
            Some((seq, _)) => assert_eq!(third.unwrap().base, Some(seq)),
        }
    }
}

#[tokio::test]
async fn a_conditional_batch_with_nothing_known_is_refused_unsent() {
    let chain = chain();
    assert!(matches!(chain.open_batch(true).await, Err(NoBase)));
    // A message of the pipeline's re-send is counted while it is in flight, then teaches the
    // sequence.
    let link = chain.alone(true);
    let ack: BoxFuture<'static, Result<PubReceipt, PublishError>> = Box::pin(async {
        Ok(PubReceipt {
            stream_seq: 21,
            duplicate: false,
        })
    });
    let answered = link.follow(ack);
    let waiting = waiting_batch(&chain, "a batch went past a re-send in flight").await;
    answered.await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), Some(21));
}

#[tokio::test]
async fn a_message_on_its_own_inside_an_open_batch_unsettles_the_prediction() {
    let chain = chain();
    let mut first = chain.open_batch(false).await.unwrap();
    chain.close(&mut first, 1);
    first.answered(Some((5, false)));
    let mut batch = chain.open_batch(true).await.unwrap();
    assert_eq!(batch.base, Some(5));
    let mut alone = chain.alone(false);
    chain.close(&mut batch, 3);
    // Closed with the message inside: nothing predicted past it.
    let next = waiting_batch(&chain, "a batch went on a prediction the message broke").await;
    // The message is stored first, the batch's condition (5) fails: the batch is missing.
    alone.answered(Some((6, false)));
    batch.answered(None);
    assert!(matches!(next.await.unwrap(), Err(NoBase)));
}

#[tokio::test]
async fn a_link_dropped_unanswered_counts_as_failed() {
    let chain = chain();
    let mut first = chain.open_batch(false).await.unwrap();
    chain.close(&mut first, 1);
    first.answered(Some((3, false)));
    let mut second = chain.open_batch(true).await.unwrap();
    chain.close(&mut second, 1);
    drop(second);
    // Not waiting for ever on the dropped one, and not trusting its predicted end.
    let third = tokio::time::timeout(Duration::from_secs(1), chain.open_batch(true))
        .await
        .expect("waited on a dropped link");
    assert!(matches!(third, Err(NoBase)));
    // A batch whose predecessors are all stored starts the chain again.
    assert_eq!(chain.open_batch(false).await.unwrap().base, None);
}

#[tokio::test]
async fn a_batch_after_a_failed_message_waits_for_its_re_send_before_starting_from_the_last_sequence()
 {
    let chain = chain();
    let mut first = chain.open_batch(false).await.unwrap();
    chain.close(&mut first, 4);
    // A message on its own after the batch fails: the pipeline will re-send it.
    let mut lost = chain.alone(false);
    lost.answered(None);
    first.answered(Some((20, false)));
    // Nothing in flight, but the failed one is not stored: no base at 20.
    assert!(matches!(chain.open_batch(true).await, Err(NoBase)));
    // The pipeline's re-send is stored at 21: the chain starts from there.
    let mut resent = chain.alone(true);
    resent.answered(Some((21, false)));
    assert_eq!(chain.open_batch(true).await.unwrap().base, Some(21));
}

#[tokio::test]
async fn a_fast_batch_stored_in_part_forgets_the_prediction_and_counts_what_failed() {
    let chain = chain();
    let mut first = chain.open_batch(false).await.unwrap();
    first.close(3);
    first.answered(Some((3, false)));
    // Five sent, two stored (a gap): the last stored is at 5, three failed.
    let mut batch = chain.open_batch(true).await.unwrap();
    assert_eq!(batch.base, Some(3));
    batch.close(5);
    batch.settle(Some((5, false)), 3);
    // The three are missing until the pipeline re-sends them: no base at 5.
    assert!(matches!(chain.open_batch(true).await, Err(NoBase)));
    for seq in 6..=8 {
        chain.alone(true).answered(Some((seq, false)));
    }
    assert_eq!(chain.open_batch(true).await.unwrap().base, Some(8));
}

#[tokio::test]
async fn a_message_on_a_sequence_ordered_stream_names_its_predecessor_s_sequence() {
    let chain = chain();
    let mut first = chain.message(false, false).await.unwrap();
    assert_eq!(first.base, None);
    first.answered(Some((7, false)));
    let second = chain.message(true, false).await.unwrap();
    let third = chain.message(true, false).await.unwrap();
    assert_eq!((second.base, third.base), (Some(7), Some(8)));
    // The second fails: the third's answer cannot make a base for the next.
    drop(second);
    drop(third);
    assert!(matches!(chain.message(true, false).await, Err(NoBase)));
    // The pipeline's first re-send goes without a condition and ends what was missing.
    let mut probe = chain.message(false, true).await.unwrap();
    probe.answered(Some((8, false)));
    assert_eq!(chain.message(true, true).await.unwrap().base, Some(8));
}
