use std::path::Path;

use super::config::{FleetConfig, Origin};

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const SHARED: &str = r#"
[nats]
url = "nats://127.0.0.1:4999"
[relay]
max_in_flight = 64
[http]
listen = "127.0.0.1:0"
"#;

#[test]
fn a_configuration_without_fleet_keys_is_a_fleet_of_one_named_by_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "relay.toml",
        "[postgres]\nslot = \"orders_slot\"\n",
    );
    let fleet = FleetConfig::load(Some(&file), &[]).unwrap();
    assert!(!fleet.is_fleet);
    assert_eq!(fleet.pipelines.len(), 1);
    assert_eq!(fleet.pipelines[0].name, "orders_slot");
    assert_eq!(fleet.pipelines[0].origin, Origin::Single);
    assert!(fleet.pipeline(None).is_ok());
}

#[test]
fn inline_pipelines_merge_over_the_shared_file_key_by_key_and_lists_whole() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"{SHARED}
[[outbox]]
table = "public.shared_outbox"

[[pipeline]]
name = "orders"
[pipeline.postgres]
url = "postgres://relay@db1:5432/orders"
slot = "orders"
[pipeline.relay]
drain_timeout = "3s"

[[pipeline]]
name = "billing"
[pipeline.postgres]
url = "postgres://relay@db2:5432/billing"
[pipeline.nats]
stream = "BILLING"
[[pipeline.outbox]]
table = "billing.outbox"
"#
    );
    let file = write(dir.path(), "fleet.toml", &text);
    let fleet = FleetConfig::load(Some(&file), &[]).unwrap();
    assert!(fleet.is_fleet, "[[pipeline]] makes a fleet");
    assert!(fleet.refused.is_empty(), "{:?}", fleet.refused);
    let names: Vec<&str> = fleet.pipelines.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["billing", "orders"], "in name order");
    let orders = fleet.pipeline(Some("orders")).unwrap();
    // Its own key, and the shared one beside it in the same table.
    assert_eq!(orders.config.relay.drain_timeout.as_secs(), 3);
    assert_eq!(orders.config.relay.max_in_flight, 64);
    assert_eq!(orders.config.nats.url, "nats://127.0.0.1:4999");
    assert_eq!(orders.config.outbox[0].table, "public.shared_outbox");
    let billing = fleet.pipeline(Some("billing")).unwrap();
    assert_eq!(billing.config.nats.stream, "BILLING");
    assert_eq!(
        billing.config.outbox.len(),
        1,
        "a pipeline's list replaces the shared one"
    );
    assert_eq!(billing.config.outbox[0].table, "billing.outbox");
    assert_eq!(fleet.http.listen.as_deref(), Some("127.0.0.1:0"));
    let err = fleet.pipeline(None).unwrap_err().to_string();
    assert!(
        err.contains("--pipeline") && err.contains("billing, orders"),
        "{err}"
    );
    let err = fleet.pipeline(Some("nope")).unwrap_err().to_string();
    assert!(err.contains("no pipeline named `nope`"), "{err}");
}

#[test]
fn a_pipelines_dir_holds_one_file_per_pipeline_named_by_its_stem() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pipelines")).unwrap();
    let file = write(
        dir.path(),
        "fleet.toml",
        &format!("{SHARED}\n[fleet]\npipelines_dir = \"pipelines\"\n"),
    );
    write(
        &dir.path().join("pipelines"),
        "tenant-a.toml",
        "[postgres]\nurl = \"postgres://relay@db:5432/a\"\nslot = \"tenant_a\"\n",
    );
    write(
        &dir.path().join("pipelines"),
        "tenant-b.toml",
        "[postgres]\nurl = \"postgres://relay@db:5432/b\"\nslot = \"tenant_b\"\n",
    );
    write(&dir.path().join("pipelines"), "notes.txt", "not a pipeline");
    let fleet = FleetConfig::load(Some(&file), &[]).unwrap();
    let names: Vec<&str> = fleet.pipelines.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["tenant-a", "tenant-b"]);
    assert!(matches!(&fleet.pipelines[0].origin, Origin::File(p) if p.ends_with("tenant-a.toml")));
    assert_eq!(fleet.pipelines[1].config.postgres.slot, "tenant_b");
}

#[test]
fn bad_pipelines_are_refused_by_name_file_and_key_and_the_good_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("p")).unwrap();
    let file = write(
        dir.path(),
        "fleet.toml",
        &format!("{SHARED}\n[fleet]\npipelines_dir = \"p\"\n"),
    );
    let p = dir.path().join("p");
    write(
        &p,
        "good.toml",
        "[postgres]\nslot = \"good\"\npublication = \"good\"\n",
    );
    write(&p, "broken.toml", "[postgres\nslot = \"x\"\n");
    write(&p, "typo.toml", "[postgres]\nslott = \"y\"\n");
    write(
        &p,
        "listener.toml",
        "[postgres]\nslot = \"l\"\npublication = \"l\"\n[http]\nlisten = \"127.0.0.1:1\"\n",
    );
    // Same server, same slot as `good`.
    write(
        &p,
        "twin.toml",
        "[postgres]\nslot = \"good\"\npublication = \"twin\"\n",
    );
    write(&p, "bad name.toml", "[postgres]\nslot = \"b\"\n");
    let fleet = FleetConfig::load(Some(&file), &[]).unwrap();
    let names: Vec<&str> = fleet.pipelines.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["good"]);
    let reason = |name: &str| {
        fleet
            .refused
            .iter()
            .find(|r| r.name == name)
            .map(ToString::to_string)
            .unwrap_or_else(|| panic!("{name} not refused: {:?}", fleet.refused))
    };
    assert!(
        reason("broken").contains("broken.toml"),
        "{}",
        reason("broken")
    );
    assert!(
        reason("typo").contains("slott") && reason("typo").contains("typo.toml"),
        "{}",
        reason("typo")
    );
    assert!(
        reason("listener").contains("[http] belongs to the shared file"),
        "{}",
        reason("listener")
    );
    assert!(
        reason("twin").contains("postgres.slot `good`")
            && reason("twin").contains("pipeline `good`"),
        "{}",
        reason("twin")
    );
    assert!(
        reason("bad name").contains("not a pipeline name"),
        "{}",
        reason("bad name")
    );
    let all = fleet.refused_error().unwrap().to_string();
    assert!(
        all.contains("twin.toml") && all.contains("broken.toml"),
        "{all}"
    );
}

#[test]
fn a_running_pipeline_keeps_its_slot_against_a_newcomer() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{SHARED}\n[[pipeline]]\nname = \"zeta\"\n[pipeline.postgres]\nslot = \"s\"\npublication = \"z\"\n\n[[pipeline]]\nname = \"alpha\"\n[pipeline.postgres]\nslot = \"s\"\npublication = \"a\"\n"
    );
    let file = write(dir.path(), "fleet.toml", &text);
    let fresh = FleetConfig::load(Some(&file), &[]).unwrap();
    assert_eq!(
        fresh.pipelines[0].name, "alpha",
        "first in name order keeps it"
    );
    let running = FleetConfig::load(Some(&file), &["zeta".to_owned()]).unwrap();
    assert_eq!(
        running.pipelines[0].name, "zeta",
        "the running one keeps it"
    );
    assert_eq!(running.refused[0].name, "alpha");
}

#[test]
fn a_pipeline_without_a_name_and_an_empty_fleet_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "fleet.toml",
        "[[pipeline]]\n[pipeline.postgres]\nslot = \"s\"\n",
    );
    let err = FleetConfig::load(Some(&file), &[]).unwrap_err().to_string();
    assert!(err.contains("`name` is missing"), "{err}");
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let file = write(
        dir.path(),
        "fleet2.toml",
        "[fleet]\npipelines_dir = \"empty\"\n",
    );
    let err = FleetConfig::load(Some(&file), &[]).unwrap_err().to_string();
    assert!(err.contains("the fleet has no pipeline"), "{err}");
    let file = write(
        dir.path(),
        "fleet3.toml",
        "[fleet]\npipelines_dir = \"missing\"\n",
    );
    let err = FleetConfig::load(Some(&file), &[]).unwrap_err().to_string();
    assert!(
        err.contains("pipelines_dir") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_changed_pipeline_changes_its_fingerprint_and_only_its() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("p")).unwrap();
    let file = write(
        dir.path(),
        "fleet.toml",
        &format!("{SHARED}\n[fleet]\npipelines_dir = \"p\"\n"),
    );
    let p = dir.path().join("p");
    write(
        &p,
        "a.toml",
        "[postgres]\nslot = \"a\"\npublication = \"a\"\n",
    );
    write(
        &p,
        "b.toml",
        "[postgres]\nslot = \"b\"\npublication = \"b\"\npassword = \"one\"\n",
    );
    let before = FleetConfig::load(Some(&file), &[]).unwrap();
    write(
        &p,
        "b.toml",
        "[postgres]\nslot = \"b\"\npublication = \"b\"\npassword = \"two\"\n",
    );
    let after = FleetConfig::load(Some(&file), &[]).unwrap();
    assert_eq!(
        before.pipelines[0].fingerprint,
        after.pipelines[0].fingerprint
    );
    assert_ne!(
        before.pipelines[1].fingerprint, after.pipelines[1].fingerprint,
        "a secret's change is a change"
    );
}
