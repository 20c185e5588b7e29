//! Property tests of what the lean connection reads from the server: [`proto::parse_op`] (every
//! operation, `MSG`/`HMSG` frames included) against arbitrary bytes and against valid frames
//! with one defect each (PubAcks: `pub_ack_props.rs`).
//!
//! Two independent readings are compared: the parser, and a reference written from the
//! protocol's text (<https://docs.nats.io/reference/reference-protocols/nats-protocol>) with
//! plain slices. The properties: no panic; every call either consumes bytes or stops, so work is
//! bounded by the input; a malformed frame is an error, never an operation; a valid frame comes
//! out the same however the bytes arrive. The generators, the reference and the defects make
//! this file longer than most: they only make sense together.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use crate::proto::{self, MAX_SERVER_LINE, MAX_SERVER_MESSAGE, ServerInfoText, ServerOp};

/// How reading a whole input ended.
#[derive(Debug, PartialEq)]
enum End {
    /// Waiting for more: these bytes are held.
    Incomplete(Vec<u8>),
    Malformed,
}

/// Every operation `parse_op` takes off `input`, and how it stopped.
fn parse_all(input: &[u8]) -> (Vec<ServerOp>, End) {
    parse_chunks(&[input])
}

/// The same, with the input arriving in `chunks`.
fn parse_chunks(chunks: &[&[u8]]) -> (Vec<ServerOp>, End) {
    let mut buf = BytesMut::new();
    let mut ops = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match proto::parse_op(&mut buf, MAX_SERVER_MESSAGE) {
                Ok(Some(op)) => {
                    // Progress on every operation: the loop ends within the input's length.
                    assert!(buf.len() < before, "{op:?} consumed nothing");
                    ops.push(op);
                }
                Ok(None) => {
                    assert_eq!(buf.len(), before, "an incomplete read consumed bytes");
                    break;
                }
                Err(_) => return (ops, End::Malformed),
            }
        }
    }
    (ops, End::Incomplete(buf.to_vec()))
}

/// One step of the reference reading.
enum Step {
    Incomplete,
    Malformed,
    Op(ServerOp, usize),
}

fn reference_step(buf: &[u8]) -> Step {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return if buf.len() > MAX_SERVER_LINE {
            Step::Malformed
        } else {
            Step::Incomplete
        };
    };
    let line = &buf[..end];
    let sep = |b: &u8| *b == b' ' || *b == b'\t';
    let (op, rest) = match line.iter().position(sep) {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => (line, &[][..]),
    };
    let fields: Vec<&[u8]> = rest.split(sep).filter(|f| !f.is_empty()).collect();
    let text = || {
        String::from_utf8_lossy(rest)
            .trim_matches([' ', '\t'])
            .to_owned()
    };
    let bare = |op| {
        if fields.is_empty() {
            Step::Op(op, end + 2)
        } else {
            Step::Malformed
        }
    };
    let hmsg = match op.to_ascii_uppercase().as_slice() {
        b"PING" => return bare(ServerOp::Ping),
        b"PONG" => return bare(ServerOp::Pong),
        b"+OK" => return bare(ServerOp::Ok),
        b"-ERR" => {
            let text = text();
            return Step::Op(
                ServerOp::Err(text.trim().trim_matches('\'').to_owned()),
                end + 2,
            );
        }
        b"INFO" => return Step::Op(ServerOp::Info(Box::new(ServerInfoText(text()))), end + 2),
        b"MSG" => false,
        b"HMSG" => true,
        _ => return Step::Malformed,
    };
    // MSG <subject> <sid> [reply-to] <#bytes>; HMSG ... <#header bytes> <#total bytes>.
    let lengths = match (hmsg, fields.len()) {
        (false, 3 | 4) => 1,
        (true, 4 | 5) => 2,
        _ => return Step::Malformed,
    };
    let length = |f: &[u8]| -> Option<usize> {
        let digits = std::str::from_utf8(f)
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))?;
        // Any number of digits: a u128 holds more than any length that counts.
        let n = digits.trim_start_matches('0').parse::<u128>().unwrap_or(
            if digits.trim_start_matches('0').is_empty() {
                0
            } else {
                u128::MAX
            },
        );
        usize::try_from(n).ok().filter(|n| *n <= MAX_SERVER_MESSAGE)
    };
    let lens: Option<Vec<usize>> = fields[fields.len() - lengths..]
        .iter()
        .map(|f| length(f))
        .collect();
    let Some(lens) = lens else {
        return Step::Malformed;
    };
    let (header_len, total_len) = if hmsg {
        (lens[0], lens[1])
    } else {
        (0, lens[0])
    };
    if header_len > total_len {
        return Step::Malformed;
    }
    let body = end + 2;
    if buf.len() < body + total_len + 2 {
        return Step::Incomplete;
    }
    if &buf[body + total_len..body + total_len + 2] != b"\r\n" {
        return Step::Malformed;
    }
    let headers = &buf[body..body + header_len];
    if hmsg
        && !(headers.len() >= 12
            && (headers.starts_with(b"NATS/1.0\r\n") || headers.starts_with(b"NATS/1.0 "))
            && headers.ends_with(b"\r\n\r\n"))
    {
        return Step::Malformed;
    }
    Step::Op(
        ServerOp::Msg {
            subject: Bytes::copy_from_slice(fields[0]),
            headers: hmsg.then(|| Bytes::copy_from_slice(headers)),
            payload: Bytes::copy_from_slice(&buf[body + header_len..body + total_len]),
        },
        body + total_len + 2,
    )
}

fn reference_all(input: &[u8]) -> (Vec<ServerOp>, End) {
    let mut at = 0;
    let mut ops = Vec::new();
    loop {
        match reference_step(&input[at..]) {
            Step::Op(op, len) => {
                ops.push(op);
                at += len;
            }
            Step::Incomplete => return (ops, End::Incomplete(input[at..].to_vec())),
            Step::Malformed => return (ops, End::Malformed),
        }
    }
}

/// The parser agrees with the reference on `input`, whole and cut once at every byte.
fn check_against_reference(input: &[u8]) -> Result<(), TestCaseError> {
    let whole = parse_all(input);
    prop_assert_eq!(&whole, &reference_all(input));
    for cut in 0..=input.len() {
        let (a, b) = input.split_at(cut);
        prop_assert_eq!(&parse_chunks(&[a, b]), &whole, "cut at {}", cut);
    }
    Ok(())
}

// Generators of valid operations, each with what it parses into.

fn token() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_$>*.-]{1,24}"
}

/// One or more spaces or tabs.
fn sep() -> impl Strategy<Value = String> {
    "[ \t]{1,3}"
}

/// A valid header block: version line (maybe a status), lines, blank line.
fn header_block() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            Just(String::new()),
            Just(" 503".to_owned()),
            Just(" 408 Request Timeout".to_owned()),
            Just(" 100 FlowControl Request".to_owned()),
        ],
        proptest::collection::vec(("[A-Za-z-]{1,12}", "[ -~]{0,20}"), 0..4),
    )
        .prop_map(|(status, lines)| {
            let mut block = format!("NATS/1.0{status}\r\n");
            for (name, value) in lines {
                block.push_str(&format!("{name}: {value}\r\n"));
            }
            block.push_str("\r\n");
            block.into_bytes()
        })
}

/// The parts of a `MSG`/`HMSG` frame, so that one part at a time can be broken.
#[derive(Debug, Clone)]
struct MsgFrame {
    op: String,
    seps: Vec<String>,
    subject: String,
    sid: String,
    reply: Option<String>,
    headers: Option<Vec<u8>>,
    payload: Vec<u8>,
}

impl MsgFrame {
    fn header_len(&self) -> usize {
        self.headers.as_ref().map_or(0, Vec::len)
    }

    fn total_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// The control line's fields after the operation.
    fn fields(&self) -> Vec<String> {
        let mut fields = vec![self.subject.clone(), self.sid.clone()];
        fields.extend(self.reply.clone());
        if self.headers.is_some() {
            fields.push(self.header_len().to_string());
        }
        fields.push(self.total_len().to_string());
        fields
    }

    fn render(&self, fields: &[String], body: &[u8], trailer: &[u8]) -> Vec<u8> {
        let mut out = self.op.clone().into_bytes();
        for (i, field) in fields.iter().enumerate() {
            out.extend_from_slice(self.seps[i % self.seps.len()].as_bytes());
            out.extend_from_slice(field.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        out.extend_from_slice(trailer);
        out
    }

    fn body(&self) -> Vec<u8> {
        let mut body = self.headers.clone().unwrap_or_default();
        body.extend_from_slice(&self.payload);
        body
    }

    fn bytes(&self) -> Vec<u8> {
        self.render(&self.fields(), &self.body(), b"\r\n")
    }

    fn op(&self) -> ServerOp {
        ServerOp::Msg {
            subject: Bytes::copy_from_slice(self.subject.as_bytes()),
            headers: self.headers.clone().map(Bytes::from),
            payload: Bytes::copy_from_slice(&self.payload),
        }
    }
}

/// A valid frame; `payload` makes its payload (some properties need one without `\r`).
fn msg_frame(payload: BoxedStrategy<Vec<u8>>) -> impl Strategy<Value = MsgFrame> {
    (
        prop_oneof![Just("MSG"), Just("msg"), Just("HMSG"), Just("hmsg")],
        proptest::collection::vec(sep(), 1..4),
        token(),
        "[A-Za-z0-9]{1,8}",
        proptest::option::of(token()),
        header_block(),
        payload,
    )
        .prop_map(
            |(op, seps, subject, sid, reply, headers, payload)| MsgFrame {
                headers: op.eq_ignore_ascii_case("HMSG").then_some(headers),
                op: op.to_owned(),
                seps,
                subject,
                sid,
                reply,
                payload,
            },
        )
}

fn any_payload() -> BoxedStrategy<Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..64).boxed()
}

fn payload_without_cr() -> BoxedStrategy<Vec<u8>> {
    proptest::collection::vec(any::<u8>().prop_filter("no CR", |b| *b != b'\r'), 1..64).boxed()
}

/// Any valid operation, as bytes and as what it parses into.
fn valid_op() -> impl Strategy<Value = (Vec<u8>, ServerOp)> {
    prop_oneof![
        prop_oneof![
            Just("PING"),
            Just("ping"),
            Just("PONG"),
            Just("+OK"),
            Just("+ok")
        ]
        .prop_map(|op| {
            let parsed = match op.to_ascii_uppercase().as_str() {
                "PING" => ServerOp::Ping,
                "PONG" => ServerOp::Pong,
                _ => ServerOp::Ok,
            };
            (format!("{op}\r\n").into_bytes(), parsed)
        }),
        "[ -&(-~]{0,40}".prop_map(|text| {
            // Spaces inside the quotes are the server's text.
            let parsed = ServerOp::Err(text.clone());
            (format!("-ERR '{text}'\r\n").into_bytes(), parsed)
        }),
        ("[0-9.]{1,8}", any::<u32>()).prop_map(|(version, max)| {
            let json = format!(r#"{{"version":"{version}","max_payload":{max},"headers":true}}"#);
            let parsed = ServerOp::Info(Box::new(ServerInfoText(json.clone())));
            (format!("INFO {json}\r\n").into_bytes(), parsed)
        }),
        msg_frame(any_payload()).prop_map(|frame| (frame.bytes(), frame.op())),
    ]
}

fn valid_ops() -> impl Strategy<Value = (Vec<u8>, Vec<ServerOp>)> {
    proptest::collection::vec(valid_op(), 0..8).prop_map(|ops| {
        let mut bytes = Vec::new();
        let mut parsed = Vec::new();
        for (b, op) in ops {
            bytes.extend(b);
            parsed.push(op);
        }
        (bytes, parsed)
    })
}

fn bytes_of(items: &[&'static [u8]]) -> impl Strategy<Value = &'static [u8]> + use<> {
    proptest::sample::select(items.to_vec())
}

/// Bytes that are mostly protocol tokens: near-valid frames, where raw bytes rarely get.
fn protocol_soup() -> impl Strategy<Value = Vec<u8>> {
    let piece = bytes_of(&[
        b"MSG ",
        b"HMSG ",
        b"PING",
        b"+OK",
        b"-ERR 'x'",
        b"INFO {}",
        b"\r\n",
        b"\r",
        b"\n",
        b" ",
        b"\t",
        b"s",
        b"1",
        b"0",
        b"2",
        b"12",
        b"+5",
        b"18446744073709551615",
        b"NATS/1.0",
        b"NATS/1.0\r\n\r\n",
    ]);
    proptest::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

/// A defect in one part of a frame whose outcome is certain: an error once the bytes after it
/// (if any) have arrived.
#[derive(Debug, Clone)]
enum Defect {
    /// A length field replaced by something that is not a decimal number.
    NotDigits {
        header: bool,
        text: String,
    },
    /// A length beyond anything nats-server sends (up to and past `usize`/`u64`).
    Huge {
        header: bool,
        text: String,
    },
    /// The total length `k` short of the bytes (the payload has no `\r`).
    Short(usize),
    /// The header length `k` short (so the header block is cut and the payload starts early).
    HeaderShort(usize),
    /// The header length over the total.
    HeaderOverTotal(usize),
    /// The header block's last `k` bytes gone, both lengths saying so.
    TruncatedHeaders(usize),
    /// A header block of another protocol or version.
    BadVersion(&'static str),
    /// The CRLF after the payload missing or replaced.
    Trailer(&'static [u8]),
    /// Too few or too many fields on the control line.
    TooFewFields,
    TooManyFields,
}

fn defect() -> impl Strategy<Value = Defect> {
    let not_digits = prop_oneof![
        Just("+5"),
        Just("-1"),
        Just("5a"),
        Just("0x10"),
        Just("1_0"),
        Just("1e3"),
        Just("5.0"),
        Just("\u{0663}"),
        Just("5\u{000c}"),
        Just("5\r"),
    ];
    let huge = prop_oneof![
        Just((MAX_SERVER_MESSAGE as u128 + 1).to_string()),
        Just(u32::MAX.to_string()),
        Just((usize::MAX - 3).to_string()),
        Just(usize::MAX.to_string()),
        Just(u64::MAX.to_string()),
        Just((u128::from(u64::MAX) + 1).to_string()),
        Just("9".repeat(40)),
    ];
    prop_oneof![
        (any::<bool>(), not_digits).prop_map(|(header, t)| Defect::NotDigits {
            header,
            text: t.to_owned()
        }),
        (any::<bool>(), huge).prop_map(|(header, text)| Defect::Huge { header, text }),
        (1usize..80).prop_map(Defect::Short),
        (1usize..80).prop_map(Defect::HeaderShort),
        (1usize..80).prop_map(Defect::HeaderOverTotal),
        (1usize..80).prop_map(Defect::TruncatedHeaders),
        prop_oneof![
            Just("NATS/2.0\r\n\r\n"),
            Just("nats/1.0\r\n\r\n"),
            Just("HTTP/1.1 200\r\n\r\n"),
            Just("NATS/1.01\r\n\r\n"),
            Just("\r\n\r\n"),
        ]
        .prop_map(Defect::BadVersion),
        bytes_of(&[b"", b"\n", b"\r", b"\n\r", b"  ", b"xx"]).prop_map(Defect::Trailer),
        Just(Defect::TooFewFields),
        Just(Defect::TooManyFields),
    ]
}

/// `frame` with `defect`, followed by `PING\r\n`; `None` where the defect does not apply to
/// the frame (a header defect in a `MSG`, a cut longer than the part).
fn broken(frame: &MsgFrame, defect: &Defect) -> Option<Vec<u8>> {
    let hmsg = frame.headers.is_some();
    let mut fields = frame.fields();
    let last = fields.len() - 1;
    let mut body = frame.body();
    let mut trailer: &[u8] = b"\r\n";
    let at = |header: bool| if header && hmsg { last - 1 } else { last };
    match defect {
        Defect::NotDigits { header, text } | Defect::Huge { header, text } => {
            fields[at(*header)] = text.clone();
        }
        Defect::Short(k) => {
            fields[last] = frame.total_len().checked_sub(*k)?.to_string();
        }
        Defect::HeaderShort(k) => {
            fields[last - 1] = frame.header_len().checked_sub(*k)?.to_string();
            hmsg.then_some(())?;
        }
        Defect::HeaderOverTotal(k) => {
            hmsg.then_some(())?;
            fields[last - 1] = (frame.total_len() + k).to_string();
        }
        Defect::TruncatedHeaders(k) => {
            let headers = frame.headers.as_ref()?;
            let kept = headers.len().checked_sub(*k)?;
            fields[last - 1] = kept.to_string();
            fields[last] = (kept + frame.payload.len()).to_string();
            body = [&headers[..kept], &frame.payload[..]].concat();
        }
        Defect::BadVersion(block) => {
            frame.headers.as_ref()?;
            fields[last - 1] = block.len().to_string();
            fields[last] = (block.len() + frame.payload.len()).to_string();
            body = [block.as_bytes(), &frame.payload[..]].concat();
        }
        Defect::Trailer(bytes) => trailer = bytes,
        Defect::TooFewFields => fields.truncate(if hmsg { 2 } else { 1 }),
        Defect::TooManyFields => {
            while fields.len() <= if hmsg { 5 } else { 4 } {
                fields.insert(2, "extra".into());
            }
        }
    }
    let mut bytes = frame.render(&fields, &body, trailer);
    bytes.extend_from_slice(b"PING\r\n");
    Some(bytes)
}

pub(super) fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Failures become unit tests in proto.rs and pending.rs, not files in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// Arbitrary bytes: no panic, progress on every call, the reference's reading.
    #[test]
    fn arbitrary_bytes_parse_as_the_reference_reads_them(
        input in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        check_against_reference(&input)?;
    }

    /// Near-valid bytes (protocol tokens in any order), the same.
    #[test]
    fn protocol_token_soup_parses_as_the_reference_reads_it(input in protocol_soup()) {
        check_against_reference(&input)?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Valid operations parse into exactly what was written, consuming everything, whether
    /// the bytes come at once, cut at any one byte, or one byte at a time.
    #[test]
    fn valid_operations_parse_the_same_however_they_arrive((input, ops) in valid_ops()) {
        let whole = parse_all(&input);
        prop_assert_eq!(&whole, &(ops, End::Incomplete(Vec::new())));
        prop_assert_eq!(&reference_all(&input), &whole);
        for cut in 0..=input.len() {
            let (a, b) = input.split_at(cut);
            prop_assert_eq!(&parse_chunks(&[a, b]), &whole, "cut at {}", cut);
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        prop_assert_eq!(&parse_chunks(&bytes), &whole);
    }

    /// A frame with one defect, after valid operations: those come out, then an error, never
    /// the broken frame (nor anything after it); the same cut at any byte.
    #[test]
    fn a_broken_frame_is_an_error(
        (before, ops) in valid_ops(),
        frame in msg_frame(payload_without_cr()),
        defect in defect(),
    ) {
        let Some(bad) = broken(&frame, &defect) else {
            return Ok(());
        };
        let input = [before, bad].concat();
        let whole = parse_all(&input);
        prop_assert_eq!(&whole, &(ops, End::Malformed), "{}", String::from_utf8_lossy(&input));
        prop_assert_eq!(&reference_all(&input), &whole);
        for cut in 0..=input.len() {
            let (a, b) = input.split_at(cut);
            prop_assert_eq!(&parse_chunks(&[a, b]), &whole, "cut at {}", cut);
        }
    }

    /// A length longer than the bytes is a frame still arriving (nothing taken); the bytes
    /// that then arrive without a CRLF where the length ends make it an error.
    #[test]
    fn a_long_length_waits_then_fails(frame in msg_frame(any_payload()), k in 1usize..40) {
        let mut fields = frame.fields();
        let last = fields.len() - 1;
        fields[last] = (frame.total_len() + k).to_string();
        let input = frame.render(&fields, &frame.body(), b"\r\n");
        prop_assert_eq!(parse_all(&input), (Vec::new(), End::Incomplete(input.clone())));
        let more = [input, vec![b'x'; k + 2]].concat();
        prop_assert_eq!(parse_all(&more), (Vec::new(), End::Malformed));
    }

    /// A frame whose control line lost its CRLF: never read as the frame it was.
    #[test]
    fn a_control_line_without_crlf_is_not_the_frame(
        frame in msg_frame(any_payload()),
        instead in bytes_of(&[b"", b"\n", b"\r", b" "]),
    ) {
        let good = frame.bytes();
        let line_end = good.windows(2).position(|w| w == b"\r\n").expect("a control line");
        let input = [&good[..line_end], instead, &good[line_end + 2..], b"PING\r\n"].concat();
        let (ops, _) = parse_all(&input);
        prop_assert!(!ops.contains(&frame.op()), "{:?}", ops);
        check_against_reference(&input)?;
    }

    /// `PING`, `PONG` and `+OK` take no arguments; an unknown operation is an error.
    #[test]
    fn extra_arguments_and_unknown_operations_are_errors(
        op in prop_oneof![Just("PING"), Just("PONG"), Just("+OK"), Just("ping")],
        args in "[!-~]{1,10}",
        unknown in "[A-Za-z+-]{0,8}",
    ) {
        prop_assert_eq!(parse_all(format!("{op} {args}\r\n").as_bytes()), (Vec::new(), End::Malformed));
        let known = ["PING", "PONG", "+OK", "-ERR", "INFO", "MSG", "HMSG"];
        prop_assume!(!known.iter().any(|k| k.eq_ignore_ascii_case(&unknown)));
        prop_assert_eq!(parse_all(format!("{unknown} x\r\n").as_bytes()), (Vec::new(), End::Malformed));
    }

    /// An `INFO` whose JSON is broken parses as an operation, and reading its JSON fails.
    #[test]
    fn a_broken_info_is_an_error_when_read(
        version in "[0-9.]{1,8}",
        cut in 1usize..40,
        junk in prop_oneof![Just(""), Just("}"), Just(","), Just("x")],
    ) {
        let json = format!(r#"{{"version":"{version}","headers":true}}"#);
        let broken = format!("{}{junk}", &json[..json.len().saturating_sub(cut).max(1)]);
        let (ops, end) = parse_all(format!("INFO {broken}\r\n").as_bytes());
        prop_assert_eq!(end, End::Incomplete(Vec::new()));
        let [ServerOp::Info(text)] = &ops[..] else {
            return Err(TestCaseError::fail(format!("{ops:?}")));
        };
        prop_assert_eq!(text.parse().is_ok(), serde_json::from_str::<serde_json::Value>(&broken).is_ok());
    }
}

/// A control line past the limit, still without its CRLF, is garbage, not a line to wait for.
#[test]
fn an_endless_control_line_is_an_error() {
    let mut input = b"INFO ".to_vec();
    input.resize(MAX_SERVER_LINE + 1, b'x');
    assert_eq!(parse_all(&input), (Vec::new(), End::Malformed));
    input.truncate(MAX_SERVER_LINE);
    assert!(matches!(parse_all(&input), (ops, End::Incomplete(_)) if ops.is_empty()));
}
