//! Measurement helpers: throughput of a timed run, the best run of each side, exact
//! percentiles.

use std::time::Duration;

use serde::Serialize;

use super::probe::Step;

/// Which side of a comparison a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Side {
    /// The same work without the engine.
    Baseline,
    /// The engine.
    Engine,
    /// The engine with a Prometheus recorder receiving its metrics (`oncebox-bench relay`).
    Metered,
    /// The engine with its spans built and handed to an OpenTelemetry exporter that
    /// drops them (builds with the feature `otel`).
    Traced,
    /// The log-tailing relay reading logical messages (`oncebox-bench relay --mode cdc`).
    Cdc,
    /// The log-tailing relay reading outbox rows (`oncebox-bench relay --mode cdc`).
    #[serde(rename = "cdc-table")]
    CdcTable,
    /// A business transaction alone (`oncebox-bench enqueue`).
    Bare,
    /// A business transaction with an outbox row (`oncebox-bench enqueue`).
    Row,
    /// A business transaction with a logical decoding message (`oncebox-bench enqueue`).
    Message,
    /// A business transaction with its messages enqueued one by one
    /// (`oncebox-bench batch`).
    #[serde(rename = "one-by-one")]
    OneByOne,
    /// A business transaction with its messages enqueued in one batch
    /// (`oncebox-bench batch`).
    Batched,
}

impl Side {
    /// The side's name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Engine => "engine",
            Self::Metered => "metered",
            Self::Traced => "traced",
            Self::Cdc => "cdc",
            Self::CdcTable => "cdc-table",
            Self::Bare => "bare",
            Self::Row => "row",
            Self::Message => "message",
            Self::OneByOne => "one-by-one",
            Self::Batched => "batched",
        }
    }

    /// `sides`, then [`Side::Traced`] where the build can trace.
    pub(crate) fn with_traced(sides: &[Self]) -> Vec<Self> {
        let mut sides = sides.to_vec();
        if super::spans::can_trace() {
            sides.push(Self::Traced);
        }
        sides
    }
}

/// The cost of tracing: the traced side against the engine untraced.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct TracingCost {
    /// Best traced run.
    pub(crate) traced_msgs_per_s: f64,
    /// `traced_msgs_per_s` / the best untraced engine run: the share of throughput kept.
    pub(crate) ratio: f64,
}

impl TracingCost {
    /// The cost in `runs`, `None` if no traced run is among them.
    pub(crate) fn of(runs: &[Run]) -> Option<Self> {
        let traced = best(runs, Side::Traced);
        let engine = best(runs, Side::Engine);
        (traced > 0.0 && engine > 0.0).then(|| Self {
            traced_msgs_per_s: traced,
            ratio: traced / engine,
        })
    }

    /// Prints the line of a report.
    pub(crate) fn print(cost: Option<Self>, engine: f64) {
        if let Some(cost) = cost {
            println!(
                "  tracing: traced {:.0} msg/s · engine {:.0} msg/s · ratio {:.3}",
                cost.traced_msgs_per_s, engine, cost.ratio
            );
        }
    }
}

/// One timed run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Run {
    /// Baseline or engine.
    pub(crate) side: Side,
    /// Which baseline/engine pair it belongs to, from 1.
    pub(crate) round: u32,
    /// Messages processed.
    pub(crate) messages: u64,
    /// Wall-clock time of the run, in seconds.
    pub(crate) seconds: f64,
    /// `messages / seconds`.
    pub(crate) msgs_per_s: f64,
    /// Where the time went, by step (see [`Probe`](super::probe::Probe)).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) steps: Vec<Step>,
}

impl Run {
    /// A run of `side` that processed `messages` in `elapsed`.
    pub(crate) fn new(side: Side, round: u32, messages: u64, elapsed: Duration) -> Self {
        Self {
            side,
            round,
            messages,
            seconds: elapsed.as_secs_f64(),
            msgs_per_s: per_second(messages, elapsed),
            steps: Vec::new(),
        }
    }

    /// The run with the time spent in each step.
    pub(crate) fn with_steps(mut self, steps: Vec<Step>) -> Self {
        self.steps = steps;
        self
    }
}

/// The best throughput of each side and their ratio.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Comparison {
    /// Best engine run, messages per second.
    pub(crate) engine: f64,
    /// Best baseline run, messages per second.
    pub(crate) baseline: f64,
    /// `engine / baseline` (0 if the baseline never ran).
    pub(crate) ratio: f64,
}

/// The best throughput of `side`'s runs in `runs` (0 if it never ran).
pub(crate) fn best(runs: &[Run], side: Side) -> f64 {
    highest(runs, |run| (run.side == side).then_some(run.msgs_per_s))
}

/// The highest of the rates `rate` reads from `runs`, skipping the runs it gives none
/// (0 if it gives none at all).
pub(crate) fn highest<T>(runs: &[T], rate: impl Fn(&T) -> Option<f64>) -> f64 {
    runs.iter().filter_map(rate).fold(0.0, f64::max)
}

/// `part / whole`, 0 if `whole` never ran (is not positive).
pub(crate) fn ratio(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

impl Comparison {
    /// Compares the best run of each side in `runs`.
    pub(crate) fn best_of(runs: &[Run]) -> Self {
        let engine = best(runs, Side::Engine);
        let baseline = best(runs, Side::Baseline);
        Self {
            engine,
            baseline,
            ratio: ratio(engine, baseline),
        }
    }
}

/// `count` per second of `elapsed` (0 for an empty interval).
pub(crate) fn per_second(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// The exact `p`-th percentile (nearest rank) of `sorted`, which is sorted ascending:
/// the smallest sample that at least `p` % of the samples do not exceed.
/// `None` for no samples.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    sorted.get(index).copied()
}

/// A duration in milliseconds, with its fraction.
pub(crate) fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(
            percentile(&samples, 100.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(percentile(&samples, 0.0), Some(Duration::from_millis(1)));
        let three = ms(&[10, 20, 30]);
        assert_eq!(percentile(&three, 50.0), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&three, 99.0), Some(Duration::from_millis(30)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn comparison_takes_the_best_run_of_each_side() {
        let second = Duration::from_secs(1);
        let runs = [
            Run::new(Side::Baseline, 1, 100, second),
            Run::new(Side::Engine, 1, 60, second),
            Run::new(Side::Baseline, 2, 80, second),
            Run::new(Side::Engine, 2, 75, second),
        ];
        let c = Comparison::best_of(&runs);
        assert_eq!((c.engine, c.baseline), (75.0, 100.0));
        assert!((c.ratio - 0.75).abs() < 1e-9);
        assert_eq!(Comparison::best_of(&runs[1..2]).ratio, 0.0);
        assert_eq!(per_second(10, Duration::ZERO), 0.0);
        assert_eq!(per_second(10, Duration::from_millis(500)), 20.0);
    }
}
