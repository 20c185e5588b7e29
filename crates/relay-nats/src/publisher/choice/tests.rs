use super::*;

const NEW: &str = "2.15.1";
const OLD: &str = "2.9.10";

fn takes(order_by_sequence: bool) -> StreamTakes {
    StreamTakes {
        order_by_sequence,
        ..StreamTakes::BATCHES
    }
}

fn warned(notes: &[ChoiceNote]) -> Vec<&str> {
    notes
        .iter()
        .filter_map(|n| match n {
            ChoiceNote::Warn(w) => Some(w.as_str()),
            ChoiceNote::Info(_) => None,
        })
        .collect()
}

#[test]
fn per_message_names_the_predecessor_by_event_id_or_by_sequence_on_a_replicated_stream() {
    let (framing, notes) = Framing::choose(PublishMode::PerMessage, takes(false), "S", NEW, false);
    assert_eq!(framing, Framing::ByEventId);
    assert!(notes.is_empty(), "{notes:?}");
    let (framing, notes) = Framing::choose(PublishMode::PerMessage, takes(true), "S", NEW, false);
    assert_eq!(framing, Framing::BySequence);
    assert!(framing.by_sequence());
    assert!(warned(&notes).is_empty());
    assert_eq!(
        notes.len(),
        1,
        "one line says why conditions name sequences"
    );
}

#[test]
fn batch_modes_are_used_where_server_and_stream_take_them() {
    let (framing, notes) = Framing::choose(PublishMode::AtomicBatch, takes(false), "S", NEW, false);
    assert_eq!(framing, Framing::AtomicBatch { by_sequence: false });
    assert!(warned(&notes).is_empty());
    let (framing, _) = Framing::choose(PublishMode::AtomicBatch, takes(true), "S", NEW, false);
    assert_eq!(framing, Framing::AtomicBatch { by_sequence: true });
    assert!(framing.by_sequence() && framing.atomic_batches());
    let (framing, _) = Framing::choose(PublishMode::FastBatch, takes(false), "S", NEW, false);
    assert_eq!(framing, Framing::FastBatch);
}

#[test]
fn a_mode_that_cannot_be_used_falls_back_to_messages_on_their_own_with_one_warning_naming_why() {
    let cases = [
        // (mode, stream takes, server, domain, what the warning names, framing)
        (
            PublishMode::AtomicBatch,
            takes(false),
            OLD,
            false,
            "2.12.1",
            Framing::ByEventId,
        ),
        (
            PublishMode::FastBatch,
            takes(false),
            "2.12.1",
            false,
            "2.14.0",
            Framing::ByEventId,
        ),
        (
            PublishMode::AtomicBatch,
            StreamTakes {
                atomic_batches: false,
                ..takes(false)
            },
            NEW,
            false,
            "nats stream edit S --allow-batch",
            Framing::ByEventId,
        ),
        (
            PublishMode::FastBatch,
            StreamTakes {
                fast_batches: false,
                ..takes(false)
            },
            NEW,
            false,
            "nats stream edit S --allow-batched",
            Framing::ByEventId,
        ),
        (
            PublishMode::FastBatch,
            takes(false),
            NEW,
            true,
            "[nats] domain",
            Framing::ByEventId,
        ),
        (
            PublishMode::FastBatch,
            takes(true),
            NEW,
            false,
            "replicated stream",
            Framing::BySequence,
        ),
    ];
    for (mode, stream, server, domain, names, expected) in cases {
        let (framing, notes) = Framing::choose(mode, stream, "S", server, domain);
        assert_eq!(
            framing, expected,
            "{mode:?} on {server}, {stream:?}, domain {domain}"
        );
        let warnings = warned(&notes);
        assert_eq!(warnings.len(), 1, "{mode:?}: {notes:?}");
        assert!(
            warnings[0].contains(names),
            "{mode:?}: {warnings:?} should name {names}"
        );
        assert!(warnings[0].ends_with("publishing each message on its own"));
    }
}
