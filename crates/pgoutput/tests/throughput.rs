//! Rough decode throughput check (ignored by default; run with
//! `cargo test -p pgoutput --release --test throughput -- --ignored --nocapture`).

use std::time::Instant;

use bytes::Bytes;
use pgoutput::{LogicalMessage, decode};

#[test]
#[ignore = "timing; run in release"]
fn decode_insert_throughput() {
    // A typical outbox row: bigint id, topic, ~200-byte JSON payload, enum, NULL.
    let mut msg = vec![b'I', 0, 0, 0x40, 5, b'N', 0, 5];
    for v in [&b"123456"[..], b"orders.created", &[b'x'; 200], b"new"] {
        msg.push(b't');
        msg.extend_from_slice(&u32::try_from(v.len()).expect("small").to_be_bytes());
        msg.extend_from_slice(v);
    }
    msg.push(b'n');
    let buf = Bytes::from(msg);
    let n = 2_000_000u32;
    let start = Instant::now();
    let mut cols = 0usize;
    for _ in 0..n {
        if let Ok(LogicalMessage::Insert(i)) = decode(std::hint::black_box(&buf)) {
            cols += i.new.len();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(cols, 5 * n as usize);
    println!("{:.0} rows/s", f64::from(n) / secs);
}
