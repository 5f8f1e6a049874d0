//! Exponential backoff with jitter.

use std::time::Duration;

/// Exponential backoff with jitter: the delay after the `n`th failure is
/// `min(max, initial × multiplier^(n-1))`, less a random share of up to `jitter` of it,
/// so that messages that failed together do not retry together.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Backoff {
    /// Delay after the first failure. Default: 1 s.
    pub initial: Duration,
    /// Upper bound of the delay. Default: 5 min.
    pub max: Duration,
    /// Growth factor per failure. Default: 2.
    pub multiplier: f64,
    /// Share of the delay randomly taken off, from 0 (none) to 1. Default: 0.5.
    pub jitter: f64,
}

impl Backoff {
    /// The defaults: 1 s doubling to 5 min, half jitter.
    pub const fn new() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.5,
        }
    }

    /// Sets the first delay.
    #[must_use]
    pub const fn initial(mut self, delay: Duration) -> Self {
        self.initial = delay;
        self
    }

    /// Sets the largest delay.
    #[must_use]
    pub const fn max(mut self, delay: Duration) -> Self {
        self.max = delay;
        self
    }

    /// Sets the growth factor.
    #[must_use]
    pub const fn multiplier(mut self, factor: f64) -> Self {
        self.multiplier = factor;
        self
    }

    /// Sets the jitter share (clamped to 0..=1).
    #[must_use]
    pub const fn jitter(mut self, share: f64) -> Self {
        self.jitter = share.clamp(0.0, 1.0);
        self
    }

    /// The delay after the `failures`th failure (1 for the first).
    pub fn delay(&self, failures: u32) -> Duration {
        self.delay_with(failures, fastrand::f64())
    }

    /// The delay with a given random draw in `0.0..1.0` (for reproducible schedules).
    pub fn delay_with(&self, failures: u32, draw: f64) -> Duration {
        let exponent = i32::try_from(failures.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max.as_secs_f64());
        let jittered = capped * (1.0 - self.jitter * draw.clamp(0.0, 1.0));
        Duration::try_from_secs_f64(jittered).unwrap_or(self.max)
    }

    /// Checks the values.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a multiplier below 1
    /// or a maximum below the initial delay.
    pub fn validate(&self) -> crate::Result<()> {
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(crate::Error::InvalidOptions(
                "backoff multiplier must be >= 1".into(),
            ));
        }
        if self.max < self.initial {
            return Err(crate::Error::InvalidOptions(
                "backoff max must be >= initial".into(),
            ));
        }
        Ok(())
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let b = Backoff::new().jitter(0.0);
        assert_eq!(b.delay(1), Duration::from_secs(1));
        assert_eq!(b.delay(2), Duration::from_secs(2));
        assert_eq!(b.delay(5), Duration::from_secs(16));
        assert_eq!(b.delay(30), Duration::from_secs(300));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_within_its_share() {
        let b = Backoff::new().jitter(0.5);
        for failures in 1..10 {
            let full = b.delay_with(failures, 0.0);
            let d = b.delay(failures);
            assert!(d <= full && d >= full / 2, "{d:?} vs {full:?}");
        }
    }

    #[test]
    fn validation() {
        assert!(Backoff::new().multiplier(0.5).validate().is_err());
        assert!(Backoff::new().max(Duration::ZERO).validate().is_err());
        assert!(Backoff::new().validate().is_ok());
    }
}
