//! In-process wake-ups: MySQL has no `LISTEN/NOTIFY`, so relays poll, and producers in
//! the same process can cut the wait short.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// A counter that every wake-up moves on; waiters watch it.
#[derive(Debug)]
pub(crate) struct Wakeup {
    counter: watch::Sender<u64>,
}

impl Wakeup {
    pub(crate) fn new() -> Self {
        Self {
            counter: watch::Sender::new(0),
        }
    }

    /// Wakes every waiter, now or at its next wait if it is busy claiming.
    pub(crate) fn wake(&self) {
        self.counter.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// What one handle has seen of the counter.
    pub(crate) fn seen(&self) -> Seen {
        Seen(Mutex::new(self.counter.subscribe()))
    }
}

/// The wake-ups one handle has seen: a wake-up since the last [`Seen::mark`] ends the
/// next [`Seen::wait`] at once, so none is lost while its relay is busy claiming.
#[derive(Debug)]
pub(crate) struct Seen(Mutex<watch::Receiver<u64>>);

impl Seen {
    /// Everything so far is seen (called as a claim begins: the claim sees the rows).
    pub(crate) fn mark(&self) {
        self.lock().borrow_and_update();
    }

    /// Waits for a wake-up not yet marked, or `timeout`.
    pub(crate) async fn wait(&self, timeout: Duration) {
        let mut receiver = self.lock().clone();
        match tokio::time::timeout(timeout, receiver.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            // The sender lives as long as the store: unreachable, but never spin.
            Ok(Err(_)) => tokio::time::sleep(timeout).await,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, watch::Receiver<u64>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Clone for Seen {
    fn clone(&self) -> Self {
        Self(Mutex::new(self.lock().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wake_before_the_wait_is_not_lost() {
        let wakeup = Wakeup::new();
        let seen = wakeup.seen();
        seen.mark();
        wakeup.wake();
        let started = tokio::time::Instant::now();
        seen.wait(Duration::from_secs(10)).await;
        assert!(started.elapsed() < Duration::from_secs(1));
        seen.mark();
        seen.wait(Duration::from_secs(10)).await;
        assert!(started.elapsed() >= Duration::from_secs(10));
    }
}
