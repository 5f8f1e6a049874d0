//! `oncebox-bench`: the team's tools beside the `oncebox` command, kept out of the binary
//! operators run.
//!
//! - `oncebox-bench relay`, `latency`, `consumer`, `http`, `dedup`, `enqueue`, `batch` and
//!   `admin` measure the engines, each against a baseline that does the same work without
//!   them, in the same run (`docs/benchmarks.md`).
//! - `oncebox-bench chaos` runs the order → payment system of `oncebox demo` as real relay
//!   and payment processes on PostgreSQL and a broker, under a seeded plan of faults, and
//!   audits the charges (`docs/chaos.md`). Its relays are the `oncebox` command, run from
//!   this binary (`oncebox-bench oncebox relay …`, hidden): the same library and `main`
//!   as the shipped binary, built with this one, so a run always exercises the code
//!   beside it. Its payment processes are `oncebox-bench chaos-payments` (hidden).
//!
//! Exit status: 0 when the run passed, 1 when it failed, 2 when the configuration of a
//! payment process cannot work, with one line on stderr.

mod bench;
mod chaos;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oncebox_cli::telemetry::Tracing;
use oncebox_cli::{Config, ConfigError};

/// Benchmarks of oncebox's engines against baselines, and the chaos campaign.
#[derive(Debug, Parser)]
#[command(name = "oncebox-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Bench(bench::BenchCommand),
    /// Run the order → payment system as real relay and payment processes on PostgreSQL
    /// and a broker, under a seeded plan of kills, pauses, cut connections and restarts,
    /// and audit the charges.
    Chaos(chaos::ChaosArgs),
    /// The payment process of `oncebox-bench chaos` (started by it).
    #[command(hide = true, name = "chaos-payments")]
    ChaosPayments(chaos::PaymentsArgs),
    /// The `oncebox` command, as its binary runs it (the relays of `oncebox-bench chaos`).
    #[command(hide = true, disable_help_flag = true)]
    Oncebox {
        /// The command's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    if let Command::Oncebox { args } = command {
        return oncebox_cli::main_from(std::iter::once(OsString::from("oncebox")).chain(args));
    }
    // A payment process runs on the service configuration, as `oncebox receive` does.
    let config = match &command {
        Command::ChaosPayments(args) => match Config::load(args.overrides()) {
            Ok(config) => Some(config),
            Err(error) => return configuration_error(&error),
        },
        _ => None,
    };
    let telemetry = match (&command, &config) {
        (Command::Bench(_), _) => bench::init_spans(),
        (Command::ChaosPayments(_), Some(config)) => oncebox_cli::telemetry::init(
            "info",
            Tracing::Services(config, "oncebox-chaos-payments"),
        ),
        _ => oncebox_cli::telemetry::init("error", Tracing::Off),
    };
    let telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => return configuration_error(&error),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("oncebox-bench: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Bench(command) => bench::run(command).await,
            Command::Chaos(args) => chaos::run(args).await,
            Command::ChaosPayments(args) => match &config {
                Some(config) => chaos::payments(config, &args).await,
                None => unreachable!("main loads the configuration of a payment process"),
            },
            Command::Oncebox { .. } => unreachable!("handled above"),
        }
    });
    // A stop cut short leaves work on blocking threads (a Kafka client's flush): exit
    // without waiting for it.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    drop(telemetry);
    match result {
        Ok(code) => code,
        Err(error) => match error.downcast_ref::<ConfigError>() {
            Some(error) => configuration_error(error),
            None => {
                eprintln!("oncebox-bench: {error:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Reports a configuration that cannot work: one line, status 2.
fn configuration_error(error: &ConfigError) -> ExitCode {
    eprintln!("oncebox-bench: configuration: {error}");
    ExitCode::from(2)
}
