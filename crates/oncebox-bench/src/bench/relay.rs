//! `oncebox-bench relay`: relay throughput on a pre-filled backlog, against a raw loop.
//!
//! Each run drains `--messages` rows from a freshly filled outbox to a new topic on the
//! `--transport` broker:
//!
//! - **baseline**: one statement per batch claims and deletes the first `--batch`
//!   pending rows and returns them; they are decoded and published with the broker's own
//!   client, the whole batch in flight at once ([`BenchTransport::publish_raw`]). Where
//!   the store's relay commits its bookkeeping without waiting for the WAL flush
//!   (PostgreSQL), so does the baseline's statement.
//! - **engine**: the [`Relay`] with the same batch size, `Relay::drain`: rounds until a
//!   claim comes back empty (per-key grouping, leases, concurrent dispatch, settle, each
//!   batch settled together with the next claim as the relay's loop does).
//! - **metered**: the engine again, its metrics going to a Prometheus recorder (the one
//!   `oncebox relay` serves) instead of the facade's no-op default; `metrics_ratio` is
//!   metered / engine, the cost of the metrics.
//! - **traced** (builds with the feature `otel`): the engine again, its spans built by
//!   `tracing-opentelemetry` and batched to an exporter that drops them; `tracing.ratio`
//!   is traced / engine, the cost of tracing without a collector's.
//!
//! - **cdc** and **cdc-table** (`--mode cdc`, PostgreSQL only): the log-tailing
//!   relay on a new slot, after a backlog of logical messages or outbox rows committed
//!   in transactions of 1,000 (the walsender decodes a transaction whole, so one huge
//!   one would measure its spilling to disk, not the relay); timed from the relay's
//!   start until the broker confirmed the last message. Rows are deleted inside that
//!   time in batches of 1,000, all but the last; the graceful stop after it (which
//!   waits up to a status interval for the server to take the slot's confirmation) is
//!   not timed.
//!
//! The polling sides end on the claim that finds the table empty. Filling is not timed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use metrics_exporter_prometheus::PrometheusBuilder;
use oncebox::postgres::cdc::CdcMode;
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::{Message, Publisher};
use tokio::sync::Notify;

use super::backend::Backend;
use super::backend::postgres::PgBench;
use super::measure::{Comparison, Run, Side, TracingCost, best};
use super::probe::{Probe, Timed};
use super::report::{CdcThroughput, RelayReport};
use super::traced;
use super::transport::BenchTransport;
use super::{RelayArgs, RelayMode};

/// Runs the relay benchmark on `backend`, publishing to `transport`.
pub(crate) async fn run<B: Backend, T: BenchTransport>(
    backend: &B,
    transport: &mut T,
    args: &RelayArgs,
) -> anyhow::Result<RelayReport> {
    let progress = !args.common.json;
    let mut sides = Side::with_traced(&[Side::Baseline, Side::Engine, Side::Metered]);
    let pg = match args.mode {
        RelayMode::Poll => None,
        RelayMode::Cdc => {
            sides.extend([Side::Cdc, Side::CdcTable]);
            Some(
                backend
                    .postgres()
                    .context("--mode cdc needs --store postgres")?,
            )
        }
    };
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        for &side in &sides {
            backend.reset_outbox().await?;
            transport.reset().await.context("preparing the broker")?;
            let run = match (side, pg) {
                (Side::Cdc, Some(pg)) => {
                    cdc(pg, &*transport, args, round, CdcMode::Messages).await?
                }
                (Side::CdcTable, Some(pg)) => {
                    cdc(pg, &*transport, args, round, CdcMode::Table).await?
                }
                (side, _) => {
                    backend
                        .prefill(transport.topic(), args.messages, args.keys)
                        .await
                        .context("filling the outbox")?;
                    if side == Side::Baseline {
                        baseline(backend, &*transport, args, round).await?
                    } else {
                        engine(backend, &*transport, args, round, side).await?
                    }
                }
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
    let comparison = Comparison::best_of(&runs);
    let metered = best(&runs, Side::Metered);
    Ok(RelayReport {
        bench: "relay",
        store: args.common.store,
        transport: args.common.transport,
        messages: args.messages,
        batch: args.batch,
        keys: args.keys,
        msgs_per_s: comparison.engine,
        baseline_msgs_per_s: comparison.baseline,
        ratio: comparison.ratio,
        metered_msgs_per_s: metered,
        metrics_ratio: if comparison.engine > 0.0 {
            metered / comparison.engine
        } else {
            0.0
        },
        tracing: TracingCost::of(&runs),
        cdc: pg.map(|_| {
            let ratio = |side| {
                let engine = comparison.engine;
                if engine > 0.0 {
                    best(&runs, side) / engine
                } else {
                    0.0
                }
            };
            CdcThroughput {
                msgs_per_s: best(&runs, Side::Cdc),
                ratio: ratio(Side::Cdc),
                table_msgs_per_s: best(&runs, Side::CdcTable),
                table_ratio: ratio(Side::CdcTable),
            }
        }),
        runs,
    })
}

/// The raw loop: claim-and-delete one batch per statement, publish it with the broker's
/// own client.
async fn baseline<B: Backend, T: BenchTransport>(
    backend: &B,
    transport: &T,
    args: &RelayArgs,
    round: u32,
) -> anyhow::Result<Run> {
    let probe = Probe::new();
    let started = Instant::now();
    let mut published = 0u64;
    loop {
        let batch = probe.time("take", backend.take_batch(args.batch)).await?;
        if batch.is_empty() {
            break;
        }
        probe.time("publish", transport.publish_raw(&batch)).await?;
        published += batch.len() as u64;
    }
    let elapsed = started.elapsed();
    check_published(transport, published, args.messages).await?;
    Ok(Run::new(Side::Baseline, round, published, elapsed).with_steps(probe.steps()))
}

/// The engine: `Relay::drain`, rounds until a claim finds nothing (each batch settled
/// with the next claim, as the relay's loop does between full batches). [`Side::Metered`]:
/// its metrics go to a Prometheus recorder of its own (the relay registers its metrics
/// when it is built, so the recorder in place then receives them); [`Side::Traced`]: its
/// spans are built and exported to nowhere.
async fn engine<B: Backend, T: BenchTransport>(
    backend: &B,
    transport: &T,
    args: &RelayArgs,
    round: u32,
    side: Side,
) -> anyhow::Result<Run> {
    let metered = side == Side::Metered;
    let options = SpoolOptions::new()
        .name("bench-relay")
        .batch_size(args.batch as usize);
    let probe = Probe::new();
    let outbox = Timed::new(backend.outbox(false), &probe);
    let publisher = transport.publisher().await?;
    let recorder = PrometheusBuilder::new().build_recorder();
    let relay = if metered {
        metrics::with_local_recorder(&recorder, || Relay::new(outbox, publisher, options))?
    } else {
        Relay::new(outbox, publisher, options)?
    };
    let exported = super::spans::exported();
    let started = Instant::now();
    let report = traced(side, relay.drain()).await?;
    anyhow::ensure!(
        report.done == report.claimed,
        "the relay failed to publish some rows: {report:?}"
    );
    let done = report.done as u64;
    let elapsed = started.elapsed();
    check_published(transport, done, args.messages).await?;
    super::ensure_traced(side, exported)?;
    if metered {
        // The recorder did receive the run's metrics.
        let rendered = recorder.handle().render();
        anyhow::ensure!(
            rendered.contains("oncebox_spool_rows_total"),
            "the Prometheus recorder received no relay metrics"
        );
    }
    Ok(Run::new(side, round, done, elapsed).with_steps(probe.steps()))
}

/// The log-tailing relay of `mode` on a new slot: fills its backlog (not timed), then
/// runs it until the broker confirmed `--messages` (timed) and stops it gracefully.
async fn cdc<T: BenchTransport>(
    pg: &PgBench,
    transport: &T,
    args: &RelayArgs,
    round: u32,
    mode: CdcMode,
) -> anyhow::Result<Run> {
    let side = match mode {
        CdcMode::Messages => Side::Cdc,
        CdcMode::Table => Side::CdcTable,
    };
    let published = Arc::new(AtomicU64::new(0));
    let all_published = Arc::new(Notify::new());
    let publisher = Counted {
        inner: transport.publisher().await?,
        published: Arc::clone(&published),
        target: args.messages,
        reached: Arc::clone(&all_published),
    };
    let relay = pg.cdc_relay(mode, publisher).await?;
    pg.prefill_cdc(mode, transport.topic(), args.messages, args.keys)
        .await?;
    let stop = Arc::new(Notify::new());
    let started = Instant::now();
    let running = relay.run_until({
        let stop = Arc::clone(&stop);
        async move { stop.notified().await }
    });
    tokio::pin!(running);
    let elapsed = tokio::select! {
        () = all_published.notified() => started.elapsed(),
        stopped = &mut running => {
            stopped?;
            anyhow::bail!("the log-tailing relay stopped before publishing everything");
        }
    };
    stop.notify_one();
    running.await?;
    pg.drop_cdc().await?;
    let counted = published.load(Ordering::Relaxed);
    check_published(transport, counted, args.messages).await?;
    Ok(Run::new(side, round, counted, elapsed))
}

/// A publisher that counts the messages the broker confirmed and wakes `reached` when
/// the count comes to `target`.
struct Counted<P> {
    inner: P,
    published: Arc<AtomicU64>,
    target: u64,
    reached: Arc<Notify>,
}

impl<P: Publisher> Publisher for Counted<P> {
    async fn publish(&self, message: &Message) -> oncebox::Result<()> {
        self.inner.publish(message).await?;
        if self.published.fetch_add(1, Ordering::Relaxed) + 1 == self.target {
            self.reached.notify_one();
        }
        Ok(())
    }

    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
}

async fn check_published<T: BenchTransport>(
    transport: &T,
    counted: u64,
    expected: u64,
) -> anyhow::Result<()> {
    let published = transport.published().await?;
    anyhow::ensure!(
        counted == expected && published == expected,
        "expected {expected} messages published, counted {counted}, the broker has {published}"
    );
    Ok(())
}
