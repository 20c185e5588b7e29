//! A batch commit's answer, from either publish path, and what it means for the batch.

use std::error::Error as _;

use async_nats::jetstream;
use relay_core::stage::{PublishError, PublishErrorKind};
use tokio::time::{Duration, Instant};

use crate::error_codes::kind_for_error_code;
use crate::publisher::framing::{BatchAnswer, unknown};
use crate::publisher::path::CommitAnswer;

/// 10201: the batch holds a message id the stream already has (or one id twice).
pub(super) const BATCH_DUPLICATE: u64 = 10201;
/// 10174: the stream does not allow atomic publish.
pub(super) const BATCH_DISABLED: u64 = 10174;
/// 10177: a header the server does not allow in a batch (`Nats-Msg-Id` before 2.12.1).
pub(super) const BATCH_UNSUPPORTED_HEADER: u64 = 10177;
/// 10175: a batch message without `Nats-Batch-Sequence`.
pub(super) const BATCH_MISSING_SEQUENCE: u64 = 10175;
/// 10176: the server holds no complete batch under this id: a gap in its sequence, an id it
/// still holds open for a batch abandoned mid-way, or a batch it timed out.
pub(super) const BATCH_INCOMPLETE: u64 = 10176;
/// 10179: the batch id is over 64 characters.
pub(super) const BATCH_INVALID_ID: u64 = 10179;
/// 10199: more messages than the server's `max_batch_size`.
pub(super) const BATCH_TOO_LARGE: u64 = 10199;
/// 10200: a `Nats-Batch-Commit` value the server does not know.
pub(super) const BATCH_INVALID_COMMIT: u64 = 10200;
/// 10210: the stream or the server has its most open batches already.
pub(super) const BATCH_TOO_MANY_OPEN: u64 = 10210;
/// The stream's last sequence is not the one the batch's first message names: nothing stored.
pub(super) const WRONG_LAST_SEQUENCE: u64 = 10071;

/// How long "no responders" (a leader election) is retried before it counts as no stream, as
/// the pipeline's `no_stream_grace` default.
const NO_STREAM_GRACE: Duration = Duration::from_secs(30);

/// What the server answered to a batch's commit, from either path.
#[derive(Debug)]
pub(super) enum CommitOutcome {
    /// A PubAck: the batch's id and size when the server stored it as a batch.
    Stored {
        stream: String,
        /// The JetStream domain of the stream (`None`: none).
        domain: Option<String>,
        seq: u64,
        duplicate: bool,
        batch_id: Option<String>,
        batch_size: Option<u64>,
    },
    /// A JetStream API error with its error code.
    Refused { code: u64, error: PublishError },
    /// No answer (a timeout, a lost connection) or a 503.
    Failed(PublishError),
}

impl CommitOutcome {
    /// The outcome the answer of either path says.
    pub(super) fn from_answer(answer: CommitAnswer) -> Self {
        match answer {
            CommitAnswer::Lean(outcome) => Self::from_lean(outcome),
            CommitAnswer::AsyncNats(outcome) => Self::from_nats(outcome),
        }
    }

    /// The outcome async-nats reports.
    pub(super) fn from_nats(
        outcome: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
    ) -> Self {
        match outcome {
            Ok(ack) => Self::Stored {
                stream: ack.stream,
                domain: Some(ack.domain).filter(|d| !d.is_empty()),
                seq: ack.sequence,
                duplicate: ack.duplicate,
                batch_id: ack.batch_id,
                batch_size: ack.batch_size,
            },
            Err(error) => {
                let code = error
                    .source()
                    .and_then(|s| s.downcast_ref::<jetstream::Error>())
                    .map(|e| e.error_code().0);
                let error = crate::publisher::classify(error);
                match code {
                    Some(code) => Self::Refused { code, error },
                    None => Self::Failed(error),
                }
            }
        }
    }

    /// The outcome an answer on the lean connection says.
    pub(super) fn from_lean(outcome: crate::wire::RawOutcome) -> Self {
        let payload = match outcome {
            Ok(payload) => payload,
            Err(error) => return Self::Failed(crate::wire::publish_error(error)),
        };
        let unreadable = |why: &str| {
            Self::Failed(unknown(&format!(
                "the answer to an atomic batch's commit is {why}: {}",
                String::from_utf8_lossy(&payload[..payload.len().min(200)])
            )))
        };
        let Ok(answer) = serde_json::from_slice::<BatchAnswer>(&payload) else {
            return unreadable("not JSON");
        };
        if let Some(error) = answer.error {
            return Self::Refused {
                code: error.err_code,
                error: PublishError::new(
                    kind_for_error_code(error.err_code),
                    format!(
                        "{} (status {}, error code {})",
                        error.description, error.code, error.err_code
                    ),
                ),
            };
        }
        match (answer.stream, answer.seq) {
            (Some(stream), Some(seq)) => Self::Stored {
                stream,
                domain: answer.domain.filter(|d| !d.is_empty()),
                seq,
                duplicate: answer.duplicate,
                batch_id: answer.batch,
                batch_size: answer.count,
            },
            _ => unreadable("not a PubAck"),
        }
    }
}

impl CommitOutcome {
    /// This outcome for a batch published into `expected_stream` where `[nats] domain` is
    /// `expected_domain`: a commit answer naming another stream (another client answering the
    /// reply subject, or another stream capturing the subject) or another domain's stream is
    /// refused (the relay stops before its transaction), as a single PubAck is.
    pub(super) fn expecting(self, expected_stream: &str, expected_domain: Option<&str>) -> Self {
        match self {
            Self::Stored {
                ref stream,
                ref domain,
                ..
            } => {
                if stream != expected_stream {
                    return Self::Failed(crate::wire::other_stream(expected_stream, stream));
                }
                match crate::domain::check_ack_domain(expected_domain, stream, domain.as_deref()) {
                    Ok(()) => self,
                    Err(error) => Self::Failed(error),
                }
            }
            other => other,
        }
    }
}

/// What a commit's outcome means for the batch.
#[derive(Debug)]
pub(super) enum Verdict {
    /// Committed: every member is stored, in consecutive sequences ending at `seq`.
    Committed { seq: u64, size: Option<u64> },
    /// A server that ignores batch headers stored each message as it came.
    StoredOneByOne { seq: u64, duplicate: bool },
    /// Refused whole because the stream has one of its ids: stored before.
    StoredBefore,
    /// The stream or server takes no batches (10174, 10177).
    NoBatches,
    /// Not committed, or the outcome is unknown: publish it again as a new batch.
    Again(PublishError),
    /// Refused for good; nothing of it is stored.
    Refused(PublishError),
}

/// What the outcome of the commit of batch `id` means; `since`: when the batch was first
/// found not committed (for the grace of "no responders").
pub(super) fn judge(id: &str, outcome: CommitOutcome, since: Instant) -> Verdict {
    let (code, error) = match outcome {
        CommitOutcome::Stored {
            seq,
            batch_id,
            batch_size,
            ..
        } if batch_id.as_deref() == Some(id) => {
            return Verdict::Committed {
                seq,
                size: batch_size,
            };
        }
        CommitOutcome::Stored { seq, duplicate, .. } => {
            return Verdict::StoredOneByOne { seq, duplicate };
        }
        CommitOutcome::Refused { code, error } => (Some(code), error),
        CommitOutcome::Failed(error) => (None, error),
    };
    let refused = |fix: &str| {
        Verdict::Refused(PublishError::new(
            PublishErrorKind::Rejected,
            format!(
                "JetStream refused atomic batch {id} ({}): {fix}",
                error.message
            ),
        ))
    };
    match code {
        Some(BATCH_DUPLICATE) => Verdict::StoredBefore,
        Some(WRONG_LAST_SEQUENCE) => Verdict::Refused(PublishError::new(
            PublishErrorKind::OutOfTurn,
            format!(
                "atomic batch {id} refused out of turn: the event before it is not the stream's last ({})",
                error.message
            ),
        )),
        Some(BATCH_DISABLED | BATCH_UNSUPPORTED_HEADER) => Verdict::NoBatches,
        Some(BATCH_INCOMPLETE | BATCH_MISSING_SEQUENCE | BATCH_TOO_MANY_OPEN) => {
            Verdict::Again(error)
        }
        Some(BATCH_TOO_LARGE) => refused(
            "the server's jetstream max_batch_size is below the relay's batch size, min(1000, [relay] max_in_flight); set max_in_flight at or below the server's max_batch_size",
        ),
        Some(BATCH_INVALID_ID | BATCH_INVALID_COMMIT) => refused(
            "the server does not take this relay's batch headers; set [nats] publish_mode = \"per-message\" and report the server version",
        ),
        _ => match error.kind {
            PublishErrorKind::Unknown => Verdict::Again(error),
            PublishErrorKind::NoStream if since.elapsed() < NO_STREAM_GRACE => {
                Verdict::Again(error)
            }
            _ => Verdict::Refused(error),
        },
    }
}
