//! With `[[messages]]` configured, `setup` installs the SQL helpers of the table-free outbox
//! (`outbox_relay.emit_event`, `outbox_relay.emit_envelope`) and `validate --connect` warns
//! while they are missing.

use anyhow::Result;

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
async fn setup_installs_the_emit_functions_and_validate_says_when_they_are_missing() -> Result<()> {
    let env = Env::start().await?;
    let db = env.db().await?;
    // A database the migrations were applied to, except the helpers.
    db.batch_execute(
        "DROP FUNCTION outbox_relay.emit_event(text, text, text, jsonb, jsonb); \
         DROP FUNCTION outbox_relay.emit_envelope(text, jsonb);",
    )
    .await?;
    let emit = "SELECT outbox_relay.emit_event('outbox', 'msg-1', 'outbox.msg.one', '{}')";
    assert!(db.execute(emit, &[]).await.is_err(), "the helpers are gone");
    let config = env.config("\n[[messages]]\nprefix = \"outbox\"\n");

    let out = relay_cmd(&config, &["validate", "--connect"]).await?;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = report
        .lines()
        .find(|l| l.contains("emit functions"))
        .unwrap_or_else(|| panic!("no emit functions check:\n{report}"));
    assert!(line.starts_with("WARN"), "{line}");
    assert!(report.contains("run `outbox-relay setup`"), "{report}");

    let out = relay_cmd(&config, &["setup"]).await?;
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("created  functions outbox_relay.emit_event, outbox_relay.emit_envelope"),
        "{printed}"
    );
    db.execute(emit, &[]).await?;

    // Again: nothing to do, and validate passes the check.
    let out = relay_cmd(&config, &["setup"]).await?;
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        printed.contains("ok       functions outbox_relay.emit_event"),
        "{printed}"
    );
    let out = relay_cmd(&config, &["validate", "--connect"]).await?;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = report
        .lines()
        .find(|l| l.contains("emit functions"))
        .unwrap_or_default();
    assert!(line.starts_with("PASS"), "{report}");
    Ok(())
}
