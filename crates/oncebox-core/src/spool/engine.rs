//! The spool loop.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::StreamExt;
use futures_util::stream;
use tokio::sync::watch;

use super::{
    ClaimRequest, Claimed, LeaseToken, PublishSink, Settle, Settlement, Sink, SpoolItem,
    SpoolOptions, SpoolStore,
};
use crate::{Error, Message, Publisher, Result};

/// Called with each item that is dead-lettered and the reason.
pub type DeadLetterHook<T> = Arc<dyn Fn(&T, &str) + Send + Sync>;

/// The outbox relay: a spool over an outbox table that publishes through `P`.
pub type Relay<S, P> = Spool<S, PublishSink<P>>;

/// What one claim → dispatch → settle round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows delivered and marked done.
    pub done: usize,
    /// Rows that failed and will be retried.
    pub retried: usize,
    /// Rows handed back unattempted because an earlier row of their key failed.
    pub released: usize,
    /// Rows dead-lettered.
    pub dead: usize,
}

/// Processes a [`SpoolStore`] into a [`Sink`]; see the [module docs](super).
pub struct Spool<S: SpoolStore, K> {
    store: S,
    sink: K,
    options: SpoolOptions,
    on_dead: Option<DeadLetterHook<S::Item>>,
}

impl<S: SpoolStore<Item = Message>, P: Publisher> Spool<S, PublishSink<P>> {
    /// A relay publishing the outbox `store` through `publisher`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if `options` fail [`SpoolOptions::validate`].
    pub fn relay(store: S, publisher: P, options: SpoolOptions) -> Result<Self> {
        Self::new(store, PublishSink(publisher), options)
    }
}

impl<S: SpoolStore, K: Sink<S::Item>> Spool<S, K> {
    /// A spool delivering `store`'s rows into `sink`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if `options` fail [`SpoolOptions::validate`].
    pub fn new(store: S, sink: K, options: SpoolOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            store,
            sink,
            options,
            on_dead: None,
        })
    }

    /// Calls `hook` for every dead-lettered item (beside the log line and the metric).
    #[must_use]
    pub fn on_dead_letter(mut self, hook: impl Fn(&S::Item, &str) + Send + Sync + 'static) -> Self {
        self.on_dead = Some(Arc::new(hook));
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The options.
    pub fn options(&self) -> &SpoolOptions {
        &self.options
    }

    /// Runs one claim → dispatch → settle round.
    ///
    /// # Errors
    ///
    /// A store error from claim or settle. Delivery errors are not errors of the round:
    /// they become retries or dead letters.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense of losing nothing *of the round*: rows claimed by a
    /// cancelled round stay leased until the lease ends and are then delivered again.
    pub async fn run_once(&self) -> Result<BatchReport> {
        let (token, batch) = self.claim_after(None).await?;
        if batch.is_empty() {
            return Ok(BatchReport::default());
        }
        let delivered = self.dispatch(token, batch).await;
        self.finish(delivered).await
    }

    /// Runs claim → dispatch → settle rounds until a claim finds nothing due; returns
    /// the rounds' summed report. Each batch is settled in the same store call as the
    /// next claim ([`SpoolStore::settle_and_claim`]), so a store that runs both in one
    /// transaction commits once per batch.
    ///
    /// # Errors
    ///
    /// A store error from a claim or a settlement; the rounds before it are settled (if
    /// only the claim failed, the last batch is settled on its own before the error
    /// returns).
    ///
    /// # Cancel safety
    ///
    /// As [`run_once`](Self::run_once): rows of a cancelled round stay leased until the
    /// lease ends and are then delivered again.
    pub async fn drain(&self) -> Result<BatchReport> {
        let mut total = BatchReport::default();
        let mut pending = None;
        let mut ahead = None;
        loop {
            let (token, batch) = match ahead.take() {
                Some(claimed) => claimed,
                None => self.claim_after(pending.take()).await?,
            };
            if batch.is_empty() {
                return Ok(total);
            }
            let (delivered, next) = self
                .deliver_and_claim_ahead(token, batch, &mut pending)
                .await;
            total.add(&delivered.report);
            if let Some(earlier) = pending.replace(delivered) {
                // This batch was claimed ahead but not full, so nothing settled the one
                // before it: settle it on its own.
                self.finish(earlier).await?;
            }
            match next {
                Ok(next) => ahead = next,
                Err(error) => {
                    if let Some(delivered) = pending.take() {
                        self.finish(delivered).await?;
                    }
                    return Err(error);
                }
            }
        }
    }

    /// Delivers `batch`; if it is full and pipelining is on, meanwhile settles `pending`
    /// and claims the next batch, which is returned when it is not empty.
    ///
    /// `pending` is taken only if the settlement was handed to the store: on return it
    /// still holds the previous batch if that has yet to be settled.
    async fn deliver_and_claim_ahead(
        &self,
        token: LeaseToken,
        batch: Vec<Claimed<S::Item>>,
        pending: &mut Option<Delivered>,
    ) -> (
        Delivered,
        Result<Option<(LeaseToken, Vec<Claimed<S::Item>>)>>,
    ) {
        if !self.options.pipeline || batch.len() < self.options.batch_size {
            return (self.dispatch(token, batch).await, Ok(None));
        }
        // The rows of `batch` stay leased while the next claim runs, so by the store's
        // per-key prefix rule it takes none of their keys.
        let (delivered, next) = futures_util::future::join(
            self.dispatch(token, batch),
            self.claim_after(pending.take()),
        )
        .await;
        let next = next.map(|(token, rows)| (!rows.is_empty()).then_some((token, rows)));
        (delivered, next)
    }

    /// Claims a batch; with `pending`, settles it in the same store call first.
    ///
    /// If that call fails, the settlements are retried on their own (settling twice is
    /// harmless), so that a failed claim does not make the delivered rows wait for their
    /// lease to end; the claim's error is returned either way.
    async fn claim_after(
        &self,
        pending: Option<Delivered>,
    ) -> Result<(LeaseToken, Vec<Claimed<S::Item>>)> {
        let request = ClaimRequest {
            token: LeaseToken::new(),
            limit: self.options.batch_size,
            lease: self.options.lease,
        };
        let Some(pending) = pending else {
            let batch = self.store.claim(&request).await?;
            return Ok((request.token, batch));
        };
        match self
            .store
            .settle_and_claim(pending.token, &pending.settlements, &request)
            .await
        {
            Ok(batch) => {
                self.record_metrics(&pending.report);
                Ok((request.token, batch))
            }
            Err(error) => {
                if self.finish(pending).await.is_err() {
                    tracing::debug!(
                        spool = %self.options.name,
                        "settling on its own after a failed settle-and-claim failed too"
                    );
                }
                Err(error)
            }
        }
    }

    /// Delivers a claimed batch: concurrently across keys, in order within a key.
    async fn dispatch(&self, token: LeaseToken, batch: Vec<Claimed<S::Item>>) -> Delivered {
        let mut report = BatchReport {
            claimed: batch.len(),
            ..BatchReport::default()
        };
        let settlements: Vec<Settlement> = stream::iter(group_by_key(batch))
            .map(|rows| self.dispatch_key(rows))
            .buffer_unordered(self.options.concurrency)
            .flat_map(stream::iter)
            .collect()
            .await;
        for s in &settlements {
            match s.outcome {
                Settle::Done => report.done += 1,
                Settle::Retry { .. } => report.retried += 1,
                Settle::Release => report.released += 1,
                Settle::Dead { .. } => report.dead += 1,
            }
        }
        Delivered {
            token,
            settlements,
            report,
        }
    }

    /// Settles a delivered batch on its own.
    async fn finish(&self, delivered: Delivered) -> Result<BatchReport> {
        self.store
            .settle(delivered.token, &delivered.settlements)
            .await?;
        self.record_metrics(&delivered.report);
        Ok(delivered.report)
    }

    /// Delivers the claimed rows of one key in order; after a failure that will be
    /// retried, the key's later rows are released unattempted.
    async fn dispatch_key(&self, rows: Vec<Claimed<S::Item>>) -> Vec<Settlement> {
        let mut settlements = Vec::with_capacity(rows.len());
        let mut blocked = false;
        for row in rows {
            let outcome = if blocked {
                Settle::Release
            } else {
                let outcome = self.deliver(&row).await;
                blocked = matches!(outcome, Settle::Retry { .. });
                outcome
            };
            settlements.push(Settlement {
                seq: row.seq,
                outcome,
            });
        }
        settlements
    }

    async fn deliver(&self, row: &Claimed<S::Item>) -> Settle {
        let timeout = self.options.dispatch_timeout;
        let result = match tokio::time::timeout(timeout, self.sink.deliver(row)).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(timeout)),
        };
        let Err(error) = result else {
            return Settle::Done;
        };
        let attempts = row.attempts.saturating_add(1);
        if error.is_transient() && attempts < self.options.max_attempts {
            let delay = self.options.backoff.delay(attempts);
            tracing::debug!(
                spool = %self.options.name, item = %row.item.describe(), attempts, ?delay, %error,
                "delivery failed; will retry"
            );
            return Settle::Retry {
                at: SystemTime::now() + delay,
                error: error.to_string(),
            };
        }
        let reason = if error.is_transient() {
            format!("gave up after {attempts} attempts: {error}")
        } else {
            format!("permanent failure: {error}")
        };
        tracing::warn!(
            spool = %self.options.name, item = %row.item.describe(), %reason,
            "dead-lettered"
        );
        if let Some(hook) = &self.on_dead {
            hook(&row.item, &reason);
        }
        Settle::Dead { reason }
    }

    fn record_metrics(&self, report: &BatchReport) {
        let name = self.options.name.clone();
        for (outcome, count) in [
            ("done", report.done),
            ("retried", report.retried),
            ("released", report.released),
            ("dead", report.dead),
        ] {
            if count > 0 {
                metrics::counter!("oncebox_spool_rows_total", "spool" => name.clone(), "outcome" => outcome)
                    .increment(count as u64);
            }
        }
    }

    /// Deletes done rows older than the retention, in batches of `cleanup_batch`, until
    /// none are left; returns how many were deleted.
    ///
    /// # Errors
    ///
    /// A store error (rows deleted before it stay deleted).
    pub async fn cleanup(&self) -> Result<u64> {
        let before = SystemTime::now() - self.options.retention;
        let limit = self.options.cleanup_batch;
        let mut total = 0;
        loop {
            let deleted = self.store.purge(before, limit).await?;
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
    /// On shutdown the round in progress finishes (deliveries and settlement), then the
    /// call returns. Store errors are logged and retried with the idle backoff: the loop
    /// only ends on shutdown.
    ///
    /// # Errors
    ///
    /// None at present; the `Result` leaves room for fatal errors of future stores.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future is a crash: claimed rows stay leased until their lease ends.
    pub async fn run_until(&self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let (stop, stopped) = watch::channel(false);
        let signal = async move {
            shutdown.await;
            let _ = stop.send(true);
        };
        tokio::join!(
            signal,
            self.claim_loop(stopped.clone()),
            self.cleanup_loop(stopped)
        );
        Ok(())
    }

    /// Claims and delivers until stopped. A full batch is settled together with the next
    /// claim ([`SpoolStore::settle_and_claim`]), as the loop goes on at once; any other
    /// batch is settled before the loop waits, and the last one before it returns.
    async fn claim_loop(&self, mut stopped: watch::Receiver<bool>) {
        let mut idle = self.options.min_poll;
        let mut pending: Option<Delivered> = None;
        let mut ahead = None;
        while !*stopped.borrow() {
            let claimed = match ahead.take() {
                Some(claimed) => Ok(claimed),
                None => self.claim_after(pending.take()).await,
            };
            match claimed {
                Ok((_, batch)) if batch.is_empty() => idle = (idle * 2).min(self.options.max_poll),
                Ok((token, batch)) => {
                    let full = batch.len() >= self.options.batch_size;
                    let (delivered, next) = self
                        .deliver_and_claim_ahead(token, batch, &mut pending)
                        .await;
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
                    if full {
                        pending = Some(delivered);
                        continue;
                    }
                    if let Err(error) = self.finish(delivered).await {
                        tracing::warn!(spool = %self.options.name, %error, "settling a batch failed");
                        idle = self.options.max_poll;
                    }
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
        if let Some((token, rows)) = ahead {
            // Claimed ahead but stopped before delivery: hand the rows back unattempted.
            let released: Vec<Settlement> = rows
                .iter()
                .map(|row| Settlement {
                    seq: row.seq,
                    outcome: Settle::Release,
                })
                .collect();
            if let Err(error) = self.store.settle(token, &released).await {
                tracing::warn!(
                    spool = %self.options.name, %error,
                    "releasing the batch claimed ahead failed; its rows wait for their lease to end"
                );
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
                    tracing::warn!(spool = %self.options.name, %error, "retention cleanup failed")
                }
            }
        }
    }
}

impl BatchReport {
    fn add(&mut self, other: &Self) {
        self.claimed += other.claimed;
        self.done += other.done;
        self.retried += other.retried;
        self.released += other.released;
        self.dead += other.dead;
    }
}

/// A delivered batch, not settled yet.
struct Delivered {
    token: LeaseToken,
    settlements: Vec<Settlement>,
    report: BatchReport,
}

/// Splits a batch (in `seq` order) into per-key runs, keeping order within each run.
/// Rows without a key form runs of one.
fn group_by_key<T: SpoolItem>(batch: Vec<Claimed<T>>) -> Vec<Vec<Claimed<T>>> {
    let mut groups: Vec<Vec<Claimed<T>>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for row in batch {
        let slot = match row.item.ordering_key() {
            Some(key) => *index.entry(key.to_owned()).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            }),
            None => {
                groups.push(Vec::new());
                groups.len() - 1
            }
        };
        groups[slot].push(row);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, key: Option<&str>) -> Claimed<Message> {
        let mut item = Message::new("t", "");
        item.key = key.map(str::to_owned);
        Claimed {
            seq,
            token: LeaseToken::new(),
            attempts: 0,
            item,
        }
    }

    #[test]
    fn groups_keep_order_within_a_key() {
        let batch = vec![
            row(1, Some("a")),
            row(2, Some("b")),
            row(3, None),
            row(4, Some("a")),
        ];
        let groups: Vec<Vec<i64>> = group_by_key(batch)
            .into_iter()
            .map(|g| g.into_iter().map(|r| r.seq).collect())
            .collect();
        assert_eq!(groups, vec![vec![1, 4], vec![2], vec![3]]);
    }
}
