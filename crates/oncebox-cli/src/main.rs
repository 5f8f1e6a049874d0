//! The `oncebox` command.
//!
//! `oncebox demo` runs an order → payment system on the embedded default (SQLite and the
//! in-process broker) under injected crashes, duplicates, delays and a broker outage,
//! and ends with an audit of every order's charges.
//!
//! `oncebox bench` measures the engines against baselines doing the same work without
//! them (`relay`, `latency`, `consumer`, `http`, `dedup`).

mod bench;
mod demo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Effectively-once messaging: transactional outbox, inbox and idempotent receiver.
#[derive(Debug, Parser)]
#[command(name = "oncebox", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an order → payment system under injected faults and audit the charges.
    Demo(DemoArgs),
    /// Benchmark the relay, its latency, the inbox, the HTTP layer and the dedup stores
    /// against baselines without them.
    Bench(bench::BenchArgs),
}

/// Flags of `oncebox demo`.
#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Number of orders to place.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    orders: u32,
    /// Seed of the order data and the fault plan (timing still varies from run to run).
    #[arg(long)]
    seed: Option<u64>,
    /// SQLite database file (default: a new temporary file, removed afterwards).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Print one JSON object with the audit on stdout instead of a report.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("oncebox: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => {
                let config = demo::DemoConfig {
                    orders: args.orders,
                    seed: args.seed.unwrap_or_else(|| fastrand::u64(..)),
                    db: args.db,
                    json: args.json,
                };
                demo::run(config).await
            }
            Command::Bench(args) => bench::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("oncebox: {error:#}");
            ExitCode::FAILURE
        }
    }
}
