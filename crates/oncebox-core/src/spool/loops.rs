//! The spool's service: the claim loop, with the backlog gauge and retention cleanup
//! beside it, until a stop.

use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;

use super::engine::{Batch, Delivered, Spool};
use super::{Settle, Settlement, Sink, SpoolStore};
use crate::{Error, Fault, Result};

impl<S: SpoolStore, K: Sink<S::Item>> Spool<S, K> {
    /// Deletes done rows older than the retention, in batches of `cleanup_batch`, until
    /// none are left; returns how many were deleted.
    ///
    /// # Errors
    ///
    /// A store error (rows deleted before it stay deleted).
    pub async fn cleanup(&self) -> Result<u64> {
        let before = crate::time::ago(self.options.retention_duration());
        let limit = self.options.cleanup_batch;
        let mut total = 0;
        loop {
            let deleted = self.store.purge(before, limit).await?;
            self.metrics.purged(deleted);
            total += deleted;
            if deleted < limit as u64 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }

    /// Runs the spool until `shutdown` completes: claims and delivers batches, waits
    /// adaptively when idle, and runs retention cleanup every `cleanup_interval`.
    ///
    /// On shutdown no row is started any more: deliveries under way finish, the rows of
    /// the batch not started yet are handed back unattempted (as are rows claimed ahead),
    /// everything is settled, then the call returns. A stop thus takes at most one
    /// delivery per key of the batch, and publishes nothing twice. Transient store errors and outages of the store or the sink are
    /// logged and retried with backoff; rows the sink could not reach are handed back
    /// without spending an attempt.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] when the store was closed, or a permanent store error from a
    /// claim (a missing table, a schema the store does not know, refused permissions):
    /// errors that retrying cannot mend. The round in progress is settled first.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: claimed rows stay leased until their lease ends.
    pub async fn run_until(&self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        self.stopping
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let stop = watch::Sender::new(false);
        let claims = async {
            let ended = self.claim_loop(stop.subscribe()).await;
            // A claim loop that failed stops the cleanup too.
            stop.send_replace(true);
            ended
        };
        let work = async {
            tokio::join!(
                claims,
                self.cleanup_loop(stop.subscribe()),
                self.backlog_loop(stop.subscribe())
            )
            .0
        };
        let mut work = std::pin::pin!(work);
        tokio::select! {
            ended = &mut work => ended,
            () = shutdown => {
                self.stopping.store(true, std::sync::atomic::Ordering::Relaxed);
                stop.send_replace(true);
                work.await
            }
        }
    }

    /// Claims and delivers until stopped. A full batch is settled together with the next
    /// claim ([`SpoolStore::settle_and_claim`]), as the loop goes on at once; any other
    /// batch is settled before the loop waits, and the last one before it returns.
    async fn claim_loop(&self, mut stopped: watch::Receiver<bool>) -> Result<()> {
        let mut idle = self.options.min_poll;
        let mut outages = 0u32;
        let mut pending: Option<Delivered> = None;
        let mut ahead = None;
        let mut fatal = None;
        while !*stopped.borrow() {
            let claimed = match ahead.take() {
                Some(batch) => Ok(batch),
                None => self.claim_after(pending.take()).await,
            };
            self.update_health(|health| match &claimed {
                Ok(_) => {
                    health.last_claim = Some(Instant::now());
                    health.claim_error = None;
                }
                Err(error) => health.claim_error = Some(error.to_string()),
            });
            match claimed {
                Ok(batch) if batch.rows.is_empty() => {
                    idle = (idle * 2).min(self.options.max_poll);
                }
                Ok(batch) => {
                    let full = batch.rows.len() >= self.options.batch_size;
                    let (delivered, next) = self.deliver_and_claim_ahead(batch, &mut pending).await;
                    idle = self.options.min_poll;
                    if let Some(earlier) = pending.take()
                        && let Err(error) = self.finish(earlier).await
                    {
                        tracing::warn!(spool = %self.options.name, %error, "settling a batch failed");
                    }
                    match next {
                        Ok(next) => ahead = next,
                        Err(error) => {
                            tracing::warn!(spool = %self.options.name, %error, "claiming ahead failed");
                        }
                    }
                    let outage = delivered.outage.clone();
                    let reached = outage.is_none();
                    self.update_health(|health| health.sink_outage = outage);
                    if !reached {
                        // The sink is unreachable: settle, hand back what was claimed
                        // ahead, and wait before claiming again.
                        outages = outages.saturating_add(1);
                        idle = self
                            .options
                            .backoff
                            .delay(outages)
                            .max(self.options.min_poll);
                        if let Some(batch) = ahead.take() {
                            self.release(batch).await;
                        }
                    } else {
                        outages = 0;
                        if full {
                            pending = Some(delivered);
                            continue;
                        }
                    }
                    if let Err(error) = self.finish(delivered).await {
                        tracing::warn!(spool = %self.options.name, %error, "settling a batch failed");
                        idle = self.options.max_poll;
                    }
                }
                Err(error) if fatal_claim_error(&error) => {
                    tracing::error!(spool = %self.options.name, %error, "claiming failed for good; stopping");
                    fatal = Some(error);
                    break;
                }
                Err(error) => {
                    tracing::warn!(spool = %self.options.name, %error, "claim round failed");
                    idle = self.options.max_poll;
                }
            }
            tokio::select! {
                _ = stopped.changed() => {}
                () = self.store.wait_for_work(idle) => {}
            }
        }
        if let Some(delivered) = pending
            && let Err(error) = self.finish(delivered).await
        {
            tracing::warn!(spool = %self.options.name, %error, "settling the last batch failed");
        }
        if let Some(batch) = ahead {
            // Claimed ahead but stopped before delivery.
            self.release(batch).await;
        }
        fatal.map_or(Ok(()), Err)
    }

    /// Hands the rows of a claimed batch back unattempted.
    async fn release(&self, batch: Batch<S::Item>) {
        let released: Vec<Settlement> = batch
            .rows
            .iter()
            .map(|row| Settlement {
                seq: row.seq,
                outcome: Settle::Release,
            })
            .collect();
        if let Err(error) = self.store.settle(batch.token, &released).await {
            tracing::warn!(
                spool = %self.options.name, %error,
                "releasing a claimed batch failed; its rows wait for their lease to end"
            );
        }
    }

    /// Samples the backlog every `stats_interval`, from the start, until stopped or the
    /// store says it does not tell.
    async fn backlog_loop(&self, mut stopped: watch::Receiver<bool>) {
        loop {
            match self.store.backlog().await {
                Ok(Some(backlog)) => self.metrics.backlog(&backlog),
                Ok(None) => return,
                Err(error) => {
                    self.metrics.backlog_failed();
                    tracing::debug!(spool = %self.options.name, %error, "reading the backlog failed");
                }
            }
            tokio::select! {
                _ = stopped.changed() => return,
                () = tokio::time::sleep(self.options.stats_interval) => {}
            }
        }
    }

    async fn cleanup_loop(&self, mut stopped: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = stopped.changed() => return,
                () = tokio::time::sleep(self.options.cleanup_interval) => {}
            }
            match self.cleanup().await {
                Ok(0) => {}
                Ok(deleted) => {
                    tracing::debug!(spool = %self.options.name, deleted, "retention cleanup")
                }
                Err(error) => {
                    self.metrics.cleanup_failed();
                    tracing::warn!(spool = %self.options.name, %error, "retention cleanup failed")
                }
            }
        }
    }
}

/// Whether a claim's error ends the spool: the store closed, or an error retrying
/// cannot mend.
fn fatal_claim_error(error: &Error) -> bool {
    matches!(error, Error::Closed) || error.fault() == Fault::Permanent
}
