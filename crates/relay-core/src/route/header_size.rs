//! The size of NATS header lines and JetStream's bound on them: one home for the limits check
//! and for reading a header object, which stops at the bound instead of reading a huge object
//! whole.

/// The longest header block JetStream stores (`math.MaxUint16`).
pub(super) const JETSTREAM_MAX_HEADER_BYTES: usize = 65_535;

/// The bytes one header line `<name>: <value>\r\n` takes.
pub(super) fn line_len(name: &str, value: &str) -> usize {
    name.len() + 2 + value.len() + 2
}
