//! `oncebox-bench batch`: the producer's transaction with many messages, enqueued one by
//! one against one batch.
//!
//! One producer runs `--transactions` business transactions back to back per run. Each
//! inserts one business row (the row the consumer benchmark's handler writes), enqueues
//! `--messages` messages (spread over `--keys` keys) and commits:
//!
//! - **one-by-one**: one `enqueue` per message;
//! - **batched**: one `enqueue_batch` for all of them.
//!
//! No relay runs. The sides alternate within each round (which goes first alternates
//! too), every run starts from an empty outbox, and the median run of each side is
//! reported; `ratio` is batched / one-by-one, in transactions per second.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use super::backend::Backend;
use super::measure::{Run, Side, ratio};
use super::{DEFAULT_PG_URL, StoreKind, backend, workload};

/// Flags of `oncebox-bench batch`.
#[derive(Debug, Clone, Args)]
pub(crate) struct BatchArgs {
    /// Where the outbox lives.
    #[arg(long, value_enum, default_value_t = StoreKind::Sqlite)]
    pub(crate) store: StoreKind,
    /// PostgreSQL connection URL (the run works in a schema of its own and drops it); for
    /// MySQL, a `mysql://` URL, else `ONCEBOX_MYSQL_URL`, else the local server. Ignored
    /// for SQLite, which always uses a new temporary file.
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = DEFAULT_PG_URL, hide_env_values = true)]
    pub(crate) database_url: String,
    /// Messages enqueued in each transaction.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) messages: u32,
    /// Transactions per run.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) transactions: u32,
    /// Distinct ordering keys the messages are spread over.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) keys: u32,
    /// Rounds of the two sides; the median run of each side is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `oncebox-bench batch`: producer transactions per second, one by one and batched.
#[derive(Debug, Serialize)]
pub(crate) struct BatchReport {
    /// `"batch"`.
    pub(crate) bench: &'static str,
    /// The store.
    pub(crate) store: StoreKind,
    /// Messages per transaction.
    pub(crate) messages: u32,
    /// Transactions per run.
    pub(crate) transactions: u32,
    /// Median run enqueueing one by one, transactions per second.
    pub(crate) one_by_one_tx_per_s: f64,
    /// Median run enqueueing a batch, transactions per second.
    pub(crate) batched_tx_per_s: f64,
    /// `batched_tx_per_s / one_by_one_tx_per_s`.
    pub(crate) ratio: f64,
    /// Every run, in the order they ran (`messages` and `msgs_per_s` count messages).
    pub(crate) runs: Vec<Run>,
}

/// Runs `oncebox-bench batch` on the store asked for and prints its report.
pub(crate) async fn run(args: BatchArgs) -> anyhow::Result<ExitCode> {
    let report = match args.store {
        StoreKind::Sqlite => on(backend::sqlite::SqliteBench::open().await?, &args).await?,
        StoreKind::Postgres => {
            on(
                backend::postgres::PgBench::open(&args.database_url).await?,
                &args,
            )
            .await?
        }
        #[cfg(feature = "mysql")]
        StoreKind::Mysql => {
            on(
                backend::mysql::MySqlBench::open(&args.database_url).await?,
                &args,
            )
            .await?
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    Ok(ExitCode::SUCCESS)
}

/// Measures on `backend`, then removes what the backend created, whether the run
/// succeeded, failed or was interrupted with Ctrl-C.
async fn on<B: Backend>(backend: B, args: &BatchArgs) -> anyhow::Result<BatchReport> {
    let result = tokio::select! {
        result = measure(&backend, args) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let cleanup = backend.close().await;
    match (result, cleanup) {
        (Ok(report), Ok(())) => Ok(report),
        (Ok(_), Err(error)) => Err(error.context("cleaning up after the benchmark")),
        (Err(error), cleanup) => {
            if let Err(cleanup) = cleanup {
                eprintln!("oncebox-bench: cleaning up after the failure failed too: {cleanup:#}");
            }
            Err(error)
        }
    }
}

async fn measure<B: Backend>(backend: &B, args: &BatchArgs) -> anyhow::Result<BatchReport> {
    let outbox = backend.outbox(false);
    let per_tx = u64::from(args.messages);
    let mut runs = Vec::new();
    // Message numbers run on across runs, so every message has a fresh id and the keys
    // rotate as in a steady stream.
    let mut next = 0u64;
    // One untimed transaction of each side first: connections, prepared statements.
    for batched in [false, true] {
        let (business, messages) = transaction(&mut next, per_tx, args.keys);
        backend
            .commit_many(&outbox, &business, &messages, batched)
            .await?;
    }
    for round in 1..=args.rounds {
        let sides = if round % 2 == 1 {
            [Side::OneByOne, Side::Batched]
        } else {
            [Side::Batched, Side::OneByOne]
        };
        for side in sides {
            backend.reset_outbox().await?;
            backend.reset_consumer().await?;
            let transactions: Vec<_> = (0..args.transactions)
                .map(|_| transaction(&mut next, per_tx, args.keys))
                .collect();
            let started = Instant::now();
            for (business, messages) in &transactions {
                backend
                    .commit_many(&outbox, business, messages, side == Side::Batched)
                    .await?;
            }
            let run = Run::new(
                side,
                round,
                u64::from(args.transactions) * per_tx,
                started.elapsed(),
            );
            if !args.json {
                eprintln!(
                    "  round {round} {:<10} {:>9.0} tx/s {:>10.0} msg/s  ({:.2} s)",
                    side.name(),
                    run.msgs_per_s / per_tx as f64,
                    run.msgs_per_s,
                    run.seconds
                );
            }
            runs.push(run);
        }
    }
    backend.reset_outbox().await?;
    backend.reset_consumer().await?;
    let one_by_one = median(&runs, Side::OneByOne) / per_tx as f64;
    let batched = median(&runs, Side::Batched) / per_tx as f64;
    Ok(BatchReport {
        bench: "batch",
        store: args.store,
        messages: args.messages,
        transactions: args.transactions,
        one_by_one_tx_per_s: one_by_one,
        batched_tx_per_s: batched,
        ratio: ratio(batched, one_by_one),
        runs,
    })
}

/// The business row's message and the `count` messages of the next transaction.
fn transaction(next: &mut u64, count: u64, keys: u32) -> (oncebox::Message, Vec<oncebox::Message>) {
    let business = workload::message("business", *next, keys);
    let messages = (*next..*next + count)
        .map(|n| workload::message(workload::TOPIC, n, keys))
        .collect();
    *next += count;
    (business, messages)
}

/// The median throughput of `side`'s runs in `runs` (the lower middle one of an even
/// number; 0 if it never ran).
fn median(runs: &[Run], side: Side) -> f64 {
    let mut rates: Vec<f64> = runs
        .iter()
        .filter(|run| run.side == side)
        .map(|run| run.msgs_per_s)
        .collect();
    rates.sort_by(f64::total_cmp);
    match rates.len() {
        0 => 0.0,
        n => rates[(n - 1) / 2],
    }
}

impl BatchReport {
    fn print(&self) {
        let store = serde_json::to_value(self.store)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        println!(
            "batch · store {store} · {} messages per transaction · {} transactions per run",
            self.messages, self.transactions
        );
        println!("  round  side             tx/s      msg/s   seconds");
        for run in &self.runs {
            println!(
                "  {:>5}  {:<10} {:>10.0} {:>10.0} {:>9.2}",
                run.round,
                run.side.name(),
                run.msgs_per_s / f64::from(self.messages),
                run.msgs_per_s,
                run.seconds
            );
        }
        println!(
            "  median: batched {:.0} tx/s · one-by-one {:.0} tx/s · ratio {:.2}",
            self.batched_tx_per_s, self.one_by_one_tx_per_s, self.ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn median_takes_the_middle_run_of_a_side() {
        let second = Duration::from_secs(1);
        let runs = [
            Run::new(Side::Batched, 1, 300, second),
            Run::new(Side::OneByOne, 1, 10, second),
            Run::new(Side::Batched, 2, 100, second),
            Run::new(Side::Batched, 3, 200, second),
        ];
        assert_eq!(median(&runs, Side::Batched), 200.0);
        assert_eq!(median(&runs, Side::OneByOne), 10.0);
        assert_eq!(median(&runs, Side::Engine), 0.0);
    }
}
