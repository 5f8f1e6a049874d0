//! What becomes of work after a failed attempt: the one decision the consumer, the spool
//! engine (the outbox relay, the durable inbox) and the log-tailing relay all make, from
//! the error's [`Fault`]:
//!
//! | the error | the decision |
//! |---|---|
//! | [`Error::Closed`]: the store or transport was closed | [`Stop`](Decision::Stop): the work stays where it is for the next run |
//! | an [outage](Fault::Outage): the store or broker is out | [`WaitOut`](Decision::WaitOut): try again after a backoff that grows with the outages in a row; no attempt is spent |
//! | [transient](Fault::Transient), attempts left | [`Retry`](Decision::Retry) after the backoff of the attempts so far |
//! | transient, the last attempt | [`DeadLetter`](Decision::DeadLetter), reason `gave up after N attempts: …` |
//! | [permanent](Fault::Permanent) | [`DeadLetter`](Decision::DeadLetter) at once, reason `permanent failure: …` |

use std::time::Duration;

use crate::{Backoff, Error, Fault};

/// What to do with work whose attempt failed: see the [module](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The store or transport was closed: stop, leaving the work for the next run.
    Stop,
    /// The store or broker is out, no fault of the work: try again after `delay`,
    /// without spending an attempt.
    WaitOut {
        /// How long to wait.
        delay: Duration,
    },
    /// Try again after `delay`; the attempt counted.
    Retry {
        /// How long to wait.
        delay: Duration,
    },
    /// Give up on the work: dead-letter it with `reason`.
    DeadLetter {
        /// Why, for the dead letter: the error, and whether attempts ran out.
        reason: String,
    },
}

/// How many attempts work gets and how long it waits between them.
#[derive(Debug, Clone, Copy)]
pub struct Retries<'a> {
    max_attempts: u32,
    backoff: &'a Backoff,
}

impl<'a> Retries<'a> {
    /// Up to `max_attempts` attempts (outages not counted), `backoff` between them.
    pub const fn new(max_attempts: u32, backoff: &'a Backoff) -> Self {
        Self {
            max_attempts,
            backoff,
        }
    }

    /// Decides after an attempt failed with `error`. `attempts` counts the attempts
    /// made, this one included (an outage does not spend one: when `error` is an
    /// outage, pass the count as it stood); `outages` counts the outages in a row
    /// before this failure.
    pub fn decide(&self, error: &Error, attempts: u32, outages: u32) -> Decision {
        if matches!(error, Error::Closed) {
            return Decision::Stop;
        }
        match error.fault() {
            Fault::Outage => Decision::WaitOut {
                delay: self.backoff.delay(outages.saturating_add(1)),
            },
            Fault::Transient if attempts < self.max_attempts => Decision::Retry {
                delay: self.backoff.delay(attempts),
            },
            Fault::Transient => Decision::DeadLetter {
                reason: format!("gave up after {attempts} attempts: {error}"),
            },
            Fault::Permanent => Decision::DeadLetter {
                reason: format!("permanent failure: {error}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retries(backoff: &Backoff) -> Retries<'_> {
        Retries::new(3, backoff)
    }

    #[test]
    fn permanent_failures_are_dead_lettered_at_once() {
        let backoff = Backoff::new();
        let decided = retries(&backoff).decide(&Error::store_permanent("NOT NULL"), 1, 0);
        assert_eq!(
            decided,
            Decision::DeadLetter {
                reason: "permanent failure: store error: NOT NULL".into()
            }
        );
    }

    #[test]
    fn transient_failures_count_toward_the_limit() {
        let backoff = Backoff::new().jitter(0.0);
        let error = Error::store_transient("deadlock");
        assert_eq!(
            retries(&backoff).decide(&error, 2, 0),
            Decision::Retry {
                delay: Duration::from_secs(2)
            }
        );
        assert!(matches!(
            retries(&backoff).decide(&error, 3, 0),
            Decision::DeadLetter { reason } if reason.starts_with("gave up after 3 attempts: ")
        ));
    }

    #[test]
    fn outages_are_waited_out_whatever_the_attempts_and_back_off_in_a_row() {
        let backoff = Backoff::new().jitter(0.0);
        let error = Error::store_outage("connection refused");
        assert_eq!(
            retries(&backoff).decide(&error, 100, 0),
            Decision::WaitOut {
                delay: Duration::from_secs(1)
            }
        );
        assert_eq!(
            retries(&backoff).decide(&error, 1, 3),
            Decision::WaitOut {
                delay: Duration::from_secs(8)
            }
        );
    }

    #[test]
    fn a_closed_store_or_transport_stops_the_loop() {
        let backoff = Backoff::new();
        assert_eq!(
            retries(&backoff).decide(&Error::Closed, 1, 0),
            Decision::Stop
        );
    }
}
