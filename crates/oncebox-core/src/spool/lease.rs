//! Keeping a claim's lease while its batch is delivered.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::{LeaseToken, SpoolStore};
use crate::Error;

/// Whether a claim's lease still surely holds.
///
/// The lease is held until the claim's (or the last renewal's) send time plus the lease,
/// less a tenth of it as a safety margin (the store's clock and this process's may tick
/// apart, and a statement takes time to arrive). Past that point another spool may own
/// the rows. The deadline is read from the clock, not only from the keeper: a batch
/// claimed ahead waits for its turn with no keeper running, and its lease may end
/// before its delivery starts.
pub(super) struct Lease {
    lost: watch::Sender<bool>,
    /// The claim's send time, then each renewal's, plus the lease less the margin.
    held_until: Mutex<Instant>,
    /// Set once the batch is delivered: the keeper stops (never in the middle of an
    /// extension, which some stores cannot abandon half way without losing the claim).
    delivered: watch::Sender<bool>,
}

/// How long a lease surely holds after its claim or renewal was sent.
fn held_for(lease: Duration) -> Duration {
    lease.saturating_sub(lease / 10)
}

impl Lease {
    /// The lease of a claim of `lease` sent at `claimed_at`.
    pub(super) fn new(claimed_at: Instant, lease: Duration) -> Self {
        Self {
            lost: watch::Sender::new(false),
            held_until: Mutex::new(claimed_at + held_for(lease)),
            delivered: watch::Sender::new(false),
        }
    }

    fn held_until(&self) -> Instant {
        *self
            .held_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the keeper the batch is delivered: it returns at its next pause.
    pub(super) fn delivered(&self) {
        self.delivered.send_replace(true);
    }

    /// Whether the lease was lost: refused, or not renewed in time.
    pub(super) fn is_lost(&self) -> bool {
        *self.lost.borrow() || Instant::now() >= self.held_until()
    }

    /// Completes once the lease is lost.
    pub(super) async fn lost(&self) {
        let mut lost = self.lost.subscribe();
        loop {
            let until = self.held_until();
            tokio::select! {
                // An error means the keeper is gone with the batch: nothing more to wait for.
                _ = lost.wait_for(|lost| *lost) => return,
                () = sleep_until(until) => {
                    if Instant::now() >= self.held_until() {
                        return;
                    }
                }
            }
        }
    }

    /// Renews the lease of claim `token` every third of `lease`, until the renewal is
    /// refused or the lease, less the margin, passes without one; then marks it lost and
    /// returns. Runs beside the delivery of the batch and is dropped with it.
    pub(super) async fn keep<S: SpoolStore>(
        &self,
        store: &S,
        token: LeaseToken,
        rows: &[i64],
        lease: Duration,
    ) {
        let held_for = held_for(lease);
        let mut renewed_at = self.held_until() - held_for;
        let mut delivered = self.delivered.subscribe();
        loop {
            let held_until = renewed_at + held_for;
            tokio::select! {
                () = sleep_until((renewed_at + lease / 3).min(held_until)) => {}
                _ = delivered.wait_for(|done| *done) => return,
            }
            if Instant::now() >= held_until {
                break;
            }
            let sent = Instant::now();
            match timeout_at(held_until, store.extend(token, rows, lease)).await {
                Ok(Ok(())) => {
                    renewed_at = sent;
                    *self
                        .held_until
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = sent + held_for;
                }
                Ok(Err(Error::LeaseLost)) | Err(_) => break,
                Ok(Err(error)) => {
                    tracing::warn!(%token, %error, "renewing a claim's lease failed; trying again");
                    sleep_until((Instant::now() + lease / 20).min(held_until)).await;
                }
            }
        }
        tracing::warn!(%token, "a claim's lease was lost: the rest of its batch is handed back");
        metrics::counter!("oncebox_spool_leases_lost_total").increment(1);
        self.lost.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);

    /// A batch claimed ahead waits for its turn with no keeper: once its lease, less
    /// the margin, has passed, it counts as lost before any keeper says so, and no row
    /// of it starts.
    #[tokio::test(start_paused = true)]
    async fn a_lease_runs_out_by_the_clock_without_a_keeper() {
        let lease = Lease::new(Instant::now(), LEASE);
        assert!(!lease.is_lost());
        tokio::time::advance(LEASE - LEASE / 10 - Duration::from_millis(1)).await;
        assert!(!lease.is_lost(), "held until the margin");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            lease.is_lost(),
            "lost at the margin, with no keeper running"
        );

        let stale = Lease::new(Instant::now() - LEASE, LEASE);
        assert!(
            stale.is_lost(),
            "a claim older than its lease is lost at once"
        );
        tokio::time::timeout(Duration::from_millis(1), stale.lost())
            .await
            .expect("lost() completes at once");
    }

    /// `lost()` completes when the deadline passes, and a renewal moves the deadline.
    #[tokio::test(start_paused = true)]
    async fn lost_follows_the_deadline_and_its_renewals() {
        let lease = Lease::new(Instant::now(), LEASE);
        *lease
            .held_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now() + LEASE * 2;
        let waited = Instant::now();
        lease.lost().await;
        assert_eq!(waited.elapsed(), LEASE * 2, "lost at the renewed deadline");
    }
}
