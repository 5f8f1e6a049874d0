//! `oncebox-bench consumer`: the transactional inbox against the same handler without
//! deduplication.
//!
//! Each run publishes `--messages` messages into a new in-process broker (not timed),
//! then consumes them all through a [`Consumer`] with `--lanes` lanes:
//!
//! - **baseline**: per message, a transaction running the handler (one effect row),
//!   commit, ack;
//! - **engine**: a [`TransactionalInbox`]: the same transaction also records the id and
//!   stores the result;
//! - **traced** (builds with the feature `otel`): the engine with its `process` spans
//!   built by `tracing-opentelemetry` and batched to an exporter that drops them.
//!
//! The inbox and effect tables are emptied before each run; each run must leave exactly
//! one effect row per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use oncebox::consumer::{
    Consumer, ConsumerOptions, Outcome, Process, TransactionalInbox, TxHandler,
};
use oncebox::memory::MemoryBroker;
use oncebox::store::Transactional;
use oncebox::{Publisher, Received};
use tokio::sync::Notify;

use super::backend::Backend;
use super::measure::{Comparison, Run, Side, TracingCost};
use super::probe::{Probe, Timed};
use super::report::ConsumerReport;
use super::{ConsumerArgs, workload};

/// The consumer (and group) name of the engine runs.
const CONSUMER: &str = "bench";

/// Redelivery delay after a failure, for both sides (failures are not expected).
const RETRY: Duration = Duration::from_millis(100);

/// The options of both sides: failures (not expected) are retried after [`RETRY`].
fn options() -> ConsumerOptions {
    ConsumerOptions::new(CONSUMER).backoff(oncebox::Backoff::new().initial(RETRY).max(RETRY))
}

/// Runs the consumer benchmark on `backend`.
pub(crate) async fn run<B: Backend>(
    backend: &B,
    args: &ConsumerArgs,
) -> anyhow::Result<ConsumerReport> {
    let progress = !args.common.json;
    let mut runs = Vec::new();
    let mut retries = 0;
    for round in 1..=args.rounds {
        for side in Side::with_traced(&[Side::Baseline, Side::Engine]) {
            backend.reset_consumer().await?;
            let probe = Probe::new();
            let (run, retried) = match side {
                Side::Baseline => {
                    let plain = PlainTx {
                        store: Timed::new(backend.inbox(), &probe),
                        handler: Timed::new(backend.effect(), &probe),
                        options: options(),
                    };
                    consume(plain, side, round, args).await?
                }
                // The engine, traced or not.
                _ => {
                    let inbox = TransactionalInbox::new(
                        Timed::new(backend.inbox(), &probe),
                        Timed::new(backend.effect(), &probe),
                        options(),
                    )?;
                    let exported = super::spans::exported();
                    let consumed = super::traced(side, consume(inbox, side, round, args)).await?;
                    super::ensure_traced(side, exported)?;
                    consumed
                }
            };
            let run = run.with_steps(probe.steps());
            retries += retried;
            let effects = backend.count_effects().await?;
            anyhow::ensure!(
                effects == args.messages,
                "{} run {round}: {effects} effect rows for {} messages",
                side.name(),
                args.messages
            );
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
    backend.reset_consumer().await?;
    let best = Comparison::best_of(&runs);
    Ok(ConsumerReport {
        bench: "consumer",
        store: args.common.store,
        transport: args.common.transport,
        messages: args.messages,
        lanes: args.lanes,
        keys: args.keys,
        msgs_per_s: best.engine,
        baseline_msgs_per_s: best.baseline,
        ratio: best.ratio,
        retries,
        tracing: TracingCost::of(&runs),
        runs,
    })
}

/// Publishes the messages into a new broker, then consumes them with `processor`;
/// returns the timed run and how many deliveries were retried.
async fn consume<P>(
    processor: P,
    side: Side,
    round: u32,
    args: &ConsumerArgs,
) -> anyhow::Result<(Run, u64)>
where
    P: Process + 'static,
{
    let broker = MemoryBroker::new();
    let publisher = broker.publisher();
    for n in 0..args.messages {
        publisher
            .publish(&workload::message(workload::TOPIC, n, args.keys))
            .await?;
    }
    let subscriber = broker.subscribe(workload::TOPIC, CONSUMER);

    let handled = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    let all_handled = Arc::new(Notify::new());
    let observe = {
        let (handled, retried, all_handled) = (
            Arc::clone(&handled),
            Arc::clone(&retried),
            Arc::clone(&all_handled),
        );
        let expected = args.messages;
        move |_: &Received, outcome: &Outcome| match outcome {
            Outcome::Handled => {
                if handled.fetch_add(1, Ordering::Relaxed) + 1 == expected {
                    all_handled.notify_one();
                }
            }
            _ => {
                retried.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let consumer = Consumer::new(subscriber, processor)
        .lanes(args.lanes as usize)
        .on_outcome(observe);
    let started = Instant::now();
    consumer
        .run_until(all_handled.notified())
        .await
        .context("consuming")?;
    let elapsed = started.elapsed();
    let handled = handled.load(Ordering::Relaxed);
    anyhow::ensure!(
        handled == args.messages,
        "handled {handled} of {} messages",
        args.messages
    );
    Ok((
        Run::new(side, round, handled, elapsed),
        retried.load(Ordering::Relaxed),
    ))
}

/// The baseline: the handler in a transaction of its own, no inbox record, then ack.
struct PlainTx<S, H> {
    store: S,
    handler: H,
    options: ConsumerOptions,
}

impl<S, H> Process for PlainTx<S, H>
where
    S: Transactional,
    H: TxHandler<S::Tx>,
{
    fn options(&self) -> &ConsumerOptions {
        &self.options
    }

    async fn process(&self, received: &Received) -> oncebox::Result<Outcome> {
        let mut tx = self.store.begin().await?;
        self.handler.handle(received, &mut tx).await?;
        self.store.commit(tx).await?;
        Ok(Outcome::Handled)
    }
}
