//! Times between Rust and the database.
//!
//! Every time the stores write or compare (leases, retry times, retention, dedup TTLs) is
//! the database's own clock (`statement_timestamp()`), so relays on several hosts agree on
//! when a lease ends whatever their clocks say. The core hands the stores a few absolute
//! [`SystemTime`]s (a retry's due time, a purge's horizon); they become offsets from the
//! caller's *now*, applied to the database's now. Only `created_at`, the producer's time,
//! is stored as given.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Offsets are clamped to ±100 years, far inside PostgreSQL's interval range.
const MAX_OFFSET_MS: i64 = 100 * 366 * 24 * 3600 * 1000;

/// `$n` microseconds since the Unix epoch as a `timestamptz` (exact: no float rounding).
pub(crate) fn micros_param(n: usize) -> String {
    format!("(timestamptz 'epoch' + ${n}::bigint * interval '1 microsecond')")
}

/// A `timestamptz` expression as microseconds since the Unix epoch (`bigint`).
pub(crate) fn micros_of(expr: &str) -> String {
    format!("(extract(epoch FROM {expr}) * 1000000)::bigint")
}

/// `$n` milliseconds as an interval.
pub(crate) fn millis_param(n: usize) -> String {
    format!("(${n}::bigint * interval '1 millisecond')")
}

/// Microseconds since the Unix epoch (negative before it), saturating.
pub(crate) fn to_micros(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_micros()).map_or(i64::MIN, |us| -us),
    }
}

/// The time `micros` microseconds after the Unix epoch.
pub(crate) fn from_micros(micros: i64) -> SystemTime {
    let magnitude = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// A duration in milliseconds, clamped for interval arithmetic.
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis())
        .unwrap_or(i64::MAX)
        .min(MAX_OFFSET_MS)
}

/// How far `at` lies ahead of now, in milliseconds (0 if it has passed).
pub(crate) fn ms_until(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::now()).map_or(0, duration_ms)
}

/// How far `at` lies behind now, in milliseconds (negative if it is in the future).
pub(crate) fn ms_since(at: SystemTime) -> i64 {
    match SystemTime::now().duration_since(at) {
        Ok(ago) => duration_ms(ago),
        Err(ahead) => -duration_ms(ahead.duration()),
    }
}

/// A non-negative count of microseconds as a duration.
pub(crate) fn micros_duration(micros: i64) -> Duration {
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_offsets() {
        for us in [0, 1, 1_700_000_000_123_456, -5] {
            assert_eq!(to_micros(from_micros(us)), us);
        }
        assert_eq!(ms_until(SystemTime::now() - Duration::from_secs(5)), 0);
        let ahead = ms_until(SystemTime::now() + Duration::from_secs(5));
        assert!((4_900..=5_000).contains(&ahead));
        assert!(ms_since(SystemTime::now() + Duration::from_secs(5)) < 0);
        assert_eq!(duration_ms(Duration::MAX), MAX_OFFSET_MS);
        assert_eq!(micros_duration(-3), Duration::ZERO);
    }
}
