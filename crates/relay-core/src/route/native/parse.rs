//! The text forms of the values native headers come from, as the replication session renders
//! them (`DateStyle=ISO`, `TimeZone=UTC`, `IntervalStyle=postgres`).

const MICROS_PER_SECOND: i64 = 1_000_000;
const SECONDS_PER_DAY: i64 = 86_400;
/// PostgreSQL's own lengths for `EXTRACT(EPOCH FROM interval)`: a month is 30 days, a year
/// 365.25 days.
const SECONDS_PER_MONTH: i64 = 30 * SECONDS_PER_DAY;
const SECONDS_PER_YEAR: i64 = 31_557_600;

/// An `interval` in `IntervalStyle=postgres` form (`1 year 2 mons 3 days 04:05:06.5`,
/// `-1 days +02:00:00`, `00:00:30`) as microseconds, months and years counted as PostgreSQL's
/// `EXTRACT(EPOCH FROM …)` counts them.
pub(crate) fn interval_micros(text: &str) -> Result<i64, String> {
    let bad = |why: &str| format!("`{text}` is not an interval in IntervalStyle postgres ({why})");
    let mut total: i128 = 0;
    let mut tokens = text.split_whitespace().peekable();
    if tokens.peek().is_none() {
        return Err(bad("empty"));
    }
    while let Some(token) = tokens.next() {
        if token.contains(':') {
            total += time_micros(token).ok_or_else(|| bad("bad time part"))?;
            continue;
        }
        let count: i128 = token.parse().map_err(|_| bad("a number without a unit"))?;
        let unit = tokens
            .next()
            .ok_or_else(|| bad("a number without a unit"))?;
        let seconds = match unit {
            "year" | "years" => SECONDS_PER_YEAR,
            "mon" | "mons" => SECONDS_PER_MONTH,
            "day" | "days" => SECONDS_PER_DAY,
            _ => return Err(bad("unknown unit")),
        };
        total += count * i128::from(seconds) * i128::from(MICROS_PER_SECOND);
    }
    i64::try_from(total).map_err(|_| bad("out of range"))
}

/// `[+-]H+:MM:SS[.ffffff]` as microseconds.
fn time_micros(token: &str) -> Option<i128> {
    let (negative, rest) = match token.as_bytes().first()? {
        b'-' => (true, &token[1..]),
        b'+' => (false, &token[1..]),
        _ => (false, token),
    };
    let mut parts = rest.splitn(3, ':');
    let hours: i128 = parts.next()?.parse().ok()?;
    let minutes: i128 = parts.next()?.parse().ok()?;
    let seconds = parts.next().unwrap_or("0");
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
    let whole: i128 = whole.parse().ok()?;
    if minutes > 59
        || whole > 59
        || fraction.len() > 6
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let micros: i128 = format!("{fraction:0<6}").parse().ok()?;
    let total = ((hours * 60 + minutes) * 60 + whole) * i128::from(MICROS_PER_SECOND) + micros;
    Some(if negative { -total } else { total })
}

/// Whole seconds of a TTL of `micros`, a part second rounded up (JetStream's TTLs are whole
/// seconds; rounding down could make a sub-second TTL 0, which means none).
pub(crate) fn ttl_seconds(micros: i64) -> i64 {
    micros.div_euclid(MICROS_PER_SECOND) + i64::from(micros.rem_euclid(MICROS_PER_SECOND) != 0)
}

/// A `timestamptz` as the session renders it (`2026-11-30 20:15:00.123456+00`) in RFC 3339
/// UTC (`2026-11-30T20:15:00.123456Z`). Infinite, BC and five-digit years are refused.
pub(crate) fn timestamptz_rfc3339(text: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "`{text}` is not a timestamp with time zone between 1970 and 9999 in UTC (DateStyle ISO)"
        )
    };
    let local = text.strip_suffix("+00").ok_or_else(bad)?;
    let (date, time) = local.split_once(' ').ok_or_else(bad)?;
    let rfc3339 = format!("{date}T{time}Z");
    humantime::parse_rfc3339(&rfc3339).map_err(|_| bad())?;
    Ok(rfc3339)
}
