//! The console in a real browser (headless Chromium from Debian's `chromium` package) against a
//! real relay, PostgreSQL and nats-server: each page shows what the servers hold (numbers that
//! match `/status`, the stream's events, a dead letter with its reason, a consumer's pending
//! count, a signal's outcome, a traced event), and a screenshot of each page is kept under
//! `target/test-artifacts/console/`. A fleet's console: [`fleet`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use async_nats::jetstream::consumer;

use crate::support::*;

mod consumers;
mod fleet;
mod webdriver;

/// The browser: `RELAY_TEST_CHROMIUM`, else Debian's `/usr/bin/chromium`.
fn chromium() -> Result<PathBuf> {
    let path = std::env::var_os("RELAY_TEST_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    ensure!(
        path.exists(),
        "{} not found: run scripts/ensure-deps.sh (installs Debian's chromium) or set RELAY_TEST_CHROMIUM",
        path.display()
    );
    Ok(path)
}

fn artifacts() -> Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts/console");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs headless Chromium on `url` with `args`; its stdout.
fn browser(url: &str, args: &[&str]) -> Result<String> {
    let profile = tempfile::tempdir()?;
    let out = Command::new(chromium()?)
        .args([
            "--headless",
            // CI runs as root, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--window-size=1280,1000",
            "--virtual-time-budget=8000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .context("run chromium")?;
    ensure!(
        out.status.success(),
        "chromium on {url} exited {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The page at `#fragment` once its view has loaded, as the browser rendered it (the DOM after
/// its scripts ran); retried while the view is still loading.
fn page(addr: &str, fragment: &str) -> Result<String> {
    loaded(&format!("http://{addr}/console#{fragment}"), false)
}

/// The DOM of `url` once its view loaded (or failed to, when `may_fail`).
fn loaded(url: &str, may_fail: bool) -> Result<String> {
    let fragment = url.split_once('#').map_or("", |(_, f)| f);
    let url = url.to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dom = browser(&url, &["--dump-dom"])?;
        if dom.contains("data-loaded=\"true\"")
            || (may_fail && dom.contains("data-loaded=\"error\""))
        {
            return Ok(dom);
        }
        if dom.contains("data-loaded=\"error\"") || Instant::now() > deadline {
            bail!("#{fragment} did not load:\n{dom}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Saves a screenshot of `#fragment` as `<name>.png` among the test artifacts.
fn screenshot(addr: &str, fragment: &str, name: &str) -> Result<PathBuf> {
    let path = artifacts()?.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&path);
    browser(
        &format!("http://{addr}/console#{fragment}"),
        &[&format!("--screenshot={}", path.display())],
    )?;
    let size = std::fs::metadata(&path)
        .with_context(|| format!("no screenshot at {}", path.display()))?
        .len();
    ensure!(
        size > 10_000,
        "screenshot {} is {size} bytes",
        path.display()
    );
    Ok(path)
}

/// The text of the element with `id` in `dom` (its first text run).
fn text_of<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[at..];
    let start = rest.find('>')? + 1;
    let end = rest[start..].find('<')? + start;
    Some(rest[start..end].trim())
}

/// The signal the page says it requested.
async fn requested_signal(browser: &webdriver::Browser) -> Result<i64> {
    browser
        .wait_for(
            "the signal shown",
            "return document.querySelector('#signal-result a.signal-link') !== null",
        )
        .await?;
    browser
        .text("#signal-result a.signal-link")
        .await?
        .parse()
        .context("signal id shown")
}

/// Waits until signal `id` is in `state`.
async fn wait_signal(
    db: &tokio_postgres::Client,
    id: i64,
    state: &str,
    relay: &Relay,
) -> Result<()> {
    wait_until(&format!("signal {id} {state}"), relay, async || {
        Ok(db
            .query_one(
                "SELECT state FROM outbox_relay.signal WHERE id = $1",
                &[&id],
            )
            .await?
            .get::<_, String>(0)
            == state)
    })
    .await
}

async fn status(addr: &str) -> Result<serde_json::Value> {
    let (code, body) = relay_ops::client::get_text(addr, "/status", Duration::from_secs(5)).await?;
    ensure!(code == 200, "/status answered {code}");
    Ok(serde_json::from_str(&body)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_shows_what_the_servers_hold_in_a_real_browser() -> Result<()> {
    let env = Env::start().await?;
    let addr = format!("127.0.0.1:{}", relay_testkit::free_port());
    let config = env.config(&format!(
        "dead_letter_subject = \"outbox.dead.letters\"\n[http]\nlisten = \"{addr}\"\nconsole = true\nsample_interval = \"1s\"\n"
    ));
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(insert_event(&db, "Order", "created", &format!(r#"{{"n": {n}}}"#)).await?);
    }
    // An empty `type` cannot form a subject token: dead-lettered with its reason.
    let bad = insert_unroutable(&db, r#"{"bad": true}"#).await?;
    let last = insert_event(&db, "Order", "created", r#"{"n": "last"}"#).await?;
    ids.push(last.clone());
    wait_for_id(&js, &last, &relay).await?;
    let stream = js.get_stream(STREAM).await?;
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            filter_subject: "outbox.Order.>".into(),
            ..Default::default()
        })
        .await?;
    let signal: i64 = db
        .query_one(
            "INSERT INTO outbox_relay.signal (kind, args) VALUES ('backfill', '{\"tabel\": \"outbox\"}') RETURNING id",
            &[],
        )
        .await?
        .get(0);
    wait_signal(&db, signal, "failed", &relay).await?;
    let wal = env.current_wal().await?;
    env.wait_checkpoint(wal, Duration::from_secs(30)).await?;
    // Four events and a dead letter, nothing after.
    let last_seq = last_sequence(&js).await?;
    ensure!(last_seq == 5, "stream holds {last_seq}");

    // Events: the stream's messages, newest first, and one opened.
    let dom = page(&addr, "events")?;
    for id in &ids {
        ensure!(dom.contains(id.as_str()), "event {id} listed");
    }
    let first = dom.find(&ids[3]).context("last")?;
    let earlier = dom.find(&ids[0]).context("first")?;
    ensure!(first < earlier, "newest first");
    screenshot(&addr, "events", "events")?;
    let dom = page(&addr, "events/outbox.dead.letters")?;
    ensure!(
        !dom.contains(ids[0].as_str()),
        "the filter leaves other subjects out"
    );
    let dom = page(&addr, &format!("event/{last_seq}"))?;
    ensure!(
        dom.contains(r#"{"n": "last"}"#) || dom.contains(r#"{"n":"last"}"#),
        "payload shown: {dom}"
    );
    ensure!(dom.contains(&format!("#trace/{last}")), "a trace link");
    screenshot(&addr, &format!("event/{last_seq}"), "event")?;

    // Dead letters with their reason.
    let dom = page(&addr, "dead-letters")?;
    ensure!(dom.contains(bad.as_str()), "dead letter of {bad} listed");
    ensure!(dom.contains("class=\"reason\""), "with a reason");
    ensure!(
        dom.contains("Read-only: [http] console_write") && !dom.contains("class=\"republish\""),
        "no re-publish without console_write"
    );
    screenshot(&addr, "dead-letters", "dead-letters")?;

    // Consumers: billing has all four events of its subject pending.
    let dom = page(&addr, "consumers")?;
    let row_at = dom
        .find("data-consumer=\"billing\"")
        .context("billing listed")?;
    let row = &dom[row_at..dom[row_at..].find("</tr>").context("row end")? + row_at];
    ensure!(row.contains(">4</td>"), "billing pending 4: {row}");
    screenshot(&addr, "consumers", "consumers")?;

    // Backfills and signals: the failed signal with its reason.
    let dom = page(&addr, "backfills")?;
    let row_at = dom
        .find(&format!("data-signal=\"{signal}\""))
        .context("signal listed")?;
    let row = &dom[row_at..];
    ensure!(
        row.contains("failed") && row.contains("unknown field"),
        "{row}"
    );
    screenshot(&addr, "backfills", "backfills")?;

    // Configuration, secrets redacted.
    let dom = page(&addr, "config")?;
    ensure!(dom.contains("relay.dead_letter_subject"), "keys listed");
    ensure!(dom.contains("postgres.url"), "the URL listed");
    // The test server's URL is postgres://postgres:postgres@…: its password is redacted.
    ensure!(!dom.contains(":postgres@"), "no password shown");
    screenshot(&addr, "config", "config")?;

    // A traced event: published, with its consumer.
    let dom = page(&addr, &format!("trace/{}", ids[0]))?;
    ensure!(dom.contains("Published: published"), "traced: {dom}");
    ensure!(dom.contains("Row: found"), "its row");
    let consumers = &dom[dom
        .find("id=\"trace-consumers\"")
        .context("consumers step")?..];
    ensure!(
        consumers.contains("<td>billing</td>") && consumers.contains("not_reached"),
        "billing has not reached it: {consumers}"
    );
    screenshot(&addr, &format!("trace/{}", ids[0]), "trace")?;
    // Overview: the numbers /status gives, read before and after the browser.
    let before = status(&addr).await?;
    let dom = page(&addr, "overview")?;
    let after = status(&addr).await?;
    let published: u64 = text_of(&dom, "events-published")
        .context("events published shown")?
        .parse()?;
    ensure!(
        before["pipeline"]["events_published"] == published
            && after["pipeline"]["events_published"] == published,
        "events published {published} vs /status {} / {}",
        before["pipeline"]["events_published"],
        after["pipeline"]["events_published"]
    );
    ensure!(published == 5, "four events and a dead letter: {published}");
    let shown_lsn = parse_lsn(text_of(&dom, "checkpoint-lsn").context("checkpoint shown")?)
        .context("checkpoint is an LSN")?;
    let lsn = |s: &serde_json::Value| parse_lsn(s["postgres"]["checkpoint_lsn"].as_str()?);
    ensure!(
        lsn(&before) <= Some(shown_lsn) && Some(shown_lsn) <= lsn(&after),
        "checkpoint shown {shown_lsn:X} between /status's {:?} and {:?}",
        lsn(&before),
        lsn(&after)
    );
    ensure!(shown_lsn >= wal, "checkpoint shown past the last insert");
    ensure!(text_of(&dom, "slot") == Some("relay_slot"), "slot shown");
    ensure!(dom.contains("class=\"badge ok\""), "shown ready");
    ensure!(
        text_of(&dom, "stream") == Some(format!("OUTBOX · last seq {last_seq}").as_str()),
        "stream shown: {:?}",
        text_of(&dom, "stream")
    );
    let slot_lsn = parse_lsn(text_of(&dom, "slot-lsn").context("slot position shown")?)
        .context("the slot's position is an LSN")?;
    ensure!(slot_lsn >= wal, "slot confirmed past the last insert");
    // The charts: a line once two samples (10 s apart) are in.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let dom = page(&addr, "overview")?;
        let rate = &dom[dom.find("id=\"chart-rate\"").context("rate chart")?..];
        if rate[..rate.find("</svg>").context("svg")?].contains("<polyline") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no events/s line after 40 s: {rate}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    screenshot(&addr, "overview", "overview")?;

    drop(relay);
    Ok(())
}

/// The status code of `GET path` to `addr` with `headers` (each ending in CRLF) as written.
async fn raw_status(addr: &str, path: &str, headers: &str) -> Result<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n").as_bytes())
        .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await??;
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no status in {text}"))
}

/// An address of this machine other than loopback (where a route to the outside leaves).
fn outside_address() -> Result<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
    // Connecting a UDP socket sends nothing: it only picks the route and its source address.
    socket.connect("192.0.2.1:9")?;
    let ip = socket.local_addr()?.ip();
    ensure!(
        !ip.is_loopback() && !ip.is_unspecified(),
        "this machine has no address besides loopback ({ip}): the test needs one"
    );
    Ok(ip)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_answers_loopback_only_without_a_token_and_only_the_token_with_one()
-> Result<()> {
    let env = Env::start().await?;
    let port = relay_testkit::free_port();
    let config = env.config(&format!(
        "[http]\nlisten = \"0.0.0.0:{port}\"\nconsole = true\n"
    ));
    let relay = Relay::start_streaming(&config).await?;
    let local = format!("127.0.0.1:{port}");
    let outside = format!("{}:{port}", outside_address()?);
    let get = relay_ops::client::get_text;
    let (code, _) = get(&local, "/console/api/overview", Duration::from_secs(5)).await?;
    ensure!(code == 200, "loopback answered {code}");
    let (code, body) = get(&outside, "/console/api/overview", Duration::from_secs(5)).await?;
    ensure!(
        code == 403 && body.contains("only requests from this host"),
        "{code} {body}"
    );
    // From loopback, but addressed to a foreign name (DNS rebinding) or through a proxy.
    for extra in [
        "Host: evil.example\r\n",
        "Host: 127.0.0.1\r\nX-Forwarded-For: 10.9.9.9\r\n",
    ] {
        let status = raw_status(&local, "/console/api/overview", extra).await?;
        ensure!(status == 403, "{extra:?} answered {status}");
    }
    // The page holds no data; /status stays as it was.
    let (code, _) = get(&outside, "/console", Duration::from_secs(5)).await?;
    ensure!(code == 200);
    drop(relay);

    let token = "0123456789abcdef0123456789abcdef";
    let token_file = env.dir.path().join("console.token");
    std::fs::write(&token_file, format!("{token}\n"))?;
    let port = relay_testkit::free_port();
    let config = env.config(&format!(
        "[http]\nlisten = \"0.0.0.0:{port}\"\nconsole = true\nconsole_token_file = \"{}\"\n",
        token_file.display()
    ));
    let relay = Relay::start_streaming(&config).await?;
    let outside = format!("{}:{port}", outside_address()?);
    let (code, body) = get(&outside, "/console/api/overview", Duration::from_secs(5)).await?;
    ensure!(
        code == 403 && body.contains("needs its token"),
        "{code} {body}"
    );
    // The scheme's name is case-insensitive (RFC 9110), the token is not.
    let upper = token.to_uppercase();
    for (scheme, given, want) in [
        ("Bearer", token, 200),
        ("bearer", token, 200),
        ("BEARER", token, 200),
        ("bearer", upper.as_str(), 403),
        ("Basic", token, 403),
    ] {
        let headers = format!("Host: {outside}\r\nAuthorization: {scheme} {given}\r\n");
        let status = raw_status(&outside, "/console/api/overview", &headers).await?;
        ensure!(status == want, "{scheme} {given}: {status}, not {want}");
    }
    // A browser given the token in the address reads with it.
    let dom = loaded(&format!("http://{outside}/console#token={token}"), false)?;
    ensure!(
        dom.contains("id=\"events-published\""),
        "overview shown with the token: {dom}"
    );
    let dom = loaded(&format!("http://{outside}/console#overview"), true)?;
    ensure!(dom.contains("needs its token"), "refused without: {dom}");
    drop(relay);

    // A token file that is too short is a configuration error naming the file.
    std::fs::write(&token_file, "short")?;
    let mut run = Relay::start(&config)?;
    expect_exit(
        &mut run,
        78,
        Duration::from_secs(20),
        &["console_token_file"],
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fixed_dead_letter_is_re_published_by_a_click_in_the_console() -> Result<()> {
    let env = Env::start().await?;
    let token = "fedcba9876543210fedcba9876543210";
    let token_file = env.dir.path().join("console.token");
    std::fs::write(&token_file, token)?;
    let addr = format!("127.0.0.1:{}", relay_testkit::free_port());
    let config = env.config(&format!(
        "dead_letter_subject = \"outbox.dead.letters\"\n[http]\nlisten = \"{addr}\"\nconsole = true\nconsole_write = true\nconsole_token_file = \"{}\"\n",
        token_file.display()
    ));
    let relay = Relay::start_streaming(&config).await?;
    let db = env.db().await?;
    let js = env.jetstream().await?;
    // An empty `type` cannot form a subject token: dead-lettered.
    // Longer than a listing's preview: re-published from the whole dead letter.
    let padding = "p".repeat(400);
    let bad =
        insert_unroutable(&db, &format!(r#"{{"fixed": "later", "pad": "{padding}"}}"#)).await?;
    let after = insert_event(&db, "Order", "created", "{}").await?;
    wait_for_id(&js, &after, &relay).await?;
    let letters = read_stream(&js).await?;
    let letter = letters
        .iter()
        .find(|m| m.subject == "outbox.dead.letters")
        .context("the dead letter")?;
    ensure!(
        !letters.iter().any(|m| m.id() == bad),
        "not published under its own id before the fix"
    );

    let browser = webdriver::Browser::start(&chromium()?).await?;
    browser
        .open(&format!("http://{addr}/console#token={token}"))
        .await?;
    browser
        .open(&format!("http://{addr}/console#dead-letters"))
        .await?;
    let button = format!("button.republish[data-seq=\"{}\"]", letter.seq);
    ensure!(
        browser.text(&button).await? == "Re-publish",
        "a re-publish button for the dead letter"
    );
    browser
        .screenshot(&artifacts()?.join("dead-letters-write.png"))
        .await?;

    // The cause is fixed in the row; then one click.
    db.execute(
        "UPDATE outbox SET type = 'fixed' WHERE id = $1::text::uuid",
        &[&bad],
    )
    .await?;
    browser.click(&button).await?;
    browser
        .wait_for(
            "the signal shown",
            "return document.querySelector('#republish-result a.signal-link') !== null",
        )
        .await?;
    let signal: i64 = browser
        .text("#republish-result a.signal-link")
        .await?
        .parse()
        .context("signal id shown")?;
    wait_signal(&db, signal, "done", &relay).await?;
    let row = db
        .query_one(
            "SELECT requested_by, outcome, args->>'where' FROM outbox_relay.signal WHERE id = $1",
            &[&signal],
        )
        .await?;
    let (by, outcome, filter): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    ensure!(by == "console", "requested by the console: {by}");
    ensure!(outcome.contains("finished: 1 rows"), "{outcome}");
    ensure!(filter.contains(&bad), "{filter}");

    // The row arrives under its own id, as fixed, marked as read from the table.
    let stream = wait_for_id(&js, &bad, &relay).await?;
    let fixed = stream.iter().find(|m| m.id() == bad).context("fixed")?;
    ensure!(fixed.subject == "outbox.Order.fixed", "{fixed:?}");
    ensure!(fixed.header("Outbox-Backfill") == "true", "{fixed:?}");
    ensure!(
        stream.iter().filter(|m| m.id() == bad).count() == 1,
        "published once"
    );

    browser
        .open(&format!("http://{addr}/console#backfills"))
        .await?;
    let state = browser
        .text(&format!("tr[data-signal=\"{signal}\"] td.state"))
        .await?;
    ensure!(state == "done", "backfills page shows the signal {state}");
    browser
        .screenshot(&artifacts()?.join("republished.png"))
        .await?;

    // A replay asked for on the Consumers page: billing goes back to the first event.
    let first = stream.iter().min_by_key(|m| m.seq).context("first")?;
    js.get_stream(STREAM)
        .await?
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            filter_subject: "outbox.>".into(),
            ..Default::default()
        })
        .await?;
    let read = fetch_acked(&js, "billing", 10).await?;
    ensure!(
        read.len() == stream.len(),
        "billing read everything first: {read:?}"
    );
    browser
        .open(&format!("http://{addr}/console#consumers"))
        .await?;
    browser
        .type_into(
            "input.replay-from[data-consumer=\"billing\"]",
            first.header("Outbox-Commit-Lsn"),
        )
        .await?;
    if !relay_nats::supports_consumer_reset(&js.client().server_info().version) {
        // No consumer reset API on this nats-server: it is re-created (nothing reads it now).
        browser
            .click("input.replay-recreate[data-consumer=\"billing\"]")
            .await?;
    }
    browser
        .screenshot(&artifacts()?.join("consumers-write.png"))
        .await?;
    browser
        .click("button.replay[data-consumer=\"billing\"]")
        .await?;
    let replayed = requested_signal(&browser).await?;
    wait_signal(&db, replayed, "done", &relay).await?;
    ensure!(
        fetch_acked(&js, "billing", 10).await?.first() == Some(&first.seq),
        "billing delivers from the first event again"
    );

    // A backfill asked for on the Backfills page (of the table's rows, none missing).
    browser
        .open(&format!("http://{addr}/console#backfills"))
        .await?;
    browser.click("#backfill-start").await?;
    let backfill = requested_signal(&browser).await?;
    wait_signal(&db, backfill, "done", &relay).await?;
    let by: String = db
        .query_one(
            "SELECT requested_by FROM outbox_relay.signal WHERE id = $1",
            &[&backfill],
        )
        .await?
        .get(0);
    ensure!(by == "console");
    // Shown again (another view first: the same address is no navigation).
    browser
        .open(&format!("http://{addr}/console#overview"))
        .await?;
    browser
        .open(&format!("http://{addr}/console#backfills"))
        .await?;
    for (id, kind) in [(replayed, "replay"), (backfill, "backfill")] {
        let state = browser
            .text(&format!("tr[data-signal=\"{id}\"] td.state"))
            .await?;
        ensure!(state == "done", "the {kind} signal shown done: {state}");
    }
    browser
        .screenshot(&artifacts()?.join("backfills-write.png"))
        .await?;

    // Without the token the same request is refused (the page's token is the tab's).
    let refused = browser
        .run(
            "return fetch('/console/api/dead-letters/republish', {method: 'POST', \
             headers: {'Content-Type': 'application/json'}, body: '{\"all\": true}'}).then(r => r.status)",
        )
        .await?;
    ensure!(
        refused == serde_json::json!(403),
        "without the token: {refused}"
    );
    browser.close().await?;

    // The relay streamed on, and its checkpoint passes a row inserted now.
    let last = insert_event(&db, "Order", "created", "{}").await?;
    wait_for_id(&js, &last, &relay).await?;
    let wal = env.current_wal().await?;
    env.wait_checkpoint(wal, Duration::from_secs(30)).await?;
    Ok(())
}
