//! [`Lsn`]: a PostgreSQL WAL position and its text form, the one implementation the decoder,
//! the relay and the consumer library share.

use std::fmt;
use std::str::FromStr;

/// A WAL position (PostgreSQL's `pg_lsn`).
///
/// Displays as PostgreSQL does: the upper 32 bits in hex, `/`, the lower 32 bits in hex,
/// uppercase and unpadded (e.g. `0/16B3748`); that is the form of the `Outbox-Commit-Lsn`
/// header. [`FromStr`] parses that form (either case accepted).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid / zero position `0/0`.
    pub const ZERO: Lsn = Lsn(0);

    /// The position as a plain integer.
    #[must_use]
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Self {
        Lsn(v)
    }
}

impl From<Lsn> for u64 {
    fn from(l: Lsn) -> Self {
        l.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// Error returned when parsing an [`Lsn`] from text fails.
///
/// `Error` is implemented by hand: this crate has no dependencies, not even `thiserror`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseLsnError {
    /// The rejected input.
    pub input: String,
}

impl fmt::Display for ParseLsnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid LSN {:?}: expected two hex numbers of at most 8 digits separated by '/'",
            self.input
        )
    }
}

impl std::error::Error for ParseLsnError {}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError {
            input: s.to_owned(),
        };
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let half = |p: &str| {
            // from_str_radix accepts a leading '+', PostgreSQL does not.
            if p.is_empty() || p.len() > 8 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            u32::from_str_radix(p, 16).map_err(|_| err())
        };
        Ok(Lsn((u64::from(half(hi)?) << 32) | u64::from(half(lo)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_postgres() {
        assert_eq!(Lsn(0x16B3748).to_string(), "0/16B3748");
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
        assert_eq!(Lsn(0x1_0000_00AB).to_string(), "1/AB");
        assert_eq!(Lsn(0xA_0000_0001).to_string(), "A/1");
        assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
    }

    #[test]
    fn parse_roundtrip_and_errors() {
        for v in [
            0,
            1,
            0x16B3748,
            0xA_0000_0001,
            0xDEAD_BEEF_0000_0001,
            u64::MAX,
        ] {
            assert_eq!(Lsn(v).to_string().parse::<Lsn>(), Ok(Lsn(v)));
        }
        assert_eq!("0/16b3748".parse::<Lsn>(), Ok(Lsn(0x16B3748)));
        assert_eq!("00000000/00000001".parse::<Lsn>(), Ok(Lsn(1)));
        for bad in [
            "",
            "/",
            "0/",
            "/0",
            "0",
            "1",
            "0/0/0",
            "+1/0",
            "0/-1",
            "g/0",
            "1/123456789",
            " 0/1",
            "0/1 ",
            "nonsense",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} should not parse");
        }
        let e = "x".parse::<Lsn>().unwrap_err();
        assert_eq!(e.input, "x");
        assert!(e.to_string().contains("\"x\""), "{e}");
        assert_eq!(Lsn(7).as_u64(), 7);
        assert_eq!(u64::from(Lsn::from(9)), 9);
        assert!(Lsn(1) < Lsn(2));
    }
}
