use super::*;

const MB: u64 = 1 << 20;

fn policy() -> TakeoverPolicy {
    TakeoverPolicy {
        budget: Duration::from_secs(3600),
        standby_poll: Duration::from_secs(1),
    }
}

fn facts(limit: Option<u64>, safe: Option<i64>) -> RetentionFacts {
    RetentionFacts {
        settings: RetentionSettings {
            max_slot_wal_keep_size: limit,
            wal_sender_timeout: Duration::from_secs(60),
            idle_replication_slot_timeout: None,
        },
        wal_position: Some(Lsn(1000)),
        slot: Some(SlotRetention {
            wal_status: Some("reserved".into()),
            safe_wal_size: safe,
            active: true,
            inactive_since: None,
            inactive_seconds: None,
        }),
    }
}

fn rate(bps: f64) -> Option<WalRate> {
    Some(WalRate {
        bytes_per_second: bps,
        over: Duration::from_secs(2),
        source: RateSource::ShortSample,
    })
}

#[test]
fn settings_are_read_in_their_units() {
    assert_eq!(setting_bytes("64", Some("MB")), Some(64 << 20));
    assert_eq!(setting_bytes("-1", Some("MB")), Some(-1));
    assert_eq!(setting_bytes("2", Some("8kB")), Some(16384));
    assert_eq!(setting_bytes("x", Some("MB")), None);
    assert_eq!(
        setting_duration("60000", Some("ms")),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        setting_duration("30", Some("min")),
        Some(Duration::from_secs(1800))
    );
    assert_eq!(setting_duration("0", Some("s")), Some(Duration::ZERO));
    assert_eq!(setting_duration("-1", Some("ms")), Some(Duration::ZERO));
}

#[test]
fn window_is_safe_wal_size_over_the_rate() {
    let w = RetentionWindow::assess(
        facts(Some(64 * MB), Some(60 * MB as i64)),
        rate(MB as f64 / 2.0),
        policy(),
    );
    assert_eq!(w.safe_wal_bytes(), Some(60 * MB as i64));
    assert_eq!(w.seconds(), Some(120.0));
    assert!(!w.is_unbounded());
    let warnings = w.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].aspect, Aspect::Window);
    assert_eq!(
        warnings[0].detail,
        "about 2m (60 MB of WAL left at 512 kB/s (a 2s sample)): shorter than [relay] takeover_budget (1h)"
    );
    // 0.5 MB/s for an hour: 1800 MB.
    let hint = warnings[0].hint.as_deref().unwrap_or_default();
    assert!(hint.contains("'1800MB'"), "{hint}");
    // 4.5 MB/s for an hour: 15.8 GB, rounded up to whole GB.
    let fast = RetentionWindow::assess(
        facts(Some(64 * MB), Some(60 * MB as i64)),
        rate(4.5 * MB as f64),
        policy(),
    );
    let hint = fast.warnings()[0].hint.clone().unwrap_or_default();
    assert!(hint.contains("'16GB'"), "{hint}");
    assert_eq!(
        w.headline(),
        "about 2m before the slot is invalidated if the relay stops"
    );
    assert_eq!(
        w.numbers(),
        "max_slot_wal_keep_size 64 MB, safe_wal_size 60 MB, WAL rate 512 kB/s (a 2s sample), slot streamed now"
    );
}

#[test]
fn a_long_window_passes_and_a_standby_that_cannot_make_it_warns() {
    let w = RetentionWindow::assess(
        facts(Some(64 * MB), Some(64 * MB as i64)),
        rate(1024.0),
        policy(),
    );
    assert_eq!(w.seconds(), Some(65536.0));
    assert!(w.warnings().is_empty(), "{:?}", w.warnings());

    // 30 s of WAL left, a standby needs 61 s (wal_sender_timeout 60 s + a poll of 1 s).
    let w = RetentionWindow::assess(
        facts(Some(64 * MB), Some(30 * MB as i64)),
        rate(MB as f64),
        policy(),
    );
    assert_eq!(w.takeover(), Some(Duration::from_secs(61)));
    let aspects: Vec<Aspect> = w.warnings().iter().map(|c| c.aspect).collect();
    assert_eq!(aspects, [Aspect::Window, Aspect::Takeover]);
}

#[test]
fn unlimited_retention_is_unbounded_with_a_hint() {
    let w = RetentionWindow::assess(facts(None, None), rate(2048.0), policy());
    assert!(w.is_unbounded());
    assert_eq!(w.seconds(), None);
    assert_eq!(w.safe_wal_bytes(), None);
    assert!(w.headline().starts_with(
        "unbounded: the slot keeps WAL until the disk fills (max_slot_wal_keep_size = -1)"
    ));
    let warnings = w.warnings();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].detail.starts_with("unbounded: "));
    // 2 kB/s for an hour: 7.03 MB, rounded up.
    assert!(
        warnings[0]
            .hint
            .as_deref()
            .unwrap_or_default()
            .contains("'8MB'"),
        "{warnings:?}"
    );
}

#[test]
fn no_wal_means_no_estimate_and_a_lost_slot_means_none() {
    let w = RetentionWindow::assess(
        facts(Some(64 * MB), Some(64 * MB as i64)),
        rate(0.0),
        policy(),
    );
    assert_eq!(w.seconds(), None);
    assert!(w.warnings().is_empty());
    let detail = &w.checks()[0].detail;
    // 64 MB over an hour: 18.2 kB/s.
    assert!(detail.contains("above 18.2 kB/s"), "{detail}");

    let mut lost = facts(Some(64 * MB), None);
    if let Some(s) = lost.slot.as_mut() {
        s.wal_status = Some("lost".into());
    }
    let w = RetentionWindow::assess(lost, rate(1.0), policy());
    assert_eq!(w.seconds(), Some(0.0));
    assert_eq!(w.safe_wal_bytes(), Some(0));

    // Past the limit (unreserved): safe_wal_size is negative, nothing left.
    let w = RetentionWindow::assess(facts(Some(64 * MB), Some(-5)), rate(1.0), policy());
    assert_eq!(w.seconds(), Some(0.0));
}

#[test]
fn idle_timeout_bounds_an_inactive_slot() {
    let mut f = facts(None, None);
    f.settings.idle_replication_slot_timeout = Some(Duration::from_secs(1800));
    if let Some(s) = f.slot.as_mut() {
        s.active = false;
        s.inactive_since = Some("2025-01-01T00:00:00+00:00".into());
        s.inactive_seconds = Some(600.0);
    }
    let w = RetentionWindow::assess(f, rate(1.0), policy());
    assert!(!w.is_unbounded());
    assert_eq!(w.idle_seconds(), Some(1200.0));
    assert_eq!(w.seconds(), Some(1200.0));
    let aspects: Vec<Aspect> = w.warnings().iter().map(|c| c.aspect).collect();
    assert_eq!(aspects, [Aspect::Window, Aspect::IdleTimeout]);
    let idle = &w.warnings()[1];
    assert!(
        idle.detail.starts_with(
            "30m: a slot not streamed for that long is invalidated at the next checkpoint; the slot has been inactive, about 20m left"
        ),
        "{}",
        idle.detail
    );

    // Off: reported, not warned.
    let mut f = facts(Some(64 * MB), Some(64 * MB as i64));
    f.settings.idle_replication_slot_timeout = Some(Duration::ZERO);
    let w = RetentionWindow::assess(f, rate(1.0), policy());
    let idle = &w.checks()[2];
    assert_eq!(idle.aspect, Aspect::IdleTimeout);
    assert!(!idle.is_warning());
}

#[test]
fn wal_sender_timeout_off_means_no_takeover() {
    let mut f = facts(Some(64 * MB), Some(64 * MB as i64));
    f.settings.wal_sender_timeout = Duration::ZERO;
    let w = RetentionWindow::assess(f, rate(1.0), policy());
    assert_eq!(w.takeover(), None);
    let warnings = w.warnings();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].aspect, Aspect::Takeover);
}

#[test]
fn the_tracker_averages_over_its_window() {
    let t0 = Instant::now();
    let mut tracker = WalRateTracker::new(Duration::from_secs(60));
    tracker.push(t0, Lsn(0));
    assert_eq!(tracker.rate(), None);
    for i in 1..=120u64 {
        // 1 kB/s for 60 s, then 10 kB/s.
        let at = t0 + Duration::from_secs(i);
        let pos = if i <= 60 {
            i * 1024
        } else {
            60 * 1024 + (i - 60) * 10240
        };
        tracker.push(at, Lsn(pos));
        if i == 60 {
            let r = tracker.rate().expect("rate");
            assert!((r.bytes_per_second - 1024.0).abs() < 1e-6, "{r:?}");
        }
    }
    let r = tracker.rate().expect("rate");
    assert_eq!(r.over, Duration::from_secs(60));
    assert!((r.bytes_per_second - 10240.0).abs() < 1e-6, "{r:?}");
    // Another server: WAL went backwards, start over.
    tracker.push(t0 + Duration::from_secs(121), Lsn(5));
    assert_eq!(tracker.rate(), None);
}

#[test]
fn sizes_and_durations_read_well() {
    assert_eq!(bytes(512.0), "512 bytes");
    assert_eq!(bytes(64.0 * MB as f64), "64 MB");
    assert_eq!(bytes(1.5 * (1u64 << 30) as f64), "1.5 GB");
    assert_eq!(seconds(3723.4), "1h 2m 3s");
}
