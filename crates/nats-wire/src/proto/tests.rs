use super::*;

fn parse_all(input: &[u8]) -> Vec<ServerOp> {
    let mut buf = BytesMut::from(input);
    let mut ops = Vec::new();
    while let Some(op) = parse_op(&mut buf, MAX_SERVER_MESSAGE).expect("parses") {
        ops.push(op);
    }
    assert!(buf.is_empty(), "all consumed: {buf:?}");
    ops
}

#[test]
fn hpub_frames_are_exact() {
    let mut out = BytesMut::new();
    let head = b"NATS/1.0\r\nNats-Expected-Stream: OUTBOX\r\n";
    let tail_len = header_line_len("Nats-Msg-Id", "ev-1");
    write_hpub(
        &mut out,
        "outbox.a",
        ReplyTo::Numbered("_INBOX.x", 26),
        head,
        tail_len,
        |out| put_header_line(out, "Nats-Msg-Id", "ev-1"),
        b"hello",
    );
    let block = "NATS/1.0\r\nNats-Expected-Stream: OUTBOX\r\nNats-Msg-Id: ev-1\r\n\r\n";
    let expected = format!(
        "HPUB outbox.a _INBOX.x.000000000000001a {} {}\r\n{block}hello\r\n",
        block.len(),
        block.len() + 5
    );
    assert_eq!(std::str::from_utf8(&out).unwrap(), expected);
    // No reply subject (an atomic batch's message before its commit): one space between
    // the fields, as the protocol has it.
    let mut out = BytesMut::new();
    write_hpub(
        &mut out,
        "outbox.a",
        ReplyTo::None,
        head,
        tail_len,
        |out| put_header_line(out, "Nats-Msg-Id", "ev-1"),
        b"hello",
    );
    let unanswered = format!(
        "HPUB outbox.a {} {}\r\n{block}hello\r\n",
        block.len(),
        block.len() + 5
    );
    assert_eq!(std::str::from_utf8(&out).unwrap(), unanswered);
    // A reply subject of the caller's (a fast batch's), and a batch's commit.
    let mut out = BytesMut::new();
    write_hpub(
        &mut out,
        "outbox.a",
        ReplyTo::Subject("_INBOX.b.500.fail.3.1.$FI"),
        head,
        tail_len,
        |out| put_header_line(out, "Nats-Msg-Id", "ev-1"),
        b"hello",
    );
    assert!(
        std::str::from_utf8(&out)
            .unwrap()
            .starts_with("HPUB outbox.a _INBOX.b.500.fail.3.1.$FI "),
        "{out:?}"
    );
    let mut out = BytesMut::new();
    write_empty_pub(&mut out, "outbox.a", "_INBOX.b.500.fail.4.3.$FI");
    assert_eq!(
        &out[..],
        b"PUB outbox.a _INBOX.b.500.fail.4.3.$FI 0\r\n\r\n"
    );
    assert_eq!(
        header_block_lines(block.as_bytes()).unwrap(),
        vec![
            ("Nats-Expected-Stream".into(), "OUTBOX".into()),
            ("Nats-Msg-Id".into(), "ev-1".into())
        ]
    );
}

#[test]
fn reply_tokens_round_trip_at_a_fixed_length() {
    for n in [0, 1, 26, u64::from(u32::MAX), u64::MAX] {
        let mut out = BytesMut::new();
        put_reply_token(&mut out, n);
        assert_eq!(out.len(), REPLY_TOKEN_LEN);
        assert_eq!(parse_reply_token(&out), Some(n));
    }
    assert_eq!(parse_reply_token(b"000000000000001"), None, "too short");
    assert_eq!(parse_reply_token(b"000000000000001G"), None);
}

#[test]
fn connect_sub_and_numbers() {
    let mut out = BytesMut::new();
    write_sub(&mut out, "_INBOX.x.*", 1);
    put_decimal(&mut out, 0);
    put_decimal(&mut out, 1_234_567);
    assert_eq!(&out[..], b"SUB _INBOX.x.* 1\r\n01234567");
    let mut out = BytesMut::new();
    write_connect(
        &mut out,
        &ConnectInfo {
            verbose: false,
            pedantic: false,
            tls_required: false,
            name: "n",
            lang: "rust",
            version: "1",
            protocol: 1,
            echo: true,
            headers: true,
            no_responders: true,
            user: Some("u"),
            pass: None,
            auth_token: None,
            jwt: None,
            nkey: None,
            sig: None,
        },
    );
    let text = std::str::from_utf8(&out).unwrap();
    assert!(
        text.starts_with("CONNECT {") && text.ends_with("}\r\n"),
        "{text}"
    );
    assert!(text.contains("\"headers\":true,\"no_responders\":true"));
    assert!(text.contains("\"user\":\"u\"") && !text.contains("pass"));
}

#[test]
fn server_operations_parse() {
    let input = b"INFO {\"version\":\"2.9.0\",\"max_payload\":1048576,\"headers\":true,\"connect_urls\":[\"10.0.0.1:4222\"],\"nonce\":\"abc\"}\r\n\
PING\r\npong\r\n+OK\r\n-ERR 'Permissions Violation for Publish to \"outbox.a\"'\r\n\
MSG _INBOX.x.1 1 5\r\nhello\r\n\
MSG a.b 9 reply.to 0\r\n\r\n\
HMSG _INBOX.x.2 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n\
HMSG s 1 r 12 14\r\nNATS/1.0\r\n\r\nhi\r\n";
    let ops = parse_all(input);
    let ServerOp::Info(info) = &ops[0] else {
        panic!("{ops:?}")
    };
    let info = info.parse().unwrap();
    assert_eq!(info.version, "2.9.0");
    assert_eq!(info.max_payload, 1_048_576);
    assert_eq!(info.connect_urls, vec!["10.0.0.1:4222".to_owned()]);
    assert_eq!(info.nonce.as_deref(), Some("abc"));
    assert!(info.headers && !info.tls_required);
    assert_eq!(
        &ops[1..5],
        &[
            ServerOp::Ping,
            ServerOp::Pong,
            ServerOp::Ok,
            ServerOp::Err("Permissions Violation for Publish to \"outbox.a\"".into())
        ]
    );
    let msg = |subject: &str, headers: Option<&[u8]>, payload: &[u8]| ServerOp::Msg {
        subject: Bytes::copy_from_slice(subject.as_bytes()),
        headers: headers.map(Bytes::copy_from_slice),
        payload: Bytes::copy_from_slice(payload),
    };
    assert_eq!(ops[5], msg("_INBOX.x.1", None, b"hello"));
    assert_eq!(ops[6], msg("a.b", None, b""));
    assert_eq!(
        ops[7],
        msg("_INBOX.x.2", Some(b"NATS/1.0 503\r\n\r\n"), b"")
    );
    assert_eq!(ops[8], msg("s", Some(b"NATS/1.0\r\n\r\n"), b"hi"));
    assert_eq!(status_code(b"NATS/1.0 503\r\n\r\n"), Some(503));
    assert_eq!(
        status_code(b"NATS/1.0 408 Request Timeout\r\n\r\n"),
        Some(408)
    );
    assert_eq!(status_code(b"NATS/1.0\r\n\r\n"), None);
    assert_eq!(ops.len(), 9);
}

#[test]
fn split_reads_wait_for_the_whole_operation() {
    let input: &[u8] =
        b"MSG _INBOX.x.1 1 5\r\nhello\r\nHMSG s 1 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPING\r\n";
    // Every split point: the parser returns nothing until an operation is complete, and
    // the same operations in the end.
    let whole = parse_all(input);
    assert_eq!(whole.len(), 3);
    for cut in 0..input.len() {
        let mut buf = BytesMut::from(&input[..cut]);
        let mut ops = Vec::new();
        while let Some(op) = parse_op(&mut buf, MAX_SERVER_MESSAGE).unwrap() {
            ops.push(op);
        }
        buf.extend_from_slice(&input[cut..]);
        while let Some(op) = parse_op(&mut buf, MAX_SERVER_MESSAGE).unwrap() {
            ops.push(op);
        }
        assert_eq!(ops, whole, "cut at {cut}");
    }
}

/// Minimal cases the property tests (parser_props.rs) found: each was read as a frame.
#[test]
fn a_frame_ends_exactly_where_its_lengths_say() {
    for bad in [
        // A length short of the payload: `hell` was taken, `o\r` skipped as the CRLF.
        &b"MSG s 1 4\r\nhello\r\n"[..],
        // A length one over: the CRLF taken as the payload, `\nx` as the CRLF.
        b"MSG A A 1\r\n\r\nxxx",
        // The control line's CRLF missing: the next bytes were taken as the CRLF.
        b"MSG\t>\ta\t0\r\nPING\r\n",
        // Not a NATS/1.0 header block.
        b"HMSG > A 12 13\r\nNATS/2.0\r\n\r\nx\r\n",
        b"HMSG > A 10 10\r\nNATS/1.0\r\n\r\n",
        // A sign is not a digit (`usize::from_str` takes `+5`).
        b"MSG s 1 +5\r\nhello\r\n",
        // No message is that long: an error now, not a wait for bytes that never come.
        b"MSG s 1 18446744073709551000\r\nx",
        b"MSG s 1 2147483648\r\nx",
        // PING, PONG and +OK take no arguments.
        b"PING 0\r\n",
        b"+OK x\r\n",
    ] {
        let mut buf = BytesMut::from(bad);
        assert!(
            parse_op(&mut buf, MAX_SERVER_MESSAGE).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn garbage_is_an_error() {
    for bad in [
        &b"FOO bar\r\n"[..],
        b"MSG a 1\r\n",
        b"MSG a 1 x\r\n",
        b"HMSG a 1 10 5\r\n",
        b"HMSG a 1 r 2 3 4\r\n",
        // Lengths that overflow the frame arithmetic.
        b"HMSG s 1 5 18446744073709551615\r\nx\r\n",
        b"MSG s 1 18446744073709551615\r\nx\r\n",
        b"HMSG s 1 18446744073709551615 18446744073709551615\r\nx\r\n",
    ] {
        let mut buf = BytesMut::from(bad);
        assert!(
            parse_op(&mut buf, MAX_SERVER_MESSAGE).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn a_message_over_the_servers_max_payload_is_refused_at_its_line() {
    let limit = message_limit(1000);
    assert!((1000..MAX_SERVER_MESSAGE).contains(&limit), "{limit}");
    // Within max_payload: a whole message is taken; half of one waits for the rest.
    let mut whole = BytesMut::from(&b"MSG s 1 5\r\nhello\r\n"[..]);
    assert!(matches!(
        parse_op(&mut whole, limit),
        Ok(Some(ServerOp::Msg { .. }))
    ));
    let mut half = BytesMut::from(&b"MSG s 1 900\r\nabc"[..]);
    assert!(matches!(parse_op(&mut half, limit), Ok(None)));
    // Over it, only the line has come: refused now, not buffered while 100 MB arrive.
    let over = format!("MSG s 1 {}\r\nabc", limit + 1);
    let mut buf = BytesMut::from(over.as_bytes());
    let refused = parse_op(&mut buf, limit).unwrap_err();
    assert!(refused.0.contains("max_payload"), "{refused}");
    let over_headers = format!("HMSG s 1 12 {}\r\nNATS/1.0\r\n\r\n", limit + 1);
    let mut buf = BytesMut::from(over_headers.as_bytes());
    assert!(parse_op(&mut buf, limit).is_err());
    // Before the server said its max_payload, the protocol's own bound.
    assert_eq!(message_limit(0), MAX_SERVER_MESSAGE);
}
