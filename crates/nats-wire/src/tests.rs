//! The lean connection against a scripted server on a local socket: what nats-server rarely
//! does on cue (a `PING` of its own, an `INFO` update, a 503, a closing `-ERR`).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::{
    ConnectOptions, Connection, Credentials, Outcome, Plain, PlainMessage, WireError, WireErrorKind,
};

/// No user, token or key; no TLS.
struct Anonymous;

impl Credentials for Anonymous {
    fn user(&self) -> Option<(&str, &str)> {
        None
    }
    fn token(&self) -> Option<&str> {
        None
    }
    fn nkey(&self) -> Option<&nkeys::KeyPair> {
        None
    }
    fn jwt(&self) -> Option<(&str, &nkeys::KeyPair)> {
        None
    }
    fn tls(&self) -> Result<&Arc<rustls::ClientConfig>, &str> {
        Err("no TLS in these tests")
    }
}

fn connection(port: u16, ack_timeout: Duration) -> Connection<Plain> {
    let options = ConnectOptions::new(&format!("nats://127.0.0.1:{port}"), Arc::new(Anonymous))
        .expect("a server URL");
    Connection::new(Arc::new(options), ack_timeout)
}

fn msg(id: &str) -> Arc<PlainMessage> {
    Arc::new(PlainMessage::new("outbox.a", id, Bytes::from_static(b"{}")))
}

/// Publishes event `id` as the publisher does: ready (not waiting for a lost connection), then
/// queued.
async fn ready_publish(
    lean: &Connection<Plain>,
    id: &str,
) -> Result<oneshot::Receiver<Outcome>, WireError> {
    assert!(lean.ready(Duration::ZERO).await, "not refused");
    lean.publish("OUTBOX", &msg(id))
}

/// Reads from `socket` until `needle` has been seen; returns all that was read.
async fn read_until(socket: &mut TcpStream, seen: &mut BytesMut, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(seen).into_owned();
        if let Some(at) = text.find(needle) {
            let upto = at + needle.len();
            let _ = seen.split_to(upto);
            return text[..upto].to_owned();
        }
        let read = tokio::time::timeout_at(deadline, socket.read_buf(seen)).await;
        assert!(
            matches!(read, Ok(Ok(n)) if n > 0),
            "`{needle}` not received; got {text:?}"
        );
    }
}

/// The reply subject of the (only) `HPUB` in `frames`.
/// Accepts the client's connection as a server whose `max_payload` is 1,000 bytes, through its
/// first `PING`/`PONG`.
async fn accept_with_small_payload(listener: &TcpListener) -> (TcpStream, BytesMut) {
    let (mut socket, _) = listener.accept().await.unwrap();
    let mut seen = BytesMut::new();
    socket
        .write_all(b"INFO {\"headers\":true,\"max_payload\":1000}\r\n")
        .await
        .unwrap();
    read_until(&mut socket, &mut seen, "PING\r\n").await;
    socket.write_all(b"PONG\r\n").await.unwrap();
    (socket, seen)
}

fn reply_of(frames: &str) -> String {
    let line = frames
        .lines()
        .find(|l| l.starts_with("HPUB "))
        .expect("an HPUB");
    line.split(' ').nth(2).expect("a reply subject").to_owned()
}

#[tokio::test]
async fn the_session_answers_pings_learns_servers_and_reports_closes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let lean = connection(port, Duration::from_secs(30));
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut seen = BytesMut::new();
        socket
            .write_all(b"INFO {\"version\":\"9.9.9\",\"headers\":true,\"max_payload\":1000}\r\n")
            .await
            .unwrap();
        let hello = read_until(&mut socket, &mut seen, "PING\r\n").await;
        assert!(hello.starts_with("CONNECT {"), "{hello}");
        assert!(hello.contains("\"headers\":true") && hello.contains("\"no_responders\":true"));
        assert!(hello.contains("\r\nSUB _INBOX."), "{hello}");
        socket.write_all(b"PONG\r\n").await.unwrap();
        // The first publish: a PubAck, after a PING of the server's and an INFO update.
        let frames = read_until(&mut socket, &mut seen, "{}\r\n").await;
        let reply = reply_of(&frames);
        socket
            .write_all(b"PING\r\nINFO {\"headers\":true,\"max_payload\":2000,\"connect_urls\":[\"127.0.0.1:1\"]}\r\n")
            .await
            .unwrap();
        read_until(&mut socket, &mut seen, "PONG\r\n").await;
        let ack = br#"{"stream":"OUTBOX","seq":41}"#;
        let frame = format!("MSG {reply} 1 {}\r\n", ack.len());
        socket.write_all(frame.as_bytes()).await.unwrap();
        socket.write_all(ack).await.unwrap();
        socket.write_all(b"\r\n").await.unwrap();
        // The second: no responders.
        let frames = read_until(&mut socket, &mut seen, "{}\r\n").await;
        let reply = reply_of(&frames);
        let status = format!("HMSG {reply} 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n");
        socket.write_all(status.as_bytes()).await.unwrap();
        // The third: the server refuses it and closes the connection.
        read_until(&mut socket, &mut seen, "{}\r\n").await;
        socket
            .write_all(b"-ERR 'Maximum Control Line Exceeded'\r\n")
            .await
            .unwrap();
        drop(socket);
    });
    let first = ready_publish(&lean, "a").await.unwrap();
    let stored = first.await.unwrap().unwrap();
    assert_eq!((stored.seq, stored.duplicate), (41, false));
    assert_eq!(lean.max_payload(), 2000, "the INFO update");
    assert!(
        lean.inner.lock().discovered.iter().any(|s| s.port == 1),
        "connect_urls learned for failover"
    );
    let second = ready_publish(&lean, "b").await.unwrap();
    let none = second.await.unwrap().unwrap_err();
    assert_eq!(none.kind, WireErrorKind::NoResponders, "{none}");
    let third = ready_publish(&lean, "c").await.unwrap();
    let closed = third.await.unwrap().unwrap_err();
    assert_eq!(closed.kind, WireErrorKind::ClosedByServer, "{closed}");
    assert!(
        closed.to_string().contains("Maximum Control Line Exceeded"),
        "{closed}"
    );
    server.await.unwrap();
    // Down now (the scripted server is gone): a send that does not wait fails as unknown.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let down = ready_publish(&lean, "d").await.unwrap_err();
    assert_eq!(down.kind, WireErrorKind::Unknown, "{down}");
}

#[tokio::test]
async fn an_unanswered_publish_times_out_as_unknown_without_a_timer_of_its_own() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let ack_timeout = Duration::from_millis(300);
    let lean = connection(port, ack_timeout);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut socket, mut seen) = accept_with_small_payload(&listener).await;
        read_until(&mut socket, &mut seen, "{}\r\n").await;
        // Never answers; keeps the connection open until the test is done.
        let _ = done_rx.await;
    });
    let started = tokio::time::Instant::now();
    let ack = ready_publish(&lean, "a").await.unwrap();
    let error = ack.await.unwrap().unwrap_err();
    assert_eq!(error.kind, WireErrorKind::Unknown, "{error}");
    assert!(
        error
            .to_string()
            .contains("no PubAck within nats.ack_timeout"),
        "{error}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= ack_timeout && waited < ack_timeout + Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(lean.inner.lock().pending.len(), 0);
    let _ = done_tx.send(());
    server.await.unwrap();
}

/// A header line that would end early (CR, LF, NUL in a name or a value, shared or the
/// message's own) is refused before anything is written, and the next message is framed as
/// usual.
#[test]
fn a_header_with_a_line_break_or_nul_is_never_framed() {
    use crate::headers::WireHeaders;
    use crate::proto::ReplyTo;
    let frame = |msg: &PlainMessage, extra: &[(&str, &str)]| {
        let mut out = bytes::BytesMut::new();
        let result = WireHeaders::default().write_hpub_with::<Plain>(
            &mut out,
            "OUTBOX",
            msg,
            ReplyTo::Numbered("_INBOX.t", 1),
            extra,
        );
        (result, out.len())
    };
    let with = |name: &str, value: &str, shared: usize| {
        let mut msg = PlainMessage::new("outbox.x", "id-1", bytes::Bytes::from_static(b"{}"));
        msg.headers = vec![(name.into(), value.into())];
        msg.shared = shared;
        msg
    };
    for bad in ["a\r\nb", "a\nb", "a\rb", "a\0b"] {
        for shared in [0, 1] {
            let (result, written) = frame(&with("Note", bad, shared), &[]);
            let error = result.expect_err("refused");
            assert_eq!(
                error.kind,
                WireErrorKind::Unsendable {
                    header: "Note".into()
                }
            );
            assert_eq!(written, 0, "nothing written");
            let (result, written) = frame(&with(bad, "v", shared), &[]);
            assert!(result.is_err() && written == 0, "a bad name {bad:?}");
        }
        let (result, _) = frame(
            &with("Note", "ok", 0),
            &[("Nats-Expected-Last-Msg-Id", bad)],
        );
        assert!(result.is_err(), "a bad extra line");
        let mut msg = with("Note", "ok", 0);
        msg.msg_id = format!("id{bad}");
        assert!(frame(&msg, &[]).0.is_err(), "a bad id");
    }
    let (result, written) = frame(&with("Note", "fine", 1), &[]);
    assert!(result.is_ok() && written > 0);
}

#[test]
fn line_safe_finds_cr_lf_and_nul_at_every_position_and_nothing_else() {
    use crate::headers::line_safe;
    for len in 0..40 {
        let clean: String = (0..len)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        assert!(line_safe(&clean));
        for at in 0..len {
            for bad in ['\r', '\n', '\0'] {
                let mut text: Vec<char> = clean.chars().collect();
                text[at] = bad;
                let text: String = text.into_iter().collect();
                assert!(!line_safe(&text), "{text:?}");
            }
            // Other control characters and non-ASCII bytes are the route's to judge.
            for fine in ['\t', '\u{1f}', 'é', '\u{80}'] {
                let mut text: Vec<char> = clean.chars().collect();
                text[at] = fine;
                let text: String = text.into_iter().collect();
                assert!(line_safe(&text), "{text:?}");
            }
        }
    }
}

/// An `INFO` announcing thousands of servers does not grow the failover list past its bound.
#[tokio::test]
async fn the_servers_an_info_announces_are_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let lean = connection(port, Duration::from_secs(30));
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut seen = BytesMut::new();
        socket
            .write_all(b"INFO {\"version\":\"9.9.9\",\"headers\":true,\"max_payload\":1000}\r\n")
            .await
            .unwrap();
        read_until(&mut socket, &mut seen, "PING\r\n").await;
        socket.write_all(b"PONG\r\n").await.unwrap();
        let urls: Vec<String> = (0..5000)
            .map(|i| format!("\"10.9.{}.{}:4222\"", i / 250, i % 250))
            .collect();
        let info = format!(
            "INFO {{\"headers\":true,\"connect_urls\":[{}]}}\r\nPING\r\n",
            urls.join(",")
        );
        socket.write_all(info.as_bytes()).await.unwrap();
        read_until(&mut socket, &mut seen, "PONG\r\n").await;
        socket
    });
    assert!(lean.ready(Duration::from_secs(5)).await, "connected");
    let _socket = server.await.unwrap();
    let learned = lean.inner.lock().discovered.len();
    assert_eq!(learned, 64, "MAX_DISCOVERED");
}

#[tokio::test]
async fn a_message_longer_than_max_payload_drops_the_connection_instead_of_buffering_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let lean = connection(port, Duration::from_secs(30));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut socket, mut seen) = accept_with_small_payload(&listener).await;
        let frames = read_until(&mut socket, &mut seen, "{}\r\n").await;
        let reply = reply_of(&frames);
        // A reply announcing 100 MB to a client told that nothing exceeds 1,000 bytes; only
        // its first bytes ever come.
        let line = format!("MSG {reply} 1 100000000\r\n{{\"stream\":");
        socket.write_all(line.as_bytes()).await.unwrap();
        let _ = done_rx.await;
    });
    let ack = ready_publish(&lean, "a").await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), ack)
        .await
        .expect("resolved at the line, not after the ack timeout")
        .unwrap()
        .unwrap_err();
    assert_eq!(lost.kind, WireErrorKind::Unknown, "{lost}");
    assert!(lost.to_string().contains("max_payload"), "{lost}");
    let _ = done_tx.send(());
    server.await.unwrap();
}
