//! Each consumer of the stream whose filter covers the event's subject, and where it is with
//! the event's message; and the consumer libraries' ledger, which records an event as applied
//! in the transaction of its effect.

use async_nats::jetstream;
use futures::TryStreamExt as _;
use outbox_contract::{HEADER_DLQ_CONSUMER, HEADER_DLQ_EVENT_ID};
use relay_core::subject::subject_matches;
use serde::Serialize;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::stream::{DeadLetter, Scan, header};

/// Where a consumer is with the message.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Delivery {
    /// Its ack floor is at or past the message: acknowledged (or terminated: a consumer that
    /// parks a message acknowledges it with TERM).
    Acknowledged,
    /// Delivered and not yet acknowledged (or acknowledged after a later one).
    InFlight {
        /// Messages it holds unacknowledged.
        ack_pending: usize,
        /// Messages it delivered more than once.
        redelivered: usize,
    },
    /// Not delivered yet: this many stream sequences lie between its last delivery and the
    /// message (not all of them on its filter).
    NotReached { sequences_before: u64 },
    /// Acknowledged with TERM after the consumer library published it to its dead-letter
    /// subject (`dlq.<service>` unless the service set another): not applied.
    Parked {
        /// Where the parked copy is.
        stream: String,
        subject: String,
        sequence: u64,
        /// Why the service parked it.
        reason: String,
    },
}

/// Where the consumer libraries' parked copies are looked for, and how far.
#[derive(Debug, Clone)]
pub struct ParkedSearch<'a> {
    /// Dead-letter subjects besides each consumer's default `dlq.<consumer>`.
    pub subjects: &'a [String],
    /// Messages read at most per subject.
    pub max_scan: u64,
    pub deadline: tokio::time::Instant,
}

/// One consumer and the message.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerStep {
    pub name: String,
    /// Its filter subjects (none: every subject).
    pub filters: Vec<String>,
    /// The stream sequence of its ack floor.
    pub ack_floor: u64,
    /// The stream sequence it delivered last.
    pub delivered: u64,
    pub delivery: Delivery,
}

/// A ledger row: the event applied by a service.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    /// The service (the consumer libraries' `service` name).
    pub consumer: String,
    pub applied_at: String,
    pub stream_seq: i64,
    pub subject: String,
}

/// The consumers of `stream` whose filter covers `subject`, each with where it is with the
/// message of `event_id` at `sequence`.
pub async fn of_message(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    sequence: u64,
    event_id: &str,
    parked: &ParkedSearch<'_>,
) -> anyhow::Result<Vec<ConsumerStep>> {
    let stream = js.get_stream(stream).await?;
    let infos: Vec<jetstream::consumer::Info> = stream.consumers().try_collect().await?;
    let mut steps = Vec::new();
    // Readers without a durable name (`tail`, the console, ordered consumers) come and go and
    // keep no position for a service.
    for info in infos
        .into_iter()
        .filter(|i| i.config.durable_name.is_some())
    {
        let filters = filters_of(&info);
        if !filters.is_empty() && !filters.iter().any(|f| subject_matches(f, subject)) {
            continue;
        }
        let ack_floor = info.ack_floor.stream_sequence;
        let delivered = info.delivered.stream_sequence;
        let delivery = if ack_floor >= sequence {
            parked_copy(js, &info.name, event_id, parked)
                .await?
                .unwrap_or(Delivery::Acknowledged)
        } else if delivered >= sequence {
            Delivery::InFlight {
                ack_pending: info.num_ack_pending,
                redelivered: info.num_redelivered,
            }
        } else {
            Delivery::NotReached {
                sequences_before: sequence - delivered - 1,
            }
        };
        steps.push(ConsumerStep {
            name: info.name.clone(),
            filters,
            ack_floor,
            delivered,
            delivery,
        });
    }
    steps.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(steps)
}

/// A consumer's filter subjects (none: every subject).
pub fn filters_of(info: &jetstream::consumer::Info) -> Vec<String> {
    let mut filters = info.config.filter_subjects.clone();
    if !info.config.filter_subject.is_empty() {
        filters.push(info.config.filter_subject.clone());
    }
    filters
}

/// The copy of `event_id` a consumer library parked for service `consumer` (its default
/// dead-letter subject `dlq.<consumer>`, and `parked.subjects`), if one is in a stream.
async fn parked_copy(
    js: &jetstream::Context,
    consumer: &str,
    event_id: &str,
    parked: &ParkedSearch<'_>,
) -> anyhow::Result<Option<Delivery>> {
    let default = format!("dlq.{consumer}");
    for subject in std::iter::once(&default).chain(parked.subjects) {
        // No stream captures the subject: nothing parked there.
        let Ok(name) = js.stream_by_subject(subject.as_str()).await else {
            continue;
        };
        let mut stream = js.get_stream(&name).await?;
        let state = stream.info().await?.state.clone();
        let scan = Scan {
            start: state.first_sequence,
            last: state.last_sequence,
            max: parked.max_scan,
            deadline: parked.deadline,
        };
        let (hit, _) = scan
            .run(&stream, subject, true, |m| {
                header(m, HEADER_DLQ_EVENT_ID) == Some(event_id)
                    && header(m, HEADER_DLQ_CONSUMER) == Some(consumer)
            })
            .await?;
        if let Some(sequence) = hit {
            let copy = DeadLetter::read(&stream, sequence).await?;
            return Ok(Some(Delivery::Parked {
                stream: name,
                subject: subject.clone(),
                sequence,
                reason: copy.reason,
            }));
        }
    }
    Ok(None)
}

/// The ledger's rows for `event_id`: in the relay's database, or at `ledger_url`.
pub async fn ledger(
    relay_db: &Client,
    ledger_url: Option<&str>,
    event_id: &str,
) -> Result<Vec<Applied>, String> {
    let own;
    let client = match ledger_url {
        None => relay_db,
        Some(url) => {
            // Nothing of the relay's own connection (its password, its certificates) goes to
            // another database: the URL says all.
            let mut settings = relay_postgres::PostgresSettings::default();
            settings.url = url.to_owned();
            own = relay_postgres::connect(&settings)
                .await
                .map_err(|e| format!("cannot connect to the ledger database: {e}"))?;
            &own
        }
    };
    let rows = client
        .query(
            "SELECT consumer, applied_at::text, stream_seq, subject FROM outbox_consumer_ledger \
             WHERE event_id = $1 ORDER BY applied_at",
            &[&event_id],
        )
        .await
        .map_err(|e| match e.code() {
            Some(code) if *code == SqlState::UNDEFINED_TABLE => {
                "no outbox_consumer_ledger table in this database: give --ledger-url with the consumers' database".to_owned()
            }
            _ => format!("cannot read outbox_consumer_ledger: {e}"),
        })?;
    Ok(rows
        .iter()
        .map(|r| Applied {
            consumer: r.get(0),
            applied_at: r.get(1),
            stream_seq: r.get(2),
            subject: r.get(3),
        })
        .collect())
}
