use super::*;
use serde_json::json;

#[test]
fn checks_print_their_verdict_and_the_hint_of_those_that_have_one() {
    let checks = json!([
        {"check": "wal_keep", "verdict": "pass", "detail": "1 GB", "hint": null},
        {"check": "budget", "verdict": "warn", "detail": "2 min left", "hint": "raise max_slot_wal_keep_size"},
        {"check": "role", "verdict": "fail", "detail": "standby", "hint": "connect to the primary"},
    ]);
    assert_eq!(
        check_lines(&checks),
        [
            "    PASS  wal_keep: 1 GB",
            "    WARN  budget: 2 min left",
            "          hint: raise max_slot_wal_keep_size",
            "    FAIL  role: standby",
            "          hint: connect to the primary",
        ]
    );
    assert!(check_lines(&Value::Null).is_empty(), "no checks, no lines");
}
