//! What the in-process broker does wrong on purpose, and the dice that decide it.

use std::time::Duration;

/// Faults the [`MemoryBroker`](super::MemoryBroker) injects, each a probability per
/// delivery between `0.0` (never) and `1.0` (always).
///
/// None of them loses a message: a dropped delivery counts as in flight and comes back
/// after the ack timeout, as it would from a real broker whose consumer never saw it.
///
/// ```
/// use std::time::Duration;
/// use oncebox_core::memory::{Faults, MemoryBroker};
///
/// let broker = MemoryBroker::new();
/// broker.set_seed(42);
/// broker.set_faults(Faults { drop: 0.01, duplicate: 0.05, delay: 0.05, max_delay: Duration::from_millis(50) });
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// The delivery is lost on its way to the subscriber. The broker counts it as
    /// delivered and in flight, so the message is redelivered after the ack timeout.
    pub drop: f64,
    /// The message is delivered twice: a second copy, with its own settlement, goes to
    /// the next subscriber of the group that asks.
    pub duplicate: f64,
    /// The delivery is held back for a random time up to [`Faults::max_delay`], which may
    /// let later messages overtake it. A delivery is held back at most once.
    pub delay: f64,
    /// The longest a delayed delivery is held back.
    pub max_delay: Duration,
}

impl Faults {
    /// No faults: the broker delivers every message once, in order, until settled.
    pub const fn none() -> Self {
        Self {
            drop: 0.0,
            duplicate: 0.0,
            delay: 0.0,
            max_delay: Duration::ZERO,
        }
    }

    fn is_none(&self) -> bool {
        !(self.drop > 0.0 || self.duplicate > 0.0 || self.delay > 0.0)
    }
}

impl Default for Faults {
    /// [`Faults::none`].
    fn default() -> Self {
        Self::none()
    }
}

/// What happens to one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Handed to the subscriber, and a second copy too if `duplicate`.
    Deliver { duplicate: bool },
    /// Lost on the way; the broker believes it delivered it.
    Drop,
    /// Held back for this long before it is tried again.
    HoldBack(Duration),
}

/// The configured faults and a seedable random source.
pub(super) struct Dice {
    faults: Faults,
    rng: fastrand::Rng,
}

impl Dice {
    pub(super) fn new() -> Self {
        Self {
            faults: Faults::none(),
            rng: fastrand::Rng::new(),
        }
    }

    pub(super) fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    pub(super) fn seed(&mut self, seed: u64) {
        self.rng.seed(seed);
    }

    /// Decides the fate of one delivery; `may_hold_back` is false for a delivery that was
    /// already held back once.
    pub(super) fn roll(&mut self, may_hold_back: bool) -> Fate {
        if self.faults.is_none() {
            return Fate::Deliver { duplicate: false };
        }
        if may_hold_back && self.chance(self.faults.delay) {
            let max = u64::try_from(self.faults.max_delay.as_nanos()).unwrap_or(u64::MAX);
            return Fate::HoldBack(Duration::from_nanos(self.rng.u64(0..=max)));
        }
        if self.chance(self.faults.drop) {
            return Fate::Drop;
        }
        Fate::Deliver {
            duplicate: self.chance(self.faults.duplicate),
        }
    }

    /// True with probability `p`; never for zero, negative or NaN, always from 1 up.
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_faults_always_delivers_once() {
        let mut dice = Dice::new();
        assert!((0..1000).all(|_| dice.roll(true) == Fate::Deliver { duplicate: false }));
    }

    #[test]
    fn certain_faults_always_happen_and_hold_back_only_once() {
        let mut dice = Dice::new();
        let max_delay = Duration::from_millis(5);
        dice.set_faults(Faults {
            drop: 0.0,
            duplicate: 1.0,
            delay: 1.0,
            max_delay,
        });
        assert!(matches!(dice.roll(true), Fate::HoldBack(d) if d <= max_delay));
        assert_eq!(dice.roll(false), Fate::Deliver { duplicate: true });
        dice.set_faults(Faults {
            drop: 1.0,
            ..Faults::none()
        });
        assert_eq!(dice.roll(true), Fate::Drop);
        dice.set_faults(Faults {
            drop: f64::NAN,
            duplicate: -1.0,
            ..Faults::none()
        });
        assert_eq!(dice.roll(true), Fate::Deliver { duplicate: false });
    }

    #[test]
    fn seeded_dice_repeat_themselves() {
        let faults = Faults {
            drop: 0.3,
            duplicate: 0.3,
            delay: 0.3,
            max_delay: Duration::from_secs(1),
        };
        let rolls = |seed| {
            let mut dice = Dice::new();
            dice.set_faults(faults);
            dice.seed(seed);
            (0..100).map(|_| dice.roll(true)).collect::<Vec<_>>()
        };
        assert_eq!(rolls(7), rolls(7));
        assert_ne!(rolls(7), rolls(8));
    }
}
