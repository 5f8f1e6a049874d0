//! Where the time goes: wrappers that time each store and handler call of a run, so that
//! a report says which step limits a ratio.
//!
//! A call costs two clock reads and an uncontended lock, far below one SQL statement.
//! With concurrent calls (consumer lanes) the totals add up the time of every call in
//! flight, so they can exceed the run's wall-clock time; the mean per call is the useful
//! figure then.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use oncebox::consumer::TxHandler;
use oncebox::spool::{ClaimRequest, Claimed, LeaseToken, Settlement, SpoolStore};
use oncebox::store::{InboxStore, Recorded, Transactional};
use oncebox::{Received, Result};
use serde::Serialize;

/// The time spent in one step of a run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Step {
    /// What was timed (`claim`, `settle`, `record`, ...).
    pub(crate) step: &'static str,
    /// How many calls.
    pub(crate) calls: u64,
    /// Their summed duration, in seconds.
    pub(crate) total_s: f64,
    /// Mean duration of one call, in milliseconds.
    pub(crate) mean_ms: f64,
}

/// Sums the duration of calls per step, in the order steps were first seen.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    steps: Mutex<Vec<(&'static str, u64, Duration)>>,
}

impl Probe {
    /// A new probe, shared by the wrappers of one run.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Adds one call of `step` that took `elapsed`.
    pub(crate) fn add(&self, step: &'static str, elapsed: Duration) {
        let mut steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        match steps.iter_mut().find(|(name, _, _)| *name == step) {
            Some((_, calls, total)) => {
                *calls += 1;
                *total += elapsed;
            }
            None => steps.push((step, 1, elapsed)),
        }
    }

    /// Runs `future`, adding its duration to `step`.
    pub(crate) async fn time<F: Future>(&self, step: &'static str, future: F) -> F::Output {
        let started = Instant::now();
        let output = future.await;
        self.add(step, started.elapsed());
        output
    }

    /// The steps so far.
    pub(crate) fn steps(&self) -> Vec<Step> {
        let steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        steps
            .iter()
            .map(|&(step, calls, total)| Step {
                step,
                calls,
                total_s: total.as_secs_f64(),
                mean_ms: if calls == 0 {
                    0.0
                } else {
                    total.as_secs_f64() * 1000.0 / calls as f64
                },
            })
            .collect()
    }
}

/// A store (spool or inbox) or handler whose calls are timed into a [`Probe`].
pub(crate) struct Timed<S> {
    inner: S,
    probe: Arc<Probe>,
}

impl<S> Timed<S> {
    /// Wraps `inner`, timing its calls into `probe`.
    pub(crate) fn new(inner: S, probe: &Arc<Probe>) -> Self {
        Self {
            inner,
            probe: Arc::clone(probe),
        }
    }
}

impl<S: SpoolStore> SpoolStore for Timed<S> {
    type Item = S::Item;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<S::Item>>> {
        self.probe.time("claim", self.inner.claim(request)).await
    }

    async fn extend(&self, token: LeaseToken, rows: &[i64], lease: Duration) -> Result<()> {
        self.probe
            .time("extend", self.inner.extend(token, rows, lease))
            .await
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        self.probe
            .time("settle", self.inner.settle(token, settlements))
            .await
    }

    /// Forwarded, not left to the trait's default (a settle, then a claim: two
    /// transactions), so that a store's one-transaction version is what is measured.
    async fn settle_and_claim(
        &self,
        token: LeaseToken,
        settlements: &[Settlement],
        request: &ClaimRequest,
    ) -> Result<Vec<Claimed<S::Item>>> {
        self.probe
            .time(
                "settle+claim",
                self.inner.settle_and_claim(token, settlements, request),
            )
            .await
    }

    async fn purge(&self, before: SystemTime, limit: usize) -> Result<u64> {
        self.probe
            .time("purge", self.inner.purge(before, limit))
            .await
    }

    async fn wait_for_work(&self, timeout: Duration) {
        self.inner.wait_for_work(timeout).await;
    }
}

impl<S: Transactional> Transactional for Timed<S> {
    type Tx = S::Tx;

    async fn begin(&self) -> Result<S::Tx> {
        self.probe.time("begin", self.inner.begin()).await
    }

    async fn commit(&self, tx: S::Tx) -> Result<()> {
        self.probe.time("commit", self.inner.commit(tx)).await
    }
}

impl<S: InboxStore> InboxStore for Timed<S> {
    async fn begin_recorded(&self, consumer: &str, id: &str) -> Result<(S::Tx, Recorded)> {
        self.probe
            .time("begin+record", self.inner.begin_recorded(consumer, id))
            .await
    }

    async fn record(&self, tx: &mut S::Tx, consumer: &str, id: &str) -> Result<Recorded> {
        self.probe
            .time("record", self.inner.record(tx, consumer, id))
            .await
    }

    async fn store_result(
        &self,
        tx: &mut S::Tx,
        consumer: &str,
        id: &str,
        result: &[u8],
    ) -> Result<()> {
        self.probe
            .time(
                "store_result",
                self.inner.store_result(tx, consumer, id, result),
            )
            .await
    }

    async fn purge(&self, consumer: &str, before: SystemTime, limit: usize) -> Result<u64> {
        self.probe
            .time("purge", self.inner.purge(consumer, before, limit))
            .await
    }
    async fn count_duplicate(&self, consumer: &str) -> Result<()> {
        self.probe
            .time("count_duplicate", self.inner.count_duplicate(consumer))
            .await
    }
}

impl<Tx: Send, H: TxHandler<Tx>> TxHandler<Tx> for Timed<H> {
    type Output = H::Output;

    async fn handle(&self, message: &Received, tx: &mut Tx) -> Result<H::Output> {
        self.probe
            .time("handle", self.inner.handle(message, tx))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_sum_per_name_in_first_seen_order() {
        let probe = Probe::new();
        probe.add("claim", Duration::from_millis(2));
        probe.add("settle", Duration::from_millis(1));
        probe.add("claim", Duration::from_millis(4));
        let steps = probe.steps();
        assert_eq!(steps.len(), 2);
        assert_eq!((steps[0].step, steps[0].calls), ("claim", 2));
        assert!((steps[0].mean_ms - 3.0).abs() < 1e-9);
        assert!((steps[0].total_s - 0.006).abs() < 1e-9);
        assert_eq!((steps[1].step, steps[1].calls), ("settle", 1));
    }
}
