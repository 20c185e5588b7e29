//! Who may read the console's JSON: without `[http] console_token_file` only requests from
//! loopback, with it only requests carrying the token (`Authorization: Bearer`). One guard for
//! every console route that answers with data, a fleet's and each pipeline's alike; the pages
//! themselves hold no data.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The console's access rule.
#[derive(Debug)]
pub(crate) struct Access {
    /// `[http] console_token_file`'s token (`None`: loopback only).
    token: Option<String>,
}

impl Access {
    pub(crate) fn new(token: Option<String>) -> Self {
        Self { token }
    }
}

/// Lets through requests with the token, or from loopback when there is none.
pub(crate) async fn guard(
    State(access): State<Arc<Access>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let allowed = match &access.token {
        Some(token) => headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .is_some_and(|given| constant_time_eq(given.as_bytes(), token.as_bytes())),
        None => local_request(
            peer.ip(),
            headers.get(header::HOST).and_then(|v| v.to_str().ok()),
            headers.contains_key(header::FORWARDED) || headers.contains_key("x-forwarded-for"),
        ),
    };
    if allowed {
        return next.run(request).await;
    }
    let why = if access.token.is_some() {
        "the console needs its token: open it as /console#token=<the token in [http] console_token_file>"
    } else {
        "without a token the console answers only requests from this host to a loopback address (localhost, 127.0.0.1, [::1]) not passed on by a proxy: set [http] console_token_file to open it from elsewhere"
    };
    (
        StatusCode::FORBIDDEN,
        axum::Json(serde_json::json!({ "error": why })),
    )
        .into_response()
}

/// The token of an `Authorization` value of the Bearer scheme, whose name is case-insensitive
/// (RFC 9110, 11.1): `Bearer <token>`, `bearer <token>`; one or more spaces after it.
fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Whether a request without a token may read: from loopback (an IPv4 peer of a dual-stack
/// listener counts by its IPv4 address), addressed to a loopback name (a page elsewhere whose
/// name was pointed at 127.0.0.1, DNS rebinding, names its own host), and not passed on by a
/// proxy on this host (whose requests all come from loopback).
fn local_request(peer: std::net::IpAddr, host: Option<&str>, forwarded: bool) -> bool {
    let Some(host) = host else {
        return false;
    };
    // `name:port`, `[v6]:port`, or a name alone.
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let local_name = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback());
    peer.to_canonical().is_loopback() && local_name && !forwarded
}

/// Compares without returning early at the first difference (no timing hint of the token).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_token_only_local_requests_to_a_local_name_are_let_through() {
        let v4: std::net::IpAddr = "127.0.0.1".parse().expect("ip");
        let mapped: std::net::IpAddr = "::ffff:127.0.0.1".parse().expect("ip");
        let remote: std::net::IpAddr = "10.1.2.3".parse().expect("ip");
        assert!(local_request(v4, Some("127.0.0.1:9464"), false));
        assert!(local_request(v4, Some("localhost:9464"), false));
        assert!(local_request(mapped, Some("[::1]:9464"), false));
        assert!(local_request(v4, Some("localhost"), false));
        assert!(!local_request(remote, Some("127.0.0.1:9464"), false));
        // DNS rebinding: a foreign name pointed at 127.0.0.1.
        assert!(!local_request(v4, Some("evil.example:9464"), false));
        assert!(!local_request(v4, None, false));
        // A proxy on this host passes everyone's requests on from loopback.
        assert!(!local_request(v4, Some("127.0.0.1:9464"), true));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_is_not() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  abc"), Some("abc"));
        assert_eq!(bearer_token("bearer ABC"), Some("ABC"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(bearer_token("abc"), None);
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
