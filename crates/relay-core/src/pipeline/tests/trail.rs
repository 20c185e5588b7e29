//! `[relay] replay_retention` in the loop: the checkpoint is stored as without it, the position
//! confirmed to the source trails it and never passes it (nor an unacknowledged event).

use super::*;
use crate::trail::{ReplayRetention, SlotTrail};

#[tokio::test(start_paused = true)]
async fn the_confirmed_position_trails_every_stored_checkpoint() {
    let broker = FakeBroker::default();
    let mut events = preamble();
    for t in 1..=30u64 {
        let id = format!("e{t}");
        // Acks out of order.
        let delay = Duration::from_millis(t * 7919 % 97 * 10);
        broker.0.lock().unwrap().delays.insert(id.clone(), delay);
        events.extend(tx(t, &[id.as_str()]));
    }
    let config = PipelineConfig {
        checkpoint_interval: Duration::from_millis(50),
        ..PipelineConfig::default()
    };
    let bytes = 5_500;
    let trail = SlotTrail::new(
        ReplayRetention::Bytes(bytes),
        Lsn(1),
        Lsn(1),
        tokio::time::Instant::now(),
    );
    // CheckingStore asserts the delivery rule on every save.
    let (result, h) =
        run_script_with(events, broker, config, false, HashMap::new(), Some(trail)).await;
    assert_eq!(
        result.unwrap().confirmed,
        Lsn(30_000),
        "the checkpoint as without it"
    );
    let saved = h.saved.lock().unwrap().clone();
    let confirmed = h.confirmed.lock().unwrap().clone();
    assert!(saved.len() > 2, "several checkpoints: {saved:?}");
    assert_eq!(confirmed.len(), saved.len(), "one confirmation per save");
    for (s, c) in saved.iter().zip(&confirmed) {
        assert_eq!(
            c.0,
            s.0.saturating_sub(bytes).max(1),
            "saved {s}, confirmed {c}"
        );
    }
    assert_eq!(
        h.stats.slot_confirmed_lsn.load(Ordering::Relaxed),
        30_000 - bytes
    );
}
