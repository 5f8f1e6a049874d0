//! `oncebox-bench latency`: commit-to-publish latency at a fixed rate.
//!
//! A producer commits one message per transaction on an open-loop schedule (message `i`
//! is due at `t0 + i / rate`, however long earlier commits take: slow commits overlap)
//! and notes the instant each commit returned. A relay runs beside it, woken by the
//! store's notification or polling, or tailing PostgreSQL's log (`--wake cdc`: the
//! producer emits logical messages; `cdc-table`: it inserts outbox rows); a subscriber of the in-process broker notes the instant each message
//! arrives. Latency is arrival minus commit, in the same process. The first second is a
//! warm-up and is not counted. Each `--wake` asked for is measured in turn, in the same
//! run.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use oncebox::memory::{MemoryBroker, MemoryPublisher, MemorySubscriber};
use oncebox::postgres::cdc::CdcMode;
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::{Delivery, MessageId, Subscriber};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::backend::Backend;
use super::measure::{millis, per_second, percentile};
use super::report::{LatencyReport, WakeLatency};
use super::{LatencyArgs, Wake, workload};

/// Warm-up before measuring.
const WARMUP: Duration = Duration::from_secs(1);

/// How long after the last commit every message must have arrived.
const DRAIN: Duration = Duration::from_secs(10);

/// The relay's poll interval when it is woken by notification: a fallback only.
const NOTIFY_FALLBACK_POLL: Duration = Duration::from_secs(1);

/// Ordering keys the messages are spread over.
const KEYS: u32 = 1000;

/// Most commits under way at once when commits are slower than the rate.
const MAX_IN_FLIGHT: usize = 64;

/// Runs the latency benchmark on `backend`, once for each way of waking the relay asked
/// for, one after the other.
pub(crate) async fn run<B: Backend>(
    backend: &B,
    args: &LatencyArgs,
) -> anyhow::Result<LatencyReport> {
    let mut wakes = Vec::with_capacity(args.wake.len());
    for &wake in &args.wake {
        wakes.push(run_one(backend, args, wake).await?);
    }
    Ok(LatencyReport {
        bench: "latency",
        store: args.common.store,
        transport: args.common.transport,
        rate: args.rate,
        seconds: args.seconds,
        wakes,
    })
}

/// One measurement: a relay woken by `wake` beside a producer at `args.rate`.
async fn run_one<B: Backend>(
    backend: &B,
    args: &LatencyArgs,
    wake: Wake,
) -> anyhow::Result<WakeLatency> {
    backend.reset_outbox().await?;
    let broker = MemoryBroker::new();
    let subscriber = broker.subscribe(workload::TOPIC, "latency");
    let (stop_relay, relay_stopped) = watch::channel(false);
    let relay = spawn_relay(backend, args, wake, broker.publisher(), relay_stopped).await?;

    let rate = u64::from(args.rate);
    let total = rate * (WARMUP.as_secs() + u64::from(args.seconds));
    let expected = usize::try_from(total)?;
    let (stop_collecting, collecting_stopped) = watch::channel(false);
    let mut arrivals = Task(tokio::spawn(collect(
        subscriber,
        expected,
        collecting_stopped,
    )));

    // Let the relay reach its first wait before the first commit.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let measured_from = start + WARMUP;
    let commits = produce(backend, wake, start, rate, total).await?;
    let produced = start.elapsed();

    let arrivals = match tokio::time::timeout(DRAIN, &mut arrivals.0).await {
        Ok(joined) => joined,
        Err(_) => {
            let _ = stop_collecting.send(true);
            (&mut arrivals.0).await
        }
    }
    .context("the subscriber task failed")??;
    let _ = stop_relay.send(true);
    relay.join().await.context("the relay task failed")??;
    if let (Some(pg), Wake::Cdc | Wake::CdcTable) = (backend.postgres(), wake) {
        pg.drop_cdc().await?;
    }

    let mut samples = Vec::with_capacity(commits.len());
    let (mut missing, mut early) = (0u64, 0u64);
    for (id, due, committed) in &commits {
        if *due < measured_from {
            continue;
        }
        match arrivals.get(id) {
            Some(arrived) => {
                early += u64::from(arrived < committed);
                samples.push(arrived.saturating_duration_since(*committed));
            }
            None => missing += 1,
        }
    }
    anyhow::ensure!(
        missing == 0,
        "{missing} measured messages were not published within {DRAIN:?} of the last commit"
    );
    samples.sort_unstable();
    let at = |p: f64| percentile(&samples, p).map_or(0.0, millis);
    let mean = if samples.is_empty() {
        0.0
    } else {
        samples.iter().map(|d| millis(*d)).sum::<f64>() / samples.len() as f64
    };
    backend.reset_outbox().await?;
    Ok(WakeLatency {
        wake,
        messages: samples.len() as u64,
        early,
        achieved_rate: per_second(total, produced),
        p50_ms: at(50.0),
        p99_ms: at(99.0),
        max_ms: at(100.0),
        mean_ms: mean,
    })
}

/// Starts the relay `wake` names, publishing to `publisher` until `stop`: the polling
/// relay (woken by notification or not), or the log-tailing relay (PostgreSQL only),
/// which is streaming from its new slot when this returns.
async fn spawn_relay<B: Backend>(
    backend: &B,
    args: &LatencyArgs,
    wake: Wake,
    publisher: MemoryPublisher,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Task<oncebox::Result<()>>> {
    let mode = match wake {
        Wake::Notify | Wake::Poll => {
            let options = match wake {
                Wake::Notify => {
                    SpoolOptions::new().poll_interval(NOTIFY_FALLBACK_POLL, NOTIFY_FALLBACK_POLL)
                }
                _ => SpoolOptions::new(),
            }
            .name("bench-latency")
            .batch_size(args.batch as usize);
            let relay = Relay::new(backend.outbox(wake == Wake::Notify), publisher, options)?;
            return Ok(Task(tokio::spawn(async move {
                relay.run_until(stopped(stop)).await
            })));
        }
        Wake::Cdc => CdcMode::Messages,
        Wake::CdcTable => CdcMode::Table,
    };
    let pg = backend
        .postgres()
        .context("--wake cdc and cdc-table need --store postgres")?;
    let relay = pg.cdc_relay(mode, publisher).await?;
    let task = Task(tokio::spawn(
        async move { relay.run_until(stopped(stop)).await },
    ));
    pg.wait_streaming().await?;
    Ok(task)
}

/// Commits `total` messages, message `i` at `start + i / rate`, each in a transaction
/// of its own, as the producers of the relay `wake` names do; a commit that is slow does
/// not hold back the next ones (up to [`MAX_IN_FLIGHT`] at once). Returns each message's
/// id, due time and the instant its commit returned.
async fn produce<B: Backend>(
    backend: &B,
    wake: Wake,
    start: Instant,
    rate: u64,
    total: u64,
) -> anyhow::Result<Vec<(MessageId, Instant, Instant)>> {
    let notify = wake == Wake::Notify;
    let outbox = backend.outbox(notify);
    let outbox = &outbox;
    let commit = |i: u64, due: Instant| async move {
        let message = workload::message(workload::TOPIC, i, KEYS);
        match (wake, backend.postgres()) {
            (Wake::Cdc, Some(pg)) => pg.emit_one(&message).await,
            _ => backend.commit_one(outbox, &message, notify).await,
        }
        .context("committing a message")?;
        anyhow::Ok((message.id, due, Instant::now()))
    };
    let mut commits = Vec::with_capacity(usize::try_from(total)?);
    let mut in_flight = FuturesUnordered::new();
    let mut next: u64 = 0;
    loop {
        let due = start + Duration::from_nanos(next.saturating_mul(1_000_000_000) / rate);
        let can_send = next < total && in_flight.len() < MAX_IN_FLIGHT;
        tokio::select! {
            biased;
            Some(done) = in_flight.next(), if !in_flight.is_empty() => commits.push(done?),
            () = tokio::time::sleep_until(due), if can_send => {
                in_flight.push(commit(next, due));
                next += 1;
            }
            else => break,
        }
    }
    Ok(commits)
}

/// Receives until `expected` distinct messages arrived (or `stop`), noting when each
/// first arrived.
async fn collect(
    mut subscriber: MemorySubscriber,
    expected: usize,
    mut stop: watch::Receiver<bool>,
) -> oncebox::Result<HashMap<MessageId, Instant>> {
    let mut arrivals = HashMap::with_capacity(expected);
    while arrivals.len() < expected {
        let delivery = tokio::select! {
            delivery = subscriber.next() => delivery?,
            _ = stop.changed() => break,
        };
        let arrived = Instant::now();
        if let Some(id) = delivery.received().id {
            arrivals.entry(id).or_insert(arrived);
        }
        delivery.ack().await?;
    }
    Ok(arrivals)
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// A spawned task that is aborted if dropped before it is joined (when the benchmark
/// fails half-way).
struct Task<T>(JoinHandle<T>);

impl<T> Task<T> {
    async fn join(mut self) -> Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
