//! `oncebox-bench enqueue`: what the outbox costs the producer on PostgreSQL, as an
//! outbox row against a logical decoding message.
//!
//! `--producers` connections run business transactions back to back, `--messages` of
//! them per run. Each inserts one business row (the row the consumer benchmark's handler
//! writes), enqueues one message and commits, with the server's own `synchronous_commit`
//! as an application's transaction would:
//!
//! - **row**: the message as an outbox row ([`PgOutbox::enqueue`]), what the polling
//!   relay and the log-tailing relay's table mode read;
//! - **message**: the message as a transactional logical decoding message
//!   ([`PgMessageOutbox::enqueue`]), the log-tailing relay's message mode;
//! - **bare**: the business row alone, the floor both are measured against.
//!
//! No relay runs: this is the producer's side alone. The sides alternate within each
//! round, every run starts from empty tables, and the best run of each side is reported;
//! `ratio` is message / row.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context as _;
use clap::Args;
use oncebox::postgres::PgOutbox;
use oncebox::postgres::cdc::PgMessageOutbox;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};
use tokio::task::JoinSet;

use super::backend::Backend as _;
use super::backend::postgres::PgBench;
use super::backend::redact;
use super::measure::{Run, Side, best, ratio};
use super::workload;

/// Ordering keys the messages are spread over.
const KEYS: u32 = 1000;

/// Flags of `oncebox-bench enqueue`.
#[derive(Debug, Clone, Args)]
pub(crate) struct EnqueueArgs {
    /// PostgreSQL connection URL (the run works in a schema of its own and drops it).
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = super::DEFAULT_PG_URL, hide_env_values = true)]
    pub(crate) database_url: String,
    /// Business transactions per run.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) messages: u64,
    /// Concurrent producers, each on a connection of its own.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) producers: u32,
    /// Rounds of the three sides; the best run of each side is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `oncebox-bench enqueue`: business transactions per second with each outbox.
#[derive(Debug, Serialize)]
pub(crate) struct EnqueueReport {
    /// `"enqueue"`.
    pub(crate) bench: &'static str,
    /// Transactions per run.
    pub(crate) messages: u64,
    /// Concurrent producers.
    pub(crate) producers: u32,
    /// Best run with an outbox row, transactions per second.
    pub(crate) row_tx_per_s: f64,
    /// Best run with a logical message.
    pub(crate) message_tx_per_s: f64,
    /// Best run with the business row alone.
    pub(crate) bare_tx_per_s: f64,
    /// `message_tx_per_s / row_tx_per_s`.
    pub(crate) ratio: f64,
    /// Every run, in the order they ran.
    pub(crate) runs: Vec<Run>,
}

/// Runs `oncebox-bench enqueue` and prints its report.
pub(crate) async fn run(args: EnqueueArgs) -> anyhow::Result<ExitCode> {
    let bench = PgBench::open(&args.database_url).await?;
    let result = tokio::select! {
        result = measure(&bench, &args) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let cleanup = bench.close().await;
    let report = match (result, cleanup) {
        (Ok(report), Ok(())) => report,
        (Ok(_), Err(error)) => return Err(error.context("cleaning up after the benchmark")),
        (Err(error), cleanup) => {
            if let Err(cleanup) = cleanup {
                eprintln!("oncebox-bench: cleaning up after the failure failed too: {cleanup:#}");
            }
            return Err(error);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(bench: &PgBench, args: &EnqueueArgs) -> anyhow::Result<EnqueueReport> {
    let pool = PgPoolOptions::new()
        .max_connections(args.producers)
        .min_connections(args.producers)
        .connect(&args.database_url)
        .await
        .with_context(|| format!("connecting to PostgreSQL at {}", redact(&args.database_url)))?;
    let producer = Producer {
        pool,
        outbox: bench.store().outbox(),
        message_outbox: bench.store().message_outbox(),
        insert: bench.business_insert(),
    };
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        for side in [Side::Bare, Side::Row, Side::Message] {
            bench.reset_outbox().await?;
            bench.reset_consumer().await?;
            let started = Instant::now();
            producer.produce(side, args).await?;
            let run = Run::new(side, round, args.messages, started.elapsed());
            if !args.json {
                eprintln!(
                    "  round {round} {:<8} {:>10.0} tx/s  ({:.2} s)",
                    side.name(),
                    run.msgs_per_s,
                    run.seconds
                );
            }
            runs.push(run);
        }
    }
    bench.reset_outbox().await?;
    bench.reset_consumer().await?;
    producer.pool.close().await;
    let row = best(&runs, Side::Row);
    let message = best(&runs, Side::Message);
    Ok(EnqueueReport {
        bench: "enqueue",
        messages: args.messages,
        producers: args.producers,
        row_tx_per_s: row,
        message_tx_per_s: message,
        bare_tx_per_s: best(&runs, Side::Bare),
        ratio: ratio(message, row),
        runs,
    })
}

/// What a producer's transaction needs, cloned into each producer task.
#[derive(Clone)]
struct Producer {
    pool: PgPool,
    outbox: PgOutbox,
    message_outbox: PgMessageOutbox,
    /// The business row's insert: `$1` message id, `$2` key, `$3` payload.
    insert: Arc<str>,
}

impl Producer {
    /// Runs `args.messages` transactions of `side` on `args.producers` tasks.
    async fn produce(&self, side: Side, args: &EnqueueArgs) -> anyhow::Result<()> {
        let next = Arc::new(AtomicU64::new(0));
        let mut producers = JoinSet::new();
        for _ in 0..args.producers {
            let (producer, next, total) = (self.clone(), Arc::clone(&next), args.messages);
            producers.spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= total {
                        return anyhow::Ok(());
                    }
                    producer.transaction(side, n).await?;
                }
            });
        }
        while let Some(done) = producers.join_next().await {
            done.context("a producer task failed")??;
        }
        Ok(())
    }

    /// Business transaction number `n`.
    async fn transaction(&self, side: Side, n: u64) -> anyhow::Result<()> {
        let message = workload::message(workload::TOPIC, n, KEYS);
        let mut tx = self.pool.begin().await?;
        sqlx::query(AssertSqlSafe(Arc::clone(&self.insert)))
            .bind(message.id.to_string())
            .bind(message.key.as_deref())
            .bind(message.payload.as_ref())
            .execute(&mut *tx)
            .await
            .context("inserting the business row")?;
        match side {
            Side::Row => self.outbox.enqueue(&mut tx, &message).await?,
            Side::Message => self.message_outbox.enqueue(&mut tx, &message).await?,
            _ => {}
        }
        tx.commit().await?;
        Ok(())
    }
}

impl EnqueueReport {
    fn print(&self) {
        println!(
            "enqueue · store postgres · {} transactions · {} producers",
            self.messages, self.producers
        );
        println!("  round  side         tx/s   seconds");
        for run in &self.runs {
            println!(
                "  {:>5}  {:<8} {:>9.0} {:>9.2}",
                run.round,
                run.side.name(),
                run.msgs_per_s,
                run.seconds
            );
        }
        println!(
            "  best: message {:.0} tx/s · row {:.0} tx/s · ratio {:.3} · bare {:.0} tx/s",
            self.message_tx_per_s, self.row_tx_per_s, self.ratio, self.bare_tx_per_s
        );
    }
}
