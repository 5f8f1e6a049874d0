//! The spool and one claim → deliver → settle round; delivery is in `dispatch`, the
//! service loops in `loops`.

use std::sync::Arc;

use tokio::time::Instant;

use super::metrics::SpoolMetrics;
use super::{ClaimRequest, Claimed, LeaseToken, Settlement, Sink, SpoolOptions, SpoolStore};
use crate::Result;

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
    pub(super) store: S,
    pub(super) sink: K,
    pub(super) options: SpoolOptions,
    pub(super) on_dead: Option<DeadLetterHook<S::Item>>,
    pub(super) metrics: SpoolMetrics,
    pub(super) health: std::sync::Mutex<SpoolHealth>,
    /// Set by [`run_until`](Self::run_until) when told to stop: rows not started yet are
    /// handed back instead of delivered.
    pub(super) stopping: std::sync::atomic::AtomicBool,
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
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) if `options` fail [`SpoolOptions::validate`].
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

    pub(super) fn update_health(&self, update: impl FnOnce(&mut SpoolHealth)) {
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
    pub(super) async fn deliver_and_claim_ahead(
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
    pub(super) async fn claim_after(&self, pending: Option<Delivered>) -> Result<Batch<S::Item>> {
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

    /// Settles a delivered batch on its own.
    pub(super) async fn finish(&self, delivered: Delivered) -> Result<BatchReport> {
        self.store
            .settle(delivered.token, &delivered.settlements)
            .await?;
        self.record_metrics(&delivered.report);
        Ok(delivered.report)
    }

    pub(super) fn record_metrics(&self, report: &BatchReport) {
        self.metrics.settled(report);
    }
}

impl BatchReport {
    pub(super) fn add(&mut self, other: &Self) {
        self.claimed += other.claimed;
        self.done += other.done;
        self.retried += other.retried;
        self.released += other.released;
        self.dead += other.dead;
    }
}

/// A claimed batch, not delivered yet.
pub(super) struct Batch<T> {
    pub(super) token: LeaseToken,
    pub(super) rows: Vec<Claimed<T>>,
    /// When the claim was sent: its lease runs from no earlier.
    pub(super) claimed_at: Instant,
}

/// A delivered batch, not settled yet.
pub(super) struct Delivered {
    pub(super) token: LeaseToken,
    pub(super) settlements: Vec<Settlement>,
    pub(super) report: BatchReport,
    /// Why the sink was unreachable for some row (handed back, not counted), if it was.
    pub(super) outage: Option<String>,
}
