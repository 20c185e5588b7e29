//! `outbox-relay setup`: creates what is missing, idempotently: the checkpoint table
//! (`migrations/0002_relay_checkpoint.sql`), the signal table
//! (`migrations/0008_relay_signal.sql`, unless `[relay] sql_signals = false`), with `[[messages]]` the SQL helpers
//! `outbox_relay.emit_event`/`emit_envelope` (`migrations/0005_emit_outbox_message.sql`), the
//! publication, the slot (publication first, and never a slot while a checkpoint for it
//! exists), and with `--create-stream` the stream. The outbox tables themselves belong to the
//! application's migrations.

use relay_core::stage::CheckpointStore as _;
use relay_postgres::bootstrap;
use relay_postgres::checkpoint::PgCheckpointStore;

use crate::exit::{Failure, FailureKind};
use crate::exit::{nats_failure, pg_failure};
use relay_runtime::config::RelayConfig;

/// Creates the checkpoint table, publication, slot and (when asked) stream.
pub async fn setup(config: &RelayConfig, create_stream: bool) -> Result<(), Failure> {
    let pg = &config.postgres;
    let client = relay_postgres::connect(pg).await.map_err(pg_failure)?;
    let mut store = PgCheckpointStore::new(client, &pg.slot)
        .await
        .map_err(|e| Failure::new(FailureKind::Config, e))?;
    println!("ok       checkpoint table outbox_relay.checkpoint");
    if config.relay.sql_signals {
        relay_backfill::signal::ensure_signal_table(store.client())
            .await
            .map_err(pg_failure)?;
        println!("ok       signal table outbox_relay.signal");
    }
    if !config.messages.is_empty() {
        setup_emit_functions(store.client()).await?;
    }
    let checkpoint = store
        .load()
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, e))?;
    let mut settings = pg.clone();
    settings.create_publication = true;
    // With `backfill = "on-create"` the relay's first start creates the slot: the backfill
    // reads the snapshot the slot exports, which lives only as long as that start's session.
    let on_create = config.outbox.backfill_on_create().next().is_some();
    settings.create_slot = !on_create;
    let state = match bootstrap::prepare(
        store.client(),
        &settings,
        &config.published_tables(),
        checkpoint,
    )
    .await
    {
        Err(relay_postgres::PgError::SlotMissing { .. }) if on_create && checkpoint.is_none() => {
            println!(
                "deferred slot {}: [[outbox]] backfill = \"on-create\", so the relay's first start creates it and publishes the rows already in the tables from its snapshot",
                pg.slot
            );
            println!("ok       publication {}", pg.publication);
            return setup_stream(config, create_stream).await;
        }
        other => other.map_err(pg_failure)?,
    };
    println!(
        "{}  publication {}",
        if state.publication_created {
            "created"
        } else {
            "ok     "
        },
        pg.publication
    );
    println!(
        "{}  slot {} at {}",
        if state.created { "created" } else { "ok     " },
        pg.slot,
        state.confirmed_flush_lsn
    );
    // As `run` does on its first start: a lost slot is detected from here on.
    let (start, created) = store
        .resume_position(checkpoint, state.confirmed_flush_lsn)
        .await
        .map_err(|e| Failure::new(FailureKind::Unavailable, e))?;
    let verb = if created { "created " } else { "ok      " };
    println!("{verb} checkpoint {start} for slot {}", pg.slot);
    setup_stream(config, create_stream).await
}

/// Installs the `[[messages]]` SQL helpers unless they are there.
async fn setup_emit_functions(client: &tokio_postgres::Client) -> Result<(), Failure> {
    use relay_postgres::{EmitFunctions, ensure_emit_functions};
    let what = "functions outbox_relay.emit_event, outbox_relay.emit_envelope";
    match ensure_emit_functions(client).await {
        Ok(EmitFunctions::Present) => println!("ok       {what}"),
        Ok(EmitFunctions::Created) => println!("created  {what}"),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
            return Err(Failure::new(
                FailureKind::Config,
                anyhow::Error::new(e).context(format!(
                    "[[messages]] is configured, and the relay's role may not create the {what}: apply migrations/0005_emit_outbox_message.sql as the schema's owner, or run `outbox-relay setup` as one"
                )),
            ));
        }
        Err(e) => {
            return Err(Failure::new(
                FailureKind::Unavailable,
                anyhow::Error::new(e).context(format!("creating the {what}")),
            ));
        }
    }
    Ok(())
}

/// The stream part of setup.
async fn setup_stream(config: &RelayConfig, create_stream: bool) -> Result<(), Failure> {
    let connection = relay_nats::connect(&config.nats)
        .await
        .map_err(nats_failure)?;
    let mut nats = config.nats.clone();
    nats.create_stream = create_stream || nats.create_stream;
    let jetstream = connection.jetstream();
    match relay_nats::prepare_stream(
        &jetstream,
        &nats,
        &config.sample_subjects(),
        &config.broker_needs(),
    )
    .await
    {
        Ok(report) => {
            println!(
                "{}  stream {} subjects [{}]",
                if report.created { "created" } else { "ok     " },
                nats.stream,
                report.subjects.join(", ")
            );
            for warning in report.warnings {
                println!("warning  {warning}");
            }
        }
        Err(relay_nats::NatsError::StreamMissing { .. }) => {
            println!(
                "missing  stream {}: rerun with --create-stream, or create it yourself",
                nats.stream
            );
        }
        Err(e) => return Err(nats_failure(e)),
    }
    Ok(())
}
