//! Keeping a dedup lease alive while the work it guards runs.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};

use crate::store::{DedupStore, FencingToken};
use crate::{Error, Result};

/// Runs `work` while `token` holds `id` in `store`, and never longer.
///
/// The lease, taken by a [`begin`](DedupStore::begin) sent at `taken_at` for `lease`, is
/// extended every third of the lease ([`DedupStore::extend`]), so work slower than one
/// lease keeps the id and no duplicate runs beside it. If an extension is refused (the
/// lease was lost) or the store does not answer before the lease, less a tenth of it as
/// a safety margin, may have ended, `work` is dropped at that point and
/// [`Error::LeaseLost`] returned: the work never runs on while another worker may hold
/// the id.
///
/// # Errors
///
/// The error of `work`, or [`Error::LeaseLost`] when it was stopped.
///
/// # Cancel safety
///
/// Dropping the future drops `work`; the lease then ends by itself.
pub async fn keep_lease<S, T>(
    store: &S,
    id: &str,
    token: FencingToken,
    lease: Duration,
    taken_at: Instant,
    work: impl Future<Output = Result<T>>,
) -> Result<T>
where
    S: DedupStore + ?Sized,
{
    let margin = lease / 10;
    let keeper = async {
        let mut held_until = taken_at + lease.saturating_sub(margin);
        loop {
            let next = (Instant::now() + lease / 3).min(held_until);
            sleep_until(next).await;
            if Instant::now() >= held_until {
                return Error::LeaseLost;
            }
            let sent = Instant::now();
            match timeout_at(held_until, store.extend(id, token, lease)).await {
                Ok(Ok(())) => held_until = sent + lease.saturating_sub(margin),
                Ok(Err(Error::LeaseLost)) | Err(_) => return Error::LeaseLost,
                Ok(Err(error)) => {
                    tracing::warn!(%id, %error, "could not extend the lease; trying again");
                }
            }
        }
    };
    tokio::select! {
        // The work first: work done in its first poll never arms the keeper's timer.
        biased;
        done = work => done,
        lost = keeper => {
            tracing::warn!(%id, "the lease could not be kept; the work was stopped");
            Err(lost)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::memory::MemoryDedupStore;
    use crate::store::Begin;

    const LEASE: Duration = Duration::from_secs(1);

    async fn take(store: &MemoryDedupStore, id: &str) -> (FencingToken, Instant) {
        let taken_at = Instant::now();
        let Begin::Started(token) = store.begin(id, LEASE).await.unwrap() else {
            panic!("{id} is held");
        };
        (token, taken_at)
    }

    #[tokio::test(start_paused = true)]
    async fn work_longer_than_the_lease_keeps_the_id() {
        let store = Arc::new(MemoryDedupStore::new(100));
        let (token, taken_at) = take(&store, "slow").await;
        let duplicate = {
            let store = Arc::clone(&store);
            async move {
                // Three leases later, a duplicate still finds the id held.
                tokio::time::sleep(LEASE * 3).await;
                store.begin("slow", LEASE).await.unwrap()
            }
        };
        let work = async {
            tokio::time::sleep(LEASE * 5).await;
            Ok("done")
        };
        let (done, seen) = tokio::join!(
            keep_lease(&*store, "slow", token, LEASE, taken_at, work),
            duplicate
        );
        assert_eq!(done.unwrap(), "done");
        assert!(matches!(seen, Begin::InProgress { .. }), "{seen:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn work_is_stopped_before_a_lease_that_cannot_be_kept_ends() {
        let store = MemoryDedupStore::new(100);
        let (token, taken_at) = take(&store, "cut").await;
        store.set_down(true);
        let work = async {
            tokio::time::sleep(LEASE * 5).await;
            Ok(())
        };
        let stopped = keep_lease(&store, "cut", token, LEASE, taken_at, work).await;
        assert!(matches!(stopped, Err(Error::LeaseLost)), "{stopped:?}");
        assert!(
            Instant::now() < taken_at + LEASE,
            "stopped only after the lease ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_stops_the_work() {
        let store = MemoryDedupStore::new(100);
        let (token, taken_at) = take(&store, "lost").await;
        // Another worker's token: the extension is refused at the first renewal.
        let stale = FencingToken(token.0 + 1000);
        let work = std::future::pending::<Result<()>>();
        let stopped = keep_lease(&store, "lost", stale, LEASE, taken_at, work).await;
        assert!(matches!(stopped, Err(Error::LeaseLost)), "{stopped:?}");
        assert!(Instant::now() < taken_at + LEASE);
    }
}
