use super::*;
use crate::publisher::framing::BatchAnswer;

#[test]
fn answers_of_every_kind_parse() {
    let flow: BatchAnswer =
        serde_json::from_slice(br#"{"type":"ack","seq":40,"msgs":10}"#).unwrap();
    assert_eq!((flow.kind.as_deref(), flow.seq), (Some("ack"), Some(40)));
    let ack: BatchAnswer =
        serde_json::from_slice(br#"{"stream":"OUTBOX","seq":1200,"batch":"abc","count":37}"#)
            .unwrap();
    assert_eq!(
        (ack.kind, ack.seq, ack.count, ack.batch.as_deref()),
        (None, Some(1200), Some(37), Some("abc"))
    );
    let dup: BatchAnswer = serde_json::from_slice(
        br#"{"stream":"OUTBOX","seq":7,"duplicate": true,"batch":"abc","count":1}"#,
    )
    .unwrap();
    assert!(dup.duplicate);
    let refused: BatchAnswer = serde_json::from_slice(
        br#"{"error":{"code":400,"err_code":10205,"description":"batch publish is disabled"},"stream":"OUTBOX","seq":0}"#,
    )
    .unwrap();
    assert_eq!(refused.error.unwrap().err_code, FAST_BATCH_DISABLED);
}
