//! When a scheduled outbox message becomes due.

use std::time::{Duration, SystemTime};

/// When a message enqueued with a schedule (`enqueue_scheduled` on each SQL outbox)
/// becomes due: relays publish it then, not before.
///
/// The time is compared with the database's clock, as retries are: a delay counts from
/// the enqueue statement by that clock, and a time of day is taken as it is, so keep the
/// producer's clock and the database's close when you use [`Schedule::At`] (SQLite has
/// no clock of its own: there it is the producer's).
///
/// A scheduled message keeps its place in its key's order: a later message of the same
/// key, due or not, waits behind it until it is published (or dead, or cancelled). Give a
/// message that should not hold others back no key, or a key of its own.
///
/// Until it is due, a scheduled row stays among the pending rows in commit order, which
/// each claim of a relay reads from the oldest: a few scheduled rows cost nothing, but
/// many thousands scheduled far ahead make every claim read past them. Schedule at that
/// scale in a table of your own, and enqueue each message when it comes due.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use oncebox_core::Schedule;
///
/// let reminder = Schedule::After(Duration::from_secs(24 * 3600));
/// let at_noon = Schedule::At(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000));
/// assert_ne!(reminder, at_noon);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// This long after the enqueue, by the database's clock.
    After(Duration),
    /// At this time; a time in the past is due at once.
    At(SystemTime),
}
