//! How a step of a replication session ends it ([`Stop`]): with a retry after a backoff, or
//! with an exit; and how a failure of the source, the store or PostgreSQL becomes one. Shared
//! by the session's own steps and the backfill at slot creation ([`super::on_create`]).

use relay_core::stage::{BoundaryError, ErrorClass};
use relay_postgres::PgError;

use super::SessionEnd;
use crate::failure::pg_failure;
use crate::failure::{Failure, FailureKind};

/// Why a step ended the session.
pub(super) enum Stop {
    /// Retry after a backoff (or, for a clean shutdown, stop).
    End(SessionEnd),
    /// End the relay with this failure.
    Fail(Failure),
}

impl From<Failure> for Stop {
    fn from(exit: Failure) -> Self {
        Self::Fail(exit)
    }
}

pub(super) type Step<T> = Result<T, Stop>;

pub(super) fn retry(error: impl Into<anyhow::Error>) -> Stop {
    Stop::End(SessionEnd::Retry(error.into()))
}

/// A source or store failure: retried, or an exit by its class.
pub(super) fn boundary(error: BoundaryError, context: Option<String>) -> Stop {
    let class = error.class;
    let error = match context {
        Some(context) => anyhow::Error::new(error).context(context),
        None => anyhow::Error::new(error),
    };
    match class {
        ErrorClass::Transient => retry(error),
        ErrorClass::SlotInUse => Stop::End(SessionEnd::SlotTaken(error)),
        ErrorClass::Fatal => Stop::Fail(Failure::new(FailureKind::Config, error)),
        ErrorClass::SlotLost => Stop::Fail(Failure::new(FailureKind::DataSafety, error)),
    }
}

/// A PostgreSQL failure outside the stream: retried when transient, else an exit.
pub(super) fn postgres(error: PgError) -> Stop {
    if error.is_transient() {
        retry(error)
    } else {
        Stop::Fail(pg_failure(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The retry's error text, or the exit's code and text.
    fn outcome(stop: Stop) -> Result<String, (FailureKind, String)> {
        match stop {
            Stop::End(SessionEnd::Retry(error)) => Ok(format!("{error:#}")),
            Stop::End(SessionEnd::SlotTaken(error)) => Ok(format!("taken: {error:#}")),
            Stop::End(SessionEnd::Shutdown) => Ok("shutdown".to_owned()),
            Stop::Fail(exit) => Err((exit.kind, format!("{:#}", exit.error))),
        }
    }

    #[test]
    fn a_boundary_error_is_retried_or_ends_by_its_class() {
        let transient = BoundaryError::new(ErrorClass::Transient, "stream ended at 0/16B3748");
        assert_eq!(
            outcome(boundary(transient, Some("slot relay_slot".to_owned()))),
            Ok("slot relay_slot: stream ended at 0/16B3748".to_owned())
        );
        let fatal = BoundaryError::new(ErrorClass::Fatal, "publication missing");
        assert_eq!(
            outcome(boundary(fatal, None)),
            Err((FailureKind::Config, "publication missing".to_owned()))
        );
        let taken = BoundaryError::new(ErrorClass::SlotInUse, "slot relay_slot is in use");
        assert_eq!(
            outcome(boundary(taken, None)),
            Ok("taken: slot relay_slot is in use".to_owned())
        );
        let lost = BoundaryError::new(ErrorClass::SlotLost, "slot relay_slot was invalidated");
        assert_eq!(
            outcome(boundary(lost, None)),
            Err((
                FailureKind::DataSafety,
                "slot relay_slot was invalidated".to_owned()
            ))
        );
    }

    #[test]
    fn a_postgres_error_is_retried_only_when_transient() {
        let unreachable = PgError::Unreachable {
            target: "db:5432/app".to_owned(),
            reason: "connection refused".to_owned(),
        };
        assert!(unreachable.is_transient(), "precondition");
        let text = unreachable.to_string();
        assert_eq!(outcome(postgres(unreachable)), Ok(text));

        let bad_url = PgError::BadUrl("postgres://[".to_owned());
        assert!(!bad_url.is_transient(), "precondition");
        let text = bad_url.to_string();
        assert_eq!(outcome(postgres(bad_url)), Err((FailureKind::Config, text)));
    }

    #[test]
    fn an_exit_becomes_a_stop_unchanged() {
        let stop = Stop::from(Failure::new(FailureKind::Internal, anyhow::anyhow!("bug")));
        assert_eq!(
            outcome(stop),
            Err((FailureKind::Internal, "bug".to_owned()))
        );
        assert_eq!(
            outcome(retry(anyhow::anyhow!("connection reset"))),
            Ok("connection reset".to_owned())
        );
    }
}

/// What to do about a transaction the relay stopped before, by cause: only a row's problem is
/// fixed by the mapping or parked by `[relay] dead_letter_subject` (and that one is suggested
/// only while it is not set); a broker's refusal is fixed on the NATS side.
pub(super) fn stop_advice(
    error: &relay_core::pipeline::PipelineError,
    dead_letter_set: bool,
) -> &'static str {
    use relay_core::pipeline::PipelineError;
    use relay_core::stage::PublishErrorKind;
    match error {
        PipelineError::Publish { error, .. } => match error.kind {
            PublishErrorKind::Collision if dead_letter_set => {
                "Two outbox rows share this event id: give new rows ids of their own and restart; the relay resumes there"
            }
            PublishErrorKind::Collision => {
                "Two outbox rows share this event id: give new rows ids of their own (or set [relay] dead_letter_subject to park the second one) and restart; the relay resumes there"
            }
            PublishErrorKind::NoStream => {
                "No stream answered for [relay] no_stream_grace: create the stream (or let the relay: [nats] create_stream = true), make it capture the subject, or bring its servers back, and restart; the relay resumes there"
            }
            _ => {
                "This is the broker's refusal, not the row's: the reason above says what to change on the NATS side (permissions, domain, stream, server limits); then restart, and the relay resumes there"
            }
        },
        // A dead letter carries the row itself: it is too large too, so the dead-letter subject
        // cannot park it, set or not.
        PipelineError::Route {
            error: relay_core::route::RouteError::TooLarge { .. },
            ..
        } => {
            "The row's message breaks a limit of the NATS server, and so would its dead letter (it carries the row): raise the limit the reason names (the server's max_payload or max_control_line) or map less of the row into the message, and restart; the relay resumes there"
        }
        _ if dead_letter_set => {
            "A committed row cannot change: fix the mapping and restart; the relay resumes there"
        }
        _ => {
            "A committed row cannot change: fix the mapping (or set [relay] dead_letter_subject) and restart; the relay resumes there"
        }
    }
}

#[cfg(test)]
mod advice_tests {
    use relay_core::Lsn;
    use relay_core::pipeline::PipelineError;
    use relay_core::stage::{PublishError, PublishErrorKind};

    use super::stop_advice;

    fn refused(kind: PublishErrorKind) -> PipelineError {
        PipelineError::Publish {
            event_id: "e".into(),
            subject: "outbox.x".into(),
            error: PublishError::new(kind, "why"),
        }
    }

    #[test]
    fn only_a_rows_problem_suggests_the_mapping_or_the_dead_letter_subject() {
        let denied = stop_advice(&refused(PublishErrorKind::Rejected), false);
        assert!(
            !denied.contains("dead_letter_subject") && !denied.contains("mapping"),
            "{denied}"
        );
        assert!(denied.contains("NATS side"), "{denied}");
        let grace = stop_advice(&refused(PublishErrorKind::NoStream), false);
        assert!(
            grace.contains("no_stream_grace") && !grace.contains("dead_letter"),
            "{grace}"
        );
        assert!(
            stop_advice(&refused(PublishErrorKind::Collision), false)
                .contains("dead_letter_subject")
        );
        assert!(
            !stop_advice(&refused(PublishErrorKind::Collision), true)
                .contains("dead_letter_subject")
        );
        let route = PipelineError::Route {
            event_id: None,
            xid: 1,
            commit_lsn: Lsn(1),
            error: relay_core::route::RouteError::UnknownRelation(7),
        };
        assert!(stop_advice(&route, false).contains("dead_letter_subject"));
        assert!(!stop_advice(&route, true).contains("dead_letter_subject"));
        let too_large = PipelineError::Route {
            event_id: Some("e".into()),
            xid: 1,
            commit_lsn: Lsn(1),
            error: relay_core::route::RouteError::TooLarge {
                table: "public.outbox".into(),
                event_id: "e".into(),
                origin: "column `payload`".into(),
                part: "payload".into(),
                reason: "over max_payload".into(),
            },
        };
        for dead_letter_set in [false, true] {
            let advice = stop_advice(&too_large, dead_letter_set);
            assert!(
                advice.contains("max_payload") && !advice.contains("dead_letter_subject"),
                "{advice}"
            );
        }
    }
}
