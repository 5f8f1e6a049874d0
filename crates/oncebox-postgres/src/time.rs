//! Times between Rust and the database.
//!
//! Every time the stores write or compare (leases, retry times, retention, dedup TTLs) is
//! the database's own clock (`statement_timestamp()`), so relays on several hosts agree on
//! when a lease ends whatever their clocks say. The core hands the stores a few absolute
//! [`SystemTime`]s (a retry's due time, a purge's horizon); they become offsets from the
//! caller's *now*, applied to the database's now. Only `created_at`, the producer's time,
//! is stored as given.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

pub(crate) use oncebox_core::time::{
    millis_since as ms_since, millis_until as ms_until, offset_millis as duration_ms,
};

/// A non-negative count of microseconds as a duration.
pub(crate) fn micros_duration(micros: i64) -> Duration {
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for us in [0, 1, 1_700_000_000_123_456, -5] {
            assert_eq!(to_micros(from_micros(us)), us);
        }
        assert_eq!(micros_duration(-3), Duration::ZERO);
    }
}
