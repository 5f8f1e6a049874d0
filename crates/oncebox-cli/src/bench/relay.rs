//! `oncebox bench relay`: relay throughput on a pre-filled backlog, against a raw loop.
//!
//! Each run drains `--messages` rows from a freshly filled outbox into a new in-process
//! broker:
//!
//! - **baseline**: one statement per batch claims and deletes the first `--batch`
//!   pending rows and returns them; each is decoded and published, one after the other.
//!   Where the store's relay commits its bookkeeping without waiting for the WAL flush
//!   (PostgreSQL), so does the baseline's statement.
//! - **engine**: the [`Relay`] with the same batch size, `Relay::drain`: rounds until a
//!   claim comes back empty (per-key grouping, leases, concurrent dispatch, settle, each
//!   batch settled together with the next claim as the relay's loop does).
//!
//! Both end on the claim that finds the table empty. Filling is not timed.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use oncebox::Publisher;
use oncebox::Result;
use oncebox::memory::MemoryBroker;
use oncebox::spool::{
    ClaimRequest, Claimed, LeaseToken, Relay, Settlement, SpoolOptions, SpoolStore,
};

use super::RelayArgs;
use super::backend::Backend;
use super::measure::{Comparison, Run, Side};
use super::probe::Probe;
use super::report::RelayReport;

/// Runs the relay benchmark on `backend`.
pub(crate) async fn run<B: Backend>(backend: &B, args: &RelayArgs) -> anyhow::Result<RelayReport> {
    let progress = !args.common.json;
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        for side in [Side::Baseline, Side::Engine] {
            backend.reset_outbox().await?;
            backend
                .prefill(args.messages, args.keys)
                .await
                .context("filling the outbox")?;
            let run = match side {
                Side::Baseline => baseline(backend, args, round).await?,
                Side::Engine => engine(backend, args, round).await?,
            };
            if progress {
                eprintln!(
                    "  round {round} {:<8} {:>10.0} msg/s  ({:.2} s)",
                    side.name(),
                    run.msgs_per_s,
                    run.seconds
                );
            }
            runs.push(run);
        }
    }
    backend.reset_outbox().await?;
    let best = Comparison::best_of(&runs);
    Ok(RelayReport {
        bench: "relay",
        store: args.common.store,
        transport: args.common.transport,
        messages: args.messages,
        batch: args.batch,
        keys: args.keys,
        msgs_per_s: best.engine,
        baseline_msgs_per_s: best.baseline,
        ratio: best.ratio,
        runs,
    })
}

/// The raw loop: claim-and-delete one batch per statement, publish each row.
async fn baseline<B: Backend>(backend: &B, args: &RelayArgs, round: u32) -> anyhow::Result<Run> {
    let broker = MemoryBroker::new();
    let publisher = broker.publisher();
    let probe = Probe::new();
    let started = Instant::now();
    let mut published = 0u64;
    loop {
        let batch = probe.time("take", backend.take_batch(args.batch)).await?;
        if batch.is_empty() {
            break;
        }
        let publish_all = async {
            for message in &batch {
                publisher.publish(message).await?;
            }
            Ok::<(), oncebox::Error>(())
        };
        probe.time("publish", publish_all).await?;
        published += batch.len() as u64;
    }
    let elapsed = started.elapsed();
    check_published(&broker, published, args.messages)?;
    Ok(Run::new(Side::Baseline, round, published, elapsed).with_steps(probe.steps()))
}

/// The engine: `Relay::drain`, rounds until a claim finds nothing (each batch settled
/// with the next claim, as the relay's loop does between full batches).
async fn engine<B: Backend>(backend: &B, args: &RelayArgs, round: u32) -> anyhow::Result<Run> {
    let broker = MemoryBroker::new();
    let options = SpoolOptions::new()
        .name("bench-relay")
        .batch_size(args.batch as usize);
    let probe = Probe::new();
    let outbox = TimedSpool {
        inner: backend.outbox(false),
        probe: Arc::clone(&probe),
    };
    let relay = Relay::relay(outbox, broker.publisher(), options)?;
    let started = Instant::now();
    let report = relay.drain().await?;
    anyhow::ensure!(
        report.done == report.claimed,
        "the relay failed to publish some rows: {report:?}"
    );
    let done = report.done as u64;
    let elapsed = started.elapsed();
    check_published(&broker, done, args.messages)?;
    Ok(Run::new(Side::Engine, round, done, elapsed).with_steps(probe.steps()))
}

fn check_published(broker: &MemoryBroker, counted: u64, expected: u64) -> anyhow::Result<()> {
    let published = broker.stats().published;
    anyhow::ensure!(
        counted == expected && published == expected,
        "expected {expected} messages published, counted {counted}, the broker has {published}"
    );
    Ok(())
}

/// The relay's outbox with its calls timed into a [`Probe`], as `Timed` does, and
/// [`SpoolStore::settle_and_claim`] too (as `settle+claim`), which `Timed` leaves to the
/// trait's default (a settle, then a claim: two transactions).
struct TimedSpool<S> {
    inner: S,
    probe: Arc<Probe>,
}

impl<S: SpoolStore> SpoolStore for TimedSpool<S> {
    type Item = S::Item;

    async fn claim(&self, request: &ClaimRequest) -> Result<Vec<Claimed<S::Item>>> {
        self.probe.time("claim", self.inner.claim(request)).await
    }

    async fn settle(&self, token: LeaseToken, settlements: &[Settlement]) -> Result<()> {
        self.probe
            .time("settle", self.inner.settle(token, settlements))
            .await
    }

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
