//! The spool loop.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::StreamExt;
use futures_util::future::{Either, select};
use futures_util::stream;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::lease::Lease;
use super::metrics::SpoolMetrics;
use super::{
    ClaimRequest, Claimed, LeaseToken, Settle, Settlement, Sink, SpoolItem, SpoolOptions,
    SpoolStore,
};
use crate::retry::{Decision, Retries};
use crate::{Error, Fault, Result};

/// Called with each item that is dead-lettered and the reason.
pub type DeadLetterHook<T> = Arc<dyn Fn(&T, &str) + Send + Sync>;

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
    metrics: SpoolMetrics,
    health: std::sync::Mutex<SpoolHealth>,
    /// Set by [`run_until`](Self::run_until) when told to stop: rows not started yet are
    /// handed back instead of delivered.
    stopping: std::sync::atomic::AtomicBool,
}

/// How a running spool fares, for readiness checks: read with [`Spool::health`].
///
/// New fields may be added before 1.0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpoolHealth {
    /// When the last claim succeeded; `None` before the first.
    pub last_claim: Option<Instant>,
    /// The error of the last claim, if it failed (cleared by the next success).
    pub claim_error: Option<String>,
    /// The error that made the last delivered batch find its sink unreachable, if it
    /// did (cleared by the next batch that reached it).
    pub sink_outage: Option<String>,
}

impl<S: SpoolStore, K: Sink<S::Item>> Spool<S, K> {
    /// A spool delivering `store`'s rows into `sink`.
    ///
    /// Its metrics (the `oncebox` crate's guide, `oncebox::guide::metrics`) go to the recorder
    /// installed when it is built.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] if `options` fail [`SpoolOptions::validate`].
    pub fn new(store: S, sink: K, options: SpoolOptions) -> Result<Self> {
        options.validate()?;
        Ok(Self {
            metrics: SpoolMetrics::new(&options.name),
            health: std::sync::Mutex::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
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

    /// How the loop of [`run_until`](Self::run_until) fares: its last claim, and whether
    /// the sink was reachable.
    pub fn health(&self) -> SpoolHealth {
        self.health
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn update_health(&self, update: impl FnOnce(&mut SpoolHealth)) {
        update(
            &mut self
                .health
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
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
        let batch = self.claim_after(None).await?;
        if batch.rows.is_empty() {
            return Ok(BatchReport::default());
        }
        let delivered = self.dispatch(batch).await;
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
            let batch = match ahead.take() {
                Some(batch) => batch,
                None => self.claim_after(pending.take()).await?,
            };
            if batch.rows.is_empty() {
                return Ok(total);
            }
            let (delivered, next) = self.deliver_and_claim_ahead(batch, &mut pending).await;
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
        batch: Batch<S::Item>,
        pending: &mut Option<Delivered>,
    ) -> (Delivered, Result<Option<Batch<S::Item>>>) {
        if !self.options.pipeline || batch.rows.len() < self.options.batch_size {
            return (self.dispatch(batch).await, Ok(None));
        }
        // The rows of `batch` stay leased while the next claim runs, so by the store's
        // per-key prefix rule it takes none of their keys.
        let (delivered, next) =
            futures_util::future::join(self.dispatch(batch), self.claim_after(pending.take()))
                .await;
        let next = next.map(|next| (!next.rows.is_empty()).then_some(next));
        (delivered, next)
    }

    /// Claims a batch; with `pending`, settles it in the same store call first.
    ///
    /// If that call fails, the settlements are retried on their own (settling twice is
    /// harmless), so that a failed claim does not make the delivered rows wait for their
    /// lease to end; the claim's error is returned either way.
    async fn claim_after(&self, pending: Option<Delivered>) -> Result<Batch<S::Item>> {
        let request = ClaimRequest {
            token: LeaseToken::new(),
            limit: self.options.batch_size,
            lease: self.options.lease,
        };
        // The lease runs from the store's receipt of the claim: no earlier than now.
        let claimed_at = Instant::now();
        let batch = |rows| Batch {
            token: request.token,
            rows,
            claimed_at,
        };
        let Some(pending) = pending else {
            let rows = self.store.claim(&request).await?;
            self.metrics.claimed(claimed_at.elapsed());
            return Ok(batch(rows));
        };
        match self
            .store
            .settle_and_claim(pending.token, &pending.settlements, &request)
            .await
        {
            Ok(rows) => {
                self.metrics.claimed(claimed_at.elapsed());
                self.record_metrics(&pending.report);
                Ok(batch(rows))
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

    /// Delivers a claimed batch: concurrently across keys, in order within a key, while
    /// the claim's lease is renewed beside it. No row goes out once the lease (less a
    /// safety margin) may have ended: the rows not delivered by then are handed back.
    async fn dispatch(&self, batch: Batch<S::Item>) -> Delivered {
        let mut report = BatchReport {
            claimed: batch.rows.len(),
            ..BatchReport::default()
        };
        let lease = Lease::new(batch.claimed_at, self.options.lease);
        let outage = std::sync::Mutex::new(None);
        let seqs: Vec<i64> = batch.rows.iter().map(|row| row.seq).collect();
        let span = self.sink.batch_span(&batch.rows);
        let delivery = stream::iter(group_by_key(batch.rows))
            .map(|rows| self.dispatch_key(rows, &lease, &outage))
            .buffer_unordered(self.options.concurrency)
            .flat_map(stream::iter)
            .collect::<Vec<Settlement>>()
            .instrument(span.clone());
        let keeper = lease.keep(&self.store, batch.token, &seqs, self.options.lease);
        let settlements = match select(std::pin::pin!(delivery), std::pin::pin!(keeper)).await {
            Either::Left((settlements, keeper)) => {
                lease.delivered();
                keeper.await;
                settlements
            }
            // The lease is lost: the rest of the batch is handed back as it goes.
            Either::Right(((), delivery)) => delivery.await,
        };
        for s in &settlements {
            match s.outcome {
                Settle::Done => report.done += 1,
                Settle::Retry { .. } => report.retried += 1,
                Settle::Release => report.released += 1,
                Settle::Dead { .. } => report.dead += 1,
            }
        }
        crate::trace::record_batch(&span, &report);
        Delivered {
            token: batch.token,
            settlements,
            report,
            outage: outage
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
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
    /// retried, or an outage, once the lease is lost, or once the spool is stopping, the
    /// key's later rows are released unattempted.
    async fn dispatch_key(
        &self,
        rows: Vec<Claimed<S::Item>>,
        lease: &Lease,
        outage: &std::sync::Mutex<Option<String>>,
    ) -> Vec<Settlement> {
        let mut settlements = Vec::with_capacity(rows.len());
        let mut blocked = false;
        for row in rows {
            let stopping = self.stopping.load(std::sync::atomic::Ordering::Relaxed);
            let outcome = if blocked || stopping || lease.is_lost() {
                Settle::Release
            } else {
                let outcome = self.deliver(&row, lease, outage).await;
                blocked = matches!(outcome, Settle::Retry { .. } | Settle::Release);
                outcome
            };
            settlements.push(Settlement {
                seq: row.seq,
                outcome,
            });
        }
        settlements
    }

    async fn deliver(
        &self,
        row: &Claimed<S::Item>,
        lease: &Lease,
        outage: &std::sync::Mutex<Option<String>>,
    ) -> Settle {
        let timeout = self.options.dispatch_timeout;
        let started = Instant::now();
        let delivery = tokio::time::timeout(timeout, self.sink.deliver(row));
        let result = tokio::select! {
            result = delivery => match result {
                Ok(result) => result,
                Err(_) => Err(Error::Timeout(timeout)),
            },
            // Cut off: another spool may own the row from here on. Whether the broker
            // took it or not, it is delivered again (at least once).
            () = lease.lost() => return Settle::Release,
        };
        let Err(error) = result else {
            self.metrics
                .delivered(started.elapsed(), row.item.created_at());
            return Settle::Done;
        };
        self.metrics.delivered(started.elapsed(), None);
        let attempts = row.attempts.saturating_add(1);
        let retries = Retries::new(self.options.max_attempts, &self.options.backoff);
        let reason = match retries.decide(&error, attempts, 0) {
            // A sink closed (its process stopping) or out: no fault of the row. Hand it
            // back without counting an attempt, and make the loop back off before it
            // claims again (it counts the outages in a row, per batch).
            Decision::Stop | Decision::WaitOut { .. } => {
                tracing::debug!(
                    spool = %self.options.name, item = %row.item.describe(), %error,
                    "the sink is unreachable; handed back"
                );
                *outage
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error.to_string());
                return Settle::Release;
            }
            Decision::Retry { delay } => {
                tracing::debug!(
                    spool = %self.options.name, item = %row.item.describe(), attempts, ?delay, %error,
                    "delivery failed; will retry"
                );
                return Settle::Retry {
                    at: SystemTime::now() + delay,
                    error: error.to_string(),
                };
            }
            Decision::DeadLetter { reason } => reason,
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
        self.metrics.settled(report);
    }

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

impl BatchReport {
    fn add(&mut self, other: &Self) {
        self.claimed += other.claimed;
        self.done += other.done;
        self.retried += other.retried;
        self.released += other.released;
        self.dead += other.dead;
    }
}

/// A claimed batch, not delivered yet.
struct Batch<T> {
    token: LeaseToken,
    rows: Vec<Claimed<T>>,
    /// When the claim was sent: its lease runs from no earlier.
    claimed_at: Instant,
}

/// A delivered batch, not settled yet.
struct Delivered {
    token: LeaseToken,
    settlements: Vec<Settlement>,
    report: BatchReport,
    /// Why the sink was unreachable for some row (handed back, not counted), if it was.
    outage: Option<String>,
}

/// Whether a claim's error ends the spool: the store closed, or an error retrying
/// cannot mend.
fn fatal_claim_error(error: &Error) -> bool {
    matches!(error, Error::Closed) || error.fault() == Fault::Permanent
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
    use crate::Message;

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
