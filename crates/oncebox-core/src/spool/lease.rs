//! Keeping a claim's lease while its batch is delivered.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::{LeaseToken, SpoolStore};
use crate::Error;

/// Whether a claim's lease still surely holds, as its keeper sees it.
///
/// The lease is held until the last renewal's send time plus the lease, less a tenth of
/// it as a safety margin (the store's clock and this process's may tick apart, and a
/// statement takes time to arrive). Past that point another spool may own the rows.
pub(super) struct Lease {
    lost: watch::Sender<bool>,
    /// Set once the batch is delivered: the keeper stops (never in the middle of an
    /// extension, which some stores cannot abandon half way without losing the claim).
    delivered: watch::Sender<bool>,
}

impl Lease {
    pub(super) fn new() -> Self {
        Self {
            lost: watch::Sender::new(false),
            delivered: watch::Sender::new(false),
        }
    }

    /// Tells the keeper the batch is delivered: it returns at its next pause.
    pub(super) fn delivered(&self) {
        self.delivered.send_replace(true);
    }

    /// Whether the lease was lost (refused, or not renewed in time).
    pub(super) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Completes once the lease is lost.
    pub(super) async fn lost(&self) {
        let mut lost = self.lost.subscribe();
        // An error means the keeper is gone with the batch: nothing more to wait for.
        let _ = lost.wait_for(|lost| *lost).await;
    }

    /// Renews the lease of claim `token`, taken by a claim sent at `claimed_at`, every
    /// third of `lease`, until the renewal is refused or the lease, less the margin,
    /// passes without one; then marks it lost and returns. Runs beside the delivery of
    /// the batch and is dropped with it.
    pub(super) async fn keep<S: SpoolStore>(
        &self,
        store: &S,
        token: LeaseToken,
        rows: &[i64],
        lease: Duration,
        claimed_at: Instant,
    ) {
        let held_for = lease.saturating_sub(lease / 10);
        let mut renewed_at = claimed_at;
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
                Ok(Ok(())) => renewed_at = sent,
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
