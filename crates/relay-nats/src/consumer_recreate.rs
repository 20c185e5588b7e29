//! Moving a durable consumer where the server cannot reset it in place (nats-server before
//! 2.14): deleted and created again under the same name, with the same configuration and a new
//! start. Never past a message it has not acknowledged ([`skips_unacked`]).

use async_nats::jetstream::{self, consumer};

/// Whether moving `info`'s consumer to start at `start` skips a message it has not
/// acknowledged yet: `Some(why)` if so, with the position that would not skip any.
pub fn skips_unacked(info: &consumer::Info, start: u64) -> Option<String> {
    let floor = info.ack_floor.stream_sequence;
    let caught_up = info.num_ack_pending == 0
        && (info.num_pending == 0 || info.delivered.stream_sequence + 1 >= start);
    if floor + 1 >= start || caught_up {
        return None;
    }
    Some(format!(
        "it has not acknowledged every message before sequence {start} (ack floor {floor}, {} delivered and awaiting an ack, {} not delivered yet): starting it at {start} would skip them. Let it catch up first, or replay from a position at or before sequence {}",
        info.num_ack_pending,
        info.num_pending,
        floor + 1
    ))
}

/// Sets `config`'s subject filters to `subjects` (one filter, several, or unchanged when none).
pub fn set_filters(config: &mut consumer::Config, subjects: &[String]) {
    match subjects {
        [] => {}
        [one] => {
            config.filter_subject = one.clone();
            config.filter_subjects = Vec::new();
        }
        many => {
            config.filter_subject = String::new();
            config.filter_subjects = many.to_vec();
        }
    }
}

/// Why a consumer was not created again.
#[derive(Debug, thiserror::Error)]
pub enum RecreateError {
    /// It could not be deleted (it is unchanged).
    #[error(transparent)]
    Delete(#[from] jetstream::stream::ConsumerError),
    /// It was deleted and could not be created again.
    #[error(
        "consumer {name} was deleted but could not be created again; create it with: nats consumer add {stream} {name} --pull --deliver {start} --ack explicit"
    )]
    Create {
        /// The consumer.
        name: String,
        /// Its stream.
        stream: String,
        /// The sequence it was to start at.
        start: u64,
        /// Why.
        #[source]
        source: jetstream::stream::ConsumerError,
    },
}

/// Deletes `info`'s consumer and creates it again with its configuration (and `subjects` as its
/// filters, when given), delivering from `start`.
pub async fn recreate_consumer(
    stream: &jetstream::stream::Stream,
    info: &consumer::Info,
    start: u64,
    subjects: &[String],
) -> Result<(), RecreateError> {
    let mut config = info.config.clone();
    config.deliver_policy = consumer::DeliverPolicy::ByStartSequence {
        start_sequence: start,
    };
    set_filters(&mut config, subjects);
    stream.delete_consumer(&info.name).await?;
    stream
        .create_consumer(config)
        .await
        .map_err(|source| RecreateError::Create {
            name: info.name.clone(),
            stream: info.stream_name.clone(),
            start,
            source,
        })?;
    Ok(())
}
