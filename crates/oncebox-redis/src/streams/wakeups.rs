//! When a subscriber must look for reclaimable entries: the times at which its own
//! deliveries, unsettled or nacked, become due again.
//!
//! Redis tells nobody when an entry's idle time reaches the ack timeout; a subscriber
//! finds such entries with `XAUTOCLAIM`. Looking only every
//! [`reclaim_interval`](super::RedisStreamOptions::reclaim_interval) would make a nack's
//! delay late by up to that interval, so each delivery this subscriber hands out registers
//! the time it becomes due (its ack timeout, or its nack delay), the subscriber scans at
//! the earliest one, and settling a delivery removes its time.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

/// Margin added to every due time, for Redis's millisecond clock and the time between
/// the command's execution and its reply reaching us.
const MARGIN: Duration = Duration::from_millis(5);

/// A registered due time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Wakeup(Instant, u64);

#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    due: Mutex<BTreeSet<Wakeup>>,
    next_key: AtomicU64,
    /// Notified when a due time earlier than every other may have been added.
    pub(crate) changed: Notify,
}

impl Wakeups {
    fn lock(&self) -> MutexGuard<'_, BTreeSet<Wakeup>> {
        // Every change is a single insert or remove: a poisoned set is still consistent.
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a scan `after` from now.
    pub(crate) fn add(&self, after: Duration) -> Wakeup {
        let wakeup = Wakeup(
            Instant::now() + after + MARGIN,
            self.next_key.fetch_add(1, Ordering::Relaxed),
        );
        self.lock().insert(wakeup);
        wakeup
    }

    /// Registers a scan `after` from now and wakes the subscriber to take it into account.
    pub(crate) fn add_and_notify(&self, after: Duration) -> Wakeup {
        let wakeup = self.add(after);
        self.changed.notify_waiters();
        wakeup
    }

    pub(crate) fn remove(&self, wakeup: Wakeup) {
        self.lock().remove(&wakeup);
    }

    /// The earliest registered time.
    pub(crate) fn earliest(&self) -> Option<Instant> {
        self.lock().first().map(|w| w.0)
    }

    /// Forgets every time up to `until`: a complete scan started then took care of them.
    pub(crate) fn clear_until(&self, until: Instant) {
        let mut due = self.lock();
        let later = due.split_off(&Wakeup(until, u64::MAX));
        *due = later;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn earliest_and_clearing() {
        let wakeups = Wakeups::default();
        let late = wakeups.add(Duration::from_secs(10));
        let soon = wakeups.add(Duration::from_secs(1));
        assert_eq!(wakeups.earliest(), Some(soon.0));
        wakeups.remove(soon);
        assert_eq!(wakeups.earliest(), Some(late.0));
        wakeups.add(Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(3)).await;
        wakeups.clear_until(Instant::now());
        assert_eq!(wakeups.len(), 1);
        assert_eq!(wakeups.earliest(), Some(late.0));
    }
}
