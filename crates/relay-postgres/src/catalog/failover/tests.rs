//! The assessment against hand-made facts, and the `primary_conninfo` parser.

use relay_core::check::CheckAspect as _;

use super::*;
use crate::settings::FailoverSetting;

fn primary(version_num: i32) -> FailoverFacts {
    FailoverFacts {
        version_num,
        in_recovery: false,
        timeline: Some(1),
        slot: None,
        checkpoint: None,
        primary: Some(PrimaryFacts::default()),
        standby: None,
    }
}

fn verdicts(checks: &[FailoverCheck]) -> Vec<(&'static str, bool)> {
    checks
        .iter()
        .map(|c| (c.aspect.name(), c.is_warning()))
        .collect()
}

#[test]
fn conninfo_dbname_is_found_in_both_forms() {
    assert_eq!(
        conninfo_dbname("host=10.0.0.1 port=5432 user=rep dbname=app application_name=s1")
            .as_deref(),
        Some("app")
    );
    assert_eq!(
        conninfo_dbname("user=rep password='a b\\'c' dbname = 'my db'").as_deref(),
        Some("my db")
    );
    assert_eq!(conninfo_dbname("host=a user=rep"), None);
    assert_eq!(
        conninfo_dbname("postgresql://rep@a:5432/app?sslmode=require").as_deref(),
        Some("app")
    );
    assert_eq!(conninfo_dbname("postgres://rep@a"), None);
}

#[test]
fn without_standbys_nothing_to_warn_about() {
    let checks = assess(&primary(180_001), FailoverSetting::Auto, "s", "app").unwrap();
    assert_eq!(
        verdicts(&checks),
        [
            ("failover slot", false),
            ("synchronized_standby_slots", false),
            ("standbys", false)
        ]
    );
}

#[test]
fn before_17_only_a_note_unless_standbys_stream() {
    let facts = primary(150_019);
    let checks = assess(&facts, FailoverSetting::Auto, "s", "app").unwrap();
    assert_eq!(
        verdicts(&checks),
        [("failover slot", false), ("standbys", false)]
    );
    let mut with_standby = primary(150_019);
    with_standby.primary = Some(PrimaryFacts {
        standbys: vec![StreamingStandby {
            name: "walreceiver".into(),
            client_addr: None,
            state: Some("streaming".into()),
            slot: Some("standby1".into()),
        }],
        ..PrimaryFacts::default()
    });
    let checks = assess(&with_standby, FailoverSetting::Auto, "s", "app").unwrap();
    assert!(checks[0].is_warning());
    assert!(checks[0].hint.as_deref().unwrap().contains("exit 65"));
    let refused = assess(&facts, FailoverSetting::On, "s", "app").unwrap_err();
    assert!(
        refused.to_string().contains("PostgreSQL 15.19"),
        "{refused}"
    );
}

#[test]
fn on_17_the_slot_flag_and_synchronized_standby_slots_are_checked() {
    let mut facts = primary(180_001);
    facts.slot = Some(SlotFailover {
        failover: false,
        synced: false,
        temporary: false,
        invalidated: None,
        confirmed_flush_lsn: None,
    });
    facts.primary = Some(PrimaryFacts {
        synchronized_standby_slots: vec![],
        physical_slots: vec![PhysicalSlot {
            name: "standby1".into(),
            active: true,
            holds_xmin: false,
        }],
        standbys: vec![StreamingStandby {
            name: "s1".into(),
            client_addr: Some("10.0.0.2".into()),
            state: Some("streaming".into()),
            slot: Some("standby1".into()),
        }],
    });
    let checks = assess(&facts, FailoverSetting::Auto, "relay", "app").unwrap();
    assert_eq!(
        verdicts(&checks),
        [
            ("failover slot", true),
            ("synchronized_standby_slots", true),
            ("standby", true),
        ]
    );
    assert!(
        checks[2].detail.starts_with("s1 (10.0.0.2): streaming"),
        "{checks:#?}"
    );
    assert!(
        checks[0]
            .hint
            .as_deref()
            .unwrap()
            .contains("ALTER_REPLICATION_SLOT relay (FAILOVER true)")
    );
    assert!(
        checks[1]
            .hint
            .as_deref()
            .unwrap()
            .contains("synchronized_standby_slots = 'standby1'")
    );

    let mut good = facts.clone();
    good.slot.as_mut().unwrap().failover = true;
    let p = good.primary.as_mut().unwrap();
    p.synchronized_standby_slots = vec!["standby1".into()];
    p.physical_slots[0].holds_xmin = true;
    let checks = assess(&good, FailoverSetting::Auto, "relay", "app").unwrap();
    assert!(checks.iter().all(|c| !c.is_warning()), "{checks:#?}");

    let mut waiting = good.clone();
    waiting.primary.as_mut().unwrap().physical_slots[0].active = false;
    waiting
        .primary
        .as_mut()
        .unwrap()
        .synchronized_standby_slots
        .push("gone".into());
    let checks = assess(&waiting, FailoverSetting::Auto, "relay", "app").unwrap();
    let sss: Vec<&FailoverCheck> = checks
        .iter()
        .filter(|c| c.aspect == Aspect::SynchronizedStandbySlots)
        .collect();
    assert_eq!(sss.len(), 2);
    assert!(sss.iter().all(|c| c.is_warning()));
}

#[test]
fn a_standby_is_checked_as_a_failover_target() {
    let mut facts = FailoverFacts {
        version_num: 180_001,
        in_recovery: true,
        timeline: None,
        slot: Some(SlotFailover {
            failover: true,
            synced: true,
            temporary: false,
            invalidated: None,
            confirmed_flush_lsn: Some(Lsn(0x100)),
        }),
        checkpoint: Some(Lsn(0x200)),
        primary: None,
        standby: Some(StandbyFacts {
            sync_replication_slots: true,
            hot_standby_feedback: true,
            primary_slot_name: Some("standby1".into()),
            primary_conninfo: Conninfo::Set {
                dbname: Some("app".into()),
            },
        }),
    };
    let checks = assess(&facts, FailoverSetting::Auto, "relay", "app").unwrap();
    assert!(checks.iter().all(|c| !c.is_warning()), "{checks:#?}");
    facts.slot.as_mut().unwrap().temporary = true;
    facts.standby = Some(StandbyFacts {
        sync_replication_slots: false,
        hot_standby_feedback: false,
        primary_slot_name: None,
        primary_conninfo: Conninfo::Set { dbname: None },
    });
    let checks = assess(&facts, FailoverSetting::Auto, "relay", "app").unwrap();
    assert_eq!(
        checks.iter().filter(|c| c.is_warning()).count(),
        5,
        "{checks:#?}"
    );
}
