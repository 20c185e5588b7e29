//! One SQLSTATE table for every error PostgreSQL sends the relay: on plain sessions
//! (tokio-postgres, which hands over the server's fields) and on the replication session
//! (pgwire-replication, which hands over only text). The server translates its messages
//! (`lc_messages`), never the SQLSTATE, so nothing here reads the message.

use pgwire_replication::PgWireError;

/// What a SQLSTATE means to the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlStateKind {
    /// Retrying on a new session can help: connection exception (class 08), shutdown or
    /// restart in progress (57P01–57P03), statement timeout or cancel (57014), insufficient
    /// resources (53), system error (58, e.g. a WAL segment not there yet), serialization
    /// failure (40001), deadlock (40P01), lock not available (55P03), read-only transaction
    /// (25006: a standby during a failover).
    Transient,
    /// The login was refused: invalid authorization (class 28) or unknown database (3D000).
    LoginRefused,
    /// 42704 undefined_object: a named object (a replication slot, a publication) does not
    /// exist.
    UndefinedObject,
    /// 55000 object_not_in_prerequisite_state: the object cannot be used as it is (an
    /// invalidated replication slot, a slot of another kind or database).
    NotInPrerequisiteState,
    /// 55006 object_in_use: another process uses it (a replication slot being streamed).
    ObjectInUse,
    /// 42710 duplicate_object: it exists already (a replication slot another relay created a
    /// moment before).
    DuplicateObject,
    /// Anything else (privileges, bad data, internal errors): an operator must act.
    Other,
}

impl SqlStateKind {
    /// The kind of a five-character SQLSTATE.
    pub fn of(code: &str) -> Self {
        match code {
            "57P01" | "57P02" | "57P03" | "57014" | "40001" | "40P01" | "55P03" | "25006" => {
                Self::Transient
            }
            "42704" => Self::UndefinedObject,
            "55000" => Self::NotInPrerequisiteState,
            "55006" => Self::ObjectInUse,
            "42710" => Self::DuplicateObject,
            "3D000" => Self::LoginRefused,
            _ if ["08", "53", "58"]
                .iter()
                .any(|class| code.starts_with(class)) =>
            {
                Self::Transient
            }
            _ if code.starts_with("28") => Self::LoginRefused,
            _ => Self::Other,
        }
    }
}

/// Whether a failed statement on an established session is worth retrying on a new session:
/// the connection broke, or the SQLSTATE is [`SqlStateKind::Transient`]. Everything else
/// (privileges, missing objects, bad data) needs an operator.
pub fn is_transient_query_error(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.as_db_error() {
        Some(db) => SqlStateKind::of(db.code().code()) == SqlStateKind::Transient,
        None => true,
    }
}

/// The SQLSTATE of a server error on the replication session. pgwire-replication passes the
/// server's ErrorResponse on as text only, `"<message> (SQLSTATE <code>)"`; this is the one
/// place that reads the code back out of it.
pub(crate) fn wire_sqlstate(error: &PgWireError) -> Option<&str> {
    let PgWireError::Server(text) = error else {
        return None;
    };
    let (_, tail) = text.rsplit_once("(SQLSTATE ")?;
    let code = tail.strip_suffix(')')?;
    let valid = code.len() == 5
        && code
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase());
    valid.then_some(code)
}

/// When an error reached the replication session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicationPhase {
    /// Logging in, or the answer to START_REPLICATION (the slot is acquired here).
    Start,
    /// After the server started streaming (the output plugin reads the publication here).
    Streaming,
}

/// What a failure of the replication session means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicationErrorKind {
    /// 42704 at START_REPLICATION: the slot does not exist.
    SlotMissing,
    /// 55000: the slot cannot be used, in practice because it was invalidated.
    SlotInvalidated,
    /// 55006: another process streams the slot.
    SlotInUse,
    /// 42704 while streaming: the publication does not exist at the WAL being decoded.
    PublicationMissing,
    /// The login was refused (SQLSTATE class 28, 3D000, or an authentication or TLS failure).
    LoginRefused,
    /// The connection broke or the server said to retry.
    Transient,
    /// Any other server error: an operator must act.
    Fatal,
}

/// Classifies a replication-session error by its SQLSTATE (never by its message) and the
/// phase it arrived in.
pub(crate) fn replication_error_kind(
    error: &PgWireError,
    phase: ReplicationPhase,
) -> ReplicationErrorKind {
    use ReplicationErrorKind as K;
    if error.is_auth() || error.is_tls() {
        return K::LoginRefused;
    }
    let Some(code) = wire_sqlstate(error) else {
        // I/O, a worker that ended, a protocol error: a new session may work.
        return K::Transient;
    };
    match (SqlStateKind::of(code), phase) {
        (SqlStateKind::UndefinedObject, ReplicationPhase::Start) => K::SlotMissing,
        (SqlStateKind::UndefinedObject, ReplicationPhase::Streaming) => K::PublicationMissing,
        (SqlStateKind::NotInPrerequisiteState, _) => K::SlotInvalidated,
        (SqlStateKind::ObjectInUse, _) => K::SlotInUse,
        (SqlStateKind::LoginRefused, _) => K::LoginRefused,
        (SqlStateKind::Transient, _) => K::Transient,
        (SqlStateKind::Other | SqlStateKind::DuplicateObject, _) => K::Fatal,
    }
}

/// Whether evaluating an expression failed on the expression itself, not on the server or the
/// session: syntax or name errors (class 42: an unknown column, function or operator, a type
/// mismatch; not 42501, a missing privilege) and data exceptions (class 22: a cast that fails).
pub(crate) fn is_expression_mismatch(code: &tokio_postgres::error::SqlState) -> bool {
    let code = code.code();
    (code.starts_with("42") && code != "42501") || code.starts_with("22")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplicationErrorKind as K;
    use ReplicationPhase::{Start, Streaming};

    /// Error texts as pgwire-replication builds them from the ErrorResponse frames of a
    /// PostgreSQL 15 with German messages: the first two captured by the e2e test
    /// `localized::slot_dropped_or_invalidated_under_german_messages_exits_65_at_once`, the
    /// others from the same server's message catalog (postgres-15.mo).
    const GERMAN: [(&str, ReplicationPhase, ReplicationErrorKind); 8] = [
        (
            "Replikations-Slot »relay_slot« existiert nicht (SQLSTATE 42704)",
            Start,
            K::SlotMissing,
        ),
        (
            "kann nicht aus logischem Replikations-Slot »relay_slot« lesen (SQLSTATE 55000)",
            Start,
            K::SlotInvalidated,
        ),
        (
            "aus Replikations-Slot »relay_slot« können keine Änderungen mehr gelesen werden (SQLSTATE 55000)",
            Start,
            K::SlotInvalidated,
        ),
        (
            "Replikations-Slot »relay_slot« ist aktiv für PID 4242 (SQLSTATE 55006)",
            Start,
            K::SlotInUse,
        ),
        (
            "Publikation »relay_pub« existiert nicht (SQLSTATE 42704)",
            Streaming,
            K::PublicationMissing,
        ),
        (
            "Verbindung wird abgebrochen aufgrund von Anweisung des Administrators (SQLSTATE 57P01)",
            Streaming,
            K::Transient,
        ),
        (
            "Passwort-Authentifizierung für Benutzer »relay« fehlgeschlagen (SQLSTATE 28P01)",
            Start,
            K::LoginRefused,
        ),
        (
            "nur Superuser und Replikationsrollen können WAL-Sender starten (SQLSTATE 42501)",
            Start,
            K::Fatal,
        ),
    ];

    #[test]
    fn replication_errors_are_classified_by_sqlstate_in_any_language() {
        for (text, phase, kind) in GERMAN {
            let error = PgWireError::Server(text.to_owned());
            assert_eq!(replication_error_kind(&error, phase), kind, "{text}");
        }
    }

    #[test]
    fn sqlstate_is_read_only_from_the_end() {
        let read = |t: &str| wire_sqlstate(&PgWireError::Server(t.to_owned())).map(str::to_owned);
        assert_eq!(read("x (SQLSTATE 55006)").as_deref(), Some("55006"));
        assert_eq!(
            read("(SQLSTATE 42704) in text (SQLSTATE 57P01)").as_deref(),
            Some("57P01")
        );
        assert_eq!(read("x (SQLSTATE 42704) trailing"), None);
        assert_eq!(read("x (SQLSTATE 4270)"), None);
        assert_eq!(read("unknown server error"), None);
        assert_eq!(
            replication_error_kind(&PgWireError::Server("kaputt".into()), Start),
            K::Transient
        );
        assert_eq!(
            replication_error_kind(&PgWireError::Auth("x".into()), Start),
            K::LoginRefused
        );
        let io = PgWireError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(replication_error_kind(&io, Streaming), K::Transient);
    }

    #[test]
    fn one_table_for_plain_and_replication_sessions() {
        for code in [
            "57P01", "57P02", "57P03", "57014", "08006", "53300", "58P01", "40001",
        ] {
            assert_eq!(SqlStateKind::of(code), SqlStateKind::Transient, "{code}");
        }
        for code in ["28P01", "28000", "3D000"] {
            assert_eq!(SqlStateKind::of(code), SqlStateKind::LoginRefused, "{code}");
        }
        for code in ["42501", "42P01", "XX000", "22023"] {
            assert_eq!(SqlStateKind::of(code), SqlStateKind::Other, "{code}");
        }
    }
}
