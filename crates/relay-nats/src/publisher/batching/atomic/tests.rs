use relay_core::Lsn;
use relay_core::stage::PublishErrorKind;
use tokio::time::Instant;

use super::outcome::*;
use super::*;

/// With `[nats] domain`, a batch stored in another domain's stream (or one without a
/// domain) is refused for good, as a single PubAck is; one from the domain commits.
#[test]
fn a_commit_from_another_domain_is_refused() {
    let answer = |domain: &str| {
        CommitOutcome::from_lean(Ok(bytes::Bytes::from(format!(
            r#"{{"stream":"OUTBOX"{domain},"seq":7,"batch":"b-1","count":2}}"#
        ))))
    };
    let from_leaf = || answer(r#","domain":"leaf""#);
    let since = Instant::now();
    for outcome in [
        from_leaf().expecting("OUTBOX", None),
        from_leaf().expecting("OUTBOX", Some("leaf")),
        answer("").expecting("OUTBOX", None),
    ] {
        assert!(
            matches!(
                judge("b-1", outcome, since),
                Verdict::Committed { seq: 7, .. }
            ),
            "stored in the expected domain"
        );
    }
    for outcome in [
        from_leaf().expecting("OUTBOX", Some("hub")),
        answer("").expecting("OUTBOX", Some("hub")),
    ] {
        match judge("b-1", outcome, since) {
            Verdict::Refused(error) => {
                assert_eq!(error.kind, PublishErrorKind::Rejected);
                assert!(error.message.contains("[nats] domain = \"hub\""), "{error}");
            }
            other => panic!("not refused: {other:?}"),
        }
    }
}

/// A commit answer naming another stream (another client answering first) is refused for
/// good, never taken for the batch's commit.
#[test]
fn a_commit_answer_naming_another_stream_is_refused() {
    let forged = CommitOutcome::from_lean(Ok(bytes::Bytes::from_static(
        br#"{"stream":"FORGED","seq":7,"batch":"b-1","count":2}"#,
    )));
    match judge("b-1", forged.expecting("OUTBOX", None), Instant::now()) {
        Verdict::Refused(error) => {
            assert_eq!(error.kind, PublishErrorKind::Rejected);
            assert!(error.message.contains("`FORGED`"), "{error}");
        }
        other => panic!("a forged commit answer was taken: {other:?}"),
    }
}

/// The lean connection's batch header names are async-nats' (and ADR-50's).
#[test]
fn batch_header_names_are_the_protocol_names() {
    use async_nats::header::{NATS_BATCH_COMMIT, NATS_BATCH_ID, NATS_BATCH_SEQUENCE};
    assert_eq!(BATCH_ID, NATS_BATCH_ID.to_string());
    assert_eq!(BATCH_SEQUENCE, NATS_BATCH_SEQUENCE.to_string());
    assert_eq!(BATCH_COMMIT, NATS_BATCH_COMMIT.to_string());
}

/// An answer on the lean connection reads as the same outcome async-nats reports: a
/// commit's PubAck with its batch, an API error with its code, and what is not a PubAck.
#[test]
fn lean_commit_answers_read_as_outcomes() {
    let stored = CommitOutcome::from_lean(Ok(bytes::Bytes::from_static(
        br#"{"stream":"OUTBOX","seq":12,"batch":"b-1","count":3}"#,
    )));
    assert!(
        matches!(&stored, CommitOutcome::Stored { seq: 12, batch_size: Some(3), batch_id: Some(id), duplicate: false, .. } if id == "b-1"),
        "{stored:?}"
    );
    let since = Instant::now();
    assert!(matches!(
        judge("b-1", stored, since),
        Verdict::Committed {
            seq: 12,
            size: Some(3)
        }
    ));
    for (code, committed_never) in [
        (BATCH_INCOMPLETE, "again"),
        (BATCH_TOO_MANY_OPEN, "again"),
        (BATCH_MISSING_SEQUENCE, "again"),
        (BATCH_DUPLICATE, "before"),
        (BATCH_DISABLED, "none"),
        (BATCH_TOO_LARGE, "refused"),
    ] {
        let answer = format!(
            r#"{{"error":{{"code":400,"err_code":{code},"description":"x"}},"stream":"OUTBOX","seq":0}}"#
        );
        let outcome = CommitOutcome::from_lean(Ok(answer.into()));
        let verdict = judge("b-1", outcome, since);
        let got = match verdict {
            Verdict::Again(_) => "again",
            Verdict::StoredBefore => "before",
            Verdict::NoBatches => "none",
            Verdict::Refused(_) => "refused",
            _ => "other",
        };
        assert_eq!(got, committed_never, "error code {code}");
    }
    for not_an_ack in [&b"nonsense"[..], br#"{"seq":3}"#] {
        let outcome = CommitOutcome::from_lean(Ok(bytes::Bytes::copy_from_slice(not_an_ack)));
        assert!(
            matches!(judge("b-1", outcome, since), Verdict::Again(_)),
            "{not_an_ack:?}: its outcome is unknown, the batch goes again"
        );
    }
    let per_message = CommitOutcome::from_lean(Ok(bytes::Bytes::from_static(
        br#"{"stream":"OUTBOX","seq":4}"#,
    )));
    assert!(matches!(
        judge("b-1", per_message, since),
        Verdict::StoredOneByOne {
            seq: 4,
            duplicate: false
        }
    ));
}

/// An id never repeats in a process, differs between two processes' minters (a restarted
/// or standby relay), names its transaction and part, and fits the server's 64 characters.
#[test]
fn batch_ids_never_repeat_and_fit_the_server() {
    let (dead, restarted) = (BatchIds::new(), BatchIds::new());
    assert_ne!(dead.run, restarted.run);
    let lsn = Lsn(0x1_0000_2000);
    let first = dead.mint(lsn, 0);
    assert!(first.starts_with("1-2000-0-"), "{first}");
    assert_ne!(
        dead.mint(lsn, 0),
        first,
        "the same transaction again: a new id"
    );
    assert_ne!(restarted.mint(lsn, 0), first);
    let longest = BatchIds {
        run: 0xFFFF_FFFF_FFFF,
        next: u64::MAX.into(),
    }
    .mint(Lsn(u64::MAX), u32::MAX);
    assert!(
        longest.len() <= 64,
        "{longest}: {} characters",
        longest.len()
    );
}
