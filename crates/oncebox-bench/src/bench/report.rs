//! What the benchmarks report: one JSON object (`--json`) or a short table.

use serde::Serialize;

use super::measure::{Run, TracingCost};
use super::processes::ProcessesReport;
use super::{StoreKind, TransportKind, Wake};

/// The report of any benchmark.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Report {
    /// `oncebox-bench relay`.
    Relay(RelayReport),
    /// `oncebox-bench relay --processes`.
    RelayProcesses(ProcessesReport),
    /// `oncebox-bench latency`.
    Latency(LatencyReport),
    /// `oncebox-bench consumer`.
    Consumer(ConsumerReport),
}

/// `oncebox-bench relay`: engine and baseline throughput draining the same backlog.
#[derive(Debug, Serialize)]
pub(crate) struct RelayReport {
    /// `"relay"`.
    pub(crate) bench: &'static str,
    /// The store.
    pub(crate) store: StoreKind,
    /// The transport.
    pub(crate) transport: TransportKind,
    /// Messages drained per run.
    pub(crate) messages: u64,
    /// Rows claimed per batch.
    pub(crate) batch: u32,
    /// Ordering keys.
    pub(crate) keys: u32,
    /// Best engine run.
    pub(crate) msgs_per_s: f64,
    /// Best baseline run.
    pub(crate) baseline_msgs_per_s: f64,
    /// `msgs_per_s / baseline_msgs_per_s`.
    pub(crate) ratio: f64,
    /// Best run of the engine with a Prometheus recorder.
    pub(crate) metered_msgs_per_s: f64,
    /// `metered_msgs_per_s / msgs_per_s`: the share of throughput kept with metrics on.
    pub(crate) metrics_ratio: f64,
    /// The cost of tracing (builds with the feature `otel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tracing: Option<TracingCost>,
    /// The log-tailing relay (`--mode cdc`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cdc: Option<CdcThroughput>,
    /// Every run, in the order they ran.
    pub(crate) runs: Vec<Run>,
}

/// The log-tailing relay's best runs, against the polling relay's.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct CdcThroughput {
    /// Best run on logical messages.
    pub(crate) msgs_per_s: f64,
    /// `msgs_per_s` / the polling relay's best run.
    pub(crate) ratio: f64,
    /// Best run on outbox rows.
    pub(crate) table_msgs_per_s: f64,
    /// `table_msgs_per_s` / the polling relay's best run.
    pub(crate) table_ratio: f64,
}

/// `oncebox-bench latency`: commit-to-publish latency, for each way of waking the relay.
#[derive(Debug, Serialize)]
pub(crate) struct LatencyReport {
    /// `"latency"`.
    pub(crate) bench: &'static str,
    /// The store.
    pub(crate) store: StoreKind,
    /// The transport.
    pub(crate) transport: TransportKind,
    /// Messages per second asked for.
    pub(crate) rate: u32,
    /// Seconds measured (after the warm-up).
    pub(crate) seconds: u32,
    /// One measurement per `--wake`, in the order they ran.
    pub(crate) wakes: Vec<WakeLatency>,
}

/// The latency of a relay woken one way.
#[derive(Debug, Serialize)]
pub(crate) struct WakeLatency {
    /// How the relay was woken.
    pub(crate) wake: Wake,
    /// Messages measured.
    pub(crate) messages: u64,
    /// Messages published before their producer's commit returned, counted as 0 ms: the
    /// log-tailing relay can read a commit from the WAL before the server's reply
    /// reaches the producer.
    pub(crate) early: u64,
    /// Commits per second the producer achieved (warm-up included).
    pub(crate) achieved_rate: f64,
    /// Median latency.
    pub(crate) p50_ms: f64,
    /// 99th percentile.
    pub(crate) p99_ms: f64,
    /// Largest latency.
    pub(crate) max_ms: f64,
    /// Mean latency.
    pub(crate) mean_ms: f64,
}

/// `oncebox-bench consumer`: transactional inbox and plain-transaction throughput.
#[derive(Debug, Serialize)]
pub(crate) struct ConsumerReport {
    /// `"consumer"`.
    pub(crate) bench: &'static str,
    /// The store.
    pub(crate) store: StoreKind,
    /// The transport.
    pub(crate) transport: TransportKind,
    /// Messages consumed per run.
    pub(crate) messages: u64,
    /// Consumer lanes.
    pub(crate) lanes: u32,
    /// Ordering keys.
    pub(crate) keys: u32,
    /// Best engine run.
    pub(crate) msgs_per_s: f64,
    /// Best baseline run.
    pub(crate) baseline_msgs_per_s: f64,
    /// `msgs_per_s / baseline_msgs_per_s`.
    pub(crate) ratio: f64,
    /// Deliveries that failed and were retried, over all runs (expected 0).
    pub(crate) retries: u64,
    /// The cost of tracing (builds with the feature `otel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tracing: Option<TracingCost>,
    /// Every run, in the order they ran.
    pub(crate) runs: Vec<Run>,
}

impl Report {
    /// Prints the report as a table on stdout.
    pub(crate) fn print(&self) {
        match self {
            Self::RelayProcesses(r) => r.print(),
            Self::Relay(r) => {
                println!(
                    "relay · store {} · transport {} · {} messages · batch {} · {} keys",
                    name(r.store),
                    name(r.transport),
                    r.messages,
                    r.batch,
                    r.keys
                );
                print_runs(&r.runs);
                print_comparison(r.msgs_per_s, r.baseline_msgs_per_s, r.ratio);
                println!(
                    "  metrics: metered {:.0} msg/s · engine {:.0} msg/s · ratio {:.3}",
                    r.metered_msgs_per_s, r.msgs_per_s, r.metrics_ratio
                );
                TracingCost::print(r.tracing, r.msgs_per_s);
                if let Some(cdc) = r.cdc {
                    println!(
                        "  log tailing: messages {:.0} msg/s (ratio {:.3}) · table {:.0} msg/s (ratio {:.3}) · against the engine",
                        cdc.msgs_per_s, cdc.ratio, cdc.table_msgs_per_s, cdc.table_ratio
                    );
                }
            }
            Self::Latency(r) => {
                println!(
                    "latency · store {} · transport {} · {} msg/s for {} s",
                    name(r.store),
                    name(r.transport),
                    r.rate,
                    r.seconds,
                );
                println!(
                    "  wake        achieved  messages    p50 ms    p99 ms    max ms   mean ms     early"
                );
                for w in &r.wakes {
                    println!(
                        "  {:<10} {:>9.0} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9}",
                        name(w.wake),
                        w.achieved_rate,
                        w.messages,
                        w.p50_ms,
                        w.p99_ms,
                        w.max_ms,
                        w.mean_ms,
                        w.early
                    );
                }
            }
            Self::Consumer(r) => {
                println!(
                    "consumer · store {} · transport {} · {} messages · {} lanes · {} keys",
                    name(r.store),
                    name(r.transport),
                    r.messages,
                    r.lanes,
                    r.keys
                );
                print_runs(&r.runs);
                print_comparison(r.msgs_per_s, r.baseline_msgs_per_s, r.ratio);
                TracingCost::print(r.tracing, r.msgs_per_s);
                if r.retries > 0 {
                    println!("  {} deliveries were retried", r.retries);
                }
            }
        }
    }
}

fn print_runs(runs: &[Run]) {
    println!("  round  side        msg/s   seconds");
    for run in runs {
        println!(
            "  {:>5}  {:<8} {:>9.0} {:>9.2}",
            run.round,
            run.side.name(),
            run.msgs_per_s,
            run.seconds
        );
        if !run.steps.is_empty() {
            let steps: Vec<String> = run
                .steps
                .iter()
                .map(|s| {
                    format!(
                        "{} {:.2} s ({} × {:.3} ms)",
                        s.step, s.total_s, s.calls, s.mean_ms
                    )
                })
                .collect();
            println!("                 {}", steps.join(" · "));
        }
    }
}

fn print_comparison(engine: f64, baseline: f64, ratio: f64) {
    println!("  best: engine {engine:.0} msg/s · baseline {baseline:.0} msg/s · ratio {ratio:.3}");
}

/// The name clap knows a value by.
pub(crate) fn name(value: impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_owned())
}
