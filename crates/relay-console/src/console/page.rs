//! The console's files, compiled in: one relay's page and script, the fleet page and its
//! script, what both scripts share, the style. A page is served with what it needs to know
//! filled in (`{{NAME}}` in the HTML): where its relay's JSON is, where its readiness is, which
//! pipeline it shows, whether it may change anything. Nothing else in a page holds data.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const RELAY_PAGE: &str = include_str!("page.html");
const FLEET_PAGE: &str = include_str!("fleet.html");
const COMMON_SCRIPT: &str = include_str!("common.js");
const RELAY_SCRIPT: &str = include_str!("app.js");
const FLEET_SCRIPT: &str = include_str!("fleet.js");
const STYLE: &str = include_str!("style.css");

/// Only the console's own files: no inline script, nothing from elsewhere.
const CSP: &str = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

/// The footer's line on what the console may do.
fn access_text(write: bool) -> &'static str {
    if write {
        "Write access on: backfills, replays and re-publishing of dead letters can be started here."
    } else {
        "Read-only."
    }
}

/// One relay's page: the only relay's at `/console` (`pipeline` `None`: its JSON under
/// `/console/api/`, its readiness `/readyz`), or a fleet pipeline's at `/console/p/{name}/`
/// (its JSON under `/console/p/{name}/api/`, its own readiness, a link back to the fleet).
pub(super) fn relay_page(write: bool, pipeline: Option<&str>) -> String {
    let (base, ready, title, heading) = match pipeline {
        None => (
            "/console/".to_owned(),
            "/readyz".to_owned(),
            "outbox-relay console".to_owned(),
            "outbox-relay".to_owned(),
        ),
        Some(name) => {
            let base = format!("/console/p/{}/", url_segment(name));
            let name = escape(name);
            (
                base.clone(),
                format!("{base}api/ready"),
                format!("{name} · outbox-relay console"),
                format!(
                    "<a id=\"fleet-link\" href=\"/console/\">outbox-relay</a> · <span id=\"pipeline-name\">{name}</span>"
                ),
            )
        }
    };
    fill(
        RELAY_PAGE,
        &[
            ("BASE", &escape(&base)),
            ("READY", &escape(&ready)),
            ("TITLE", &title),
            ("HEADING", &heading),
            ("ACCESS", access_text(write)),
        ],
    )
}

/// The fleet page at `/console`.
pub(super) fn fleet_page(write: bool) -> String {
    fill(FLEET_PAGE, &[("ACCESS", access_text(write))])
}

/// `template` with each `{{KEY}}` of `values` replaced, in one pass: a value is never read
/// as a template itself. An unknown key is left as written.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let known = after.find("}}").and_then(|close| {
            let key = &after[..close];
            values
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, value)| (*value, close))
        });
        match known {
            Some((value, close)) => {
                out.push_str(value);
                rest = &after[close + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `text` safe inside HTML text and double-quoted attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `name` as one path segment: pipeline names are letters, digits, `-` and `_` (the fleet's
/// configuration refuses others), anything else is percent-encoded all the same.
pub(super) fn url_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A page as served: never cached (its filled-in values change with the fleet), only the
/// console's own files allowed in it.
pub(super) fn html(text: &str) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text.to_owned(),
    )
        .into_response()
}

/// The scripts and the style, at the same paths for one relay's console and a fleet's.
pub(super) fn assets() -> axum::Router {
    let script = |text: &'static str| {
        get(move || async move {
            (
                [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                text,
            )
        })
    };
    axum::Router::new()
        .route("/console/common.js", script(COMMON_SCRIPT))
        .route("/console/app.js", script(RELAY_SCRIPT))
        .route("/console/fleet.js", script(FLEET_SCRIPT))
        .route(
            "/console/style.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_replaces_known_keys_once_and_leaves_the_rest() {
        assert_eq!(fill("a {{X}} b {{X}}", &[("X", "1")]), "a 1 b 1");
        // A value holding a key is not filled in again.
        assert_eq!(fill("{{X}}{{Y}}", &[("X", "{{Y}}"), ("Y", "2")]), "{{Y}}2");
        assert_eq!(fill("{{NOPE}} {{", &[("X", "1")]), "{{NOPE}} {{");
        assert_eq!(fill("}} {{X", &[("X", "1")]), "}} {{X");
    }

    #[test]
    fn one_relays_page_keeps_todays_paths() {
        let page = relay_page(false, None);
        assert!(page.contains(r#"data-base="/console/""#), "{page}");
        assert!(page.contains(r#"data-ready="/readyz""#), "{page}");
        assert!(page.contains("<h1>outbox-relay</h1>"), "{page}");
        assert!(page.contains("Read-only."), "{page}");
        assert!(!page.contains("{{"), "every value filled in: {page}");
    }

    #[test]
    fn a_pipelines_page_reads_under_its_base_and_links_back() {
        let page = relay_page(true, Some("orders"));
        assert!(page.contains(r#"data-base="/console/p/orders/""#), "{page}");
        assert!(
            page.contains(r#"data-ready="/console/p/orders/api/ready""#),
            "{page}"
        );
        assert!(page.contains(r#"href="/console/""#), "{page}");
        assert!(page.contains(r#"<span id="pipeline-name">orders</span>"#));
        assert!(page.contains("Write access on"), "{page}");
        assert!(!page.contains("{{"), "every value filled in: {page}");
        let odd = relay_page(false, Some("a\"<b> c"));
        assert!(
            odd.contains(r#"data-base="/console/p/a%22%3Cb%3E%20c/""#),
            "{odd}"
        );
        assert!(odd.contains("a&quot;&lt;b&gt; c"), "{odd}");
        assert!(!odd.contains("<b>"), "{odd}");
    }

    #[test]
    fn the_fleet_page_says_what_the_console_may_do() {
        let page = fleet_page(false);
        assert!(page.contains("Read-only."), "{page}");
        assert!(page.contains("/console/fleet.js"), "{page}");
        assert!(!page.contains("{{"), "{page}");
    }
}
