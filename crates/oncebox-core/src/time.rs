//! Conversions between [`SystemTime`] and the integer timestamps stores keep.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (negative before it), saturating at the `i64` range.
pub fn to_unix_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// The time `millis` milliseconds after the Unix epoch.
pub fn from_unix_millis(millis: i64) -> SystemTime {
    let magnitude = Duration::from_millis(millis.unsigned_abs());
    if millis >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// The time `age` ago, or the Unix epoch if that lies before it: a cutoff for "older
/// than `age`" that a configured retention of centuries cannot overflow.
pub fn ago(age: Duration) -> SystemTime {
    SystemTime::now()
        .checked_sub(age)
        .unwrap_or(UNIX_EPOCH)
        .max(UNIX_EPOCH)
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Offsets applied to a database's clock are clamped to ±100 years, far inside the
/// range of every store's interval arithmetic.
const MAX_OFFSET_MILLIS: i64 = 100 * 366 * 24 * 3600 * 1000;

/// A duration in milliseconds, clamped for arithmetic on a database's clock.
pub fn offset_millis(duration: Duration) -> i64 {
    duration_millis(duration).min(MAX_OFFSET_MILLIS)
}

/// How far `at` lies ahead of now, in milliseconds (0 if it has passed). Stores keep
/// time by the database's clock: the absolute times the engines hand them (a retry's
/// due time) become offsets from the caller's now, applied to the database's now.
pub fn millis_until(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::now())
        .map_or(0, offset_millis)
}

/// How far `at` lies behind now, in milliseconds (negative if it is in the future); see
/// [`millis_until`].
pub fn millis_since(at: SystemTime) -> i64 {
    match SystemTime::now().duration_since(at) {
        Ok(ago) => offset_millis(ago),
        Err(ahead) => -offset_millis(ahead.duration()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for ms in [0, 1, 1_700_000_000_123, -5] {
            assert_eq!(to_unix_millis(from_unix_millis(ms)), ms);
        }
    }

    #[test]
    fn offsets_from_now() {
        assert_eq!(millis_until(SystemTime::now() - Duration::from_secs(5)), 0);
        assert_eq!(ago(Duration::from_secs(u64::MAX)), UNIX_EPOCH);
        assert!(ago(Duration::from_secs(60)) < SystemTime::now());
        let ahead = millis_until(SystemTime::now() + Duration::from_secs(5));
        assert!((4_900..=5_000).contains(&ahead), "{ahead}");
        assert!(millis_since(SystemTime::now() + Duration::from_secs(5)) < 0);
        assert_eq!(offset_millis(Duration::MAX), MAX_OFFSET_MILLIS);
    }
}
