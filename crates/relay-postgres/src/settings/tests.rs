use super::*;

#[test]
fn identifiers_follow_the_slot_name_rule() {
    assert!(validate_identifier("slot", "outbox_relay_1").is_ok());
    for bad in [
        "",
        "Outbox",
        "a-b",
        "a b",
        "x'; DROP TABLE t; --",
        &"a".repeat(64),
    ] {
        assert!(validate_identifier("slot", bad).is_err(), "{bad}");
    }
}

#[test]
fn failover_is_auto_true_or_false() {
    #[derive(Deserialize)]
    struct T {
        #[serde(default)]
        failover: FailoverSetting,
    }
    let parse = |text: &str| serde_json::from_str::<T>(text).map(|t| t.failover);
    assert_eq!(parse("{}").unwrap(), FailoverSetting::Auto);
    assert_eq!(
        parse(r#"{"failover": "auto"}"#).unwrap(),
        FailoverSetting::Auto
    );
    assert_eq!(parse(r#"{"failover": true}"#).unwrap(), FailoverSetting::On);
    assert_eq!(
        parse(r#"{"failover": "false"}"#).unwrap(),
        FailoverSetting::Off
    );
    assert!(parse(r#"{"failover": "sometimes"}"#).is_err());
    assert_eq!(
        serde_json::to_string(&FailoverSetting::Auto).unwrap(),
        "\"auto\""
    );
    assert!(FailoverSetting::Auto.wanted(170_002).unwrap());
    assert!(!FailoverSetting::Auto.wanted(150_019).unwrap());
    assert!(!FailoverSetting::Off.wanted(180_001).unwrap());
    assert!(FailoverSetting::On.wanted(180_001).unwrap());
    let refused = FailoverSetting::On.wanted(160_004).unwrap_err().to_string();
    assert!(
        refused.contains("PostgreSQL 16.4") && refused.contains("17"),
        "{refused}"
    );
}
