//! The `oncebox` command.
//!
//! - `oncebox relay` publishes an outbox table to a broker, and `oncebox receive` stores
//!   a broker's messages in a durable inbox table: long-running services for any store
//!   and broker in the build, with `/metrics`, `/healthz` and `/readyz`, stopped
//!   gracefully by SIGTERM or SIGINT.
//! - `oncebox migrate`, `outbox`, `dead-letters` and `inbox` look after the tables;
//!   `oncebox dashboard` serves them in a browser (`docs/dashboard.md`).
//! - `oncebox config check` prints the configuration they run on, secrets hidden;
//!   `oncebox doctor` checks the setup it describes, end to end.
//! - `oncebox demo` runs an order → payment system on the embedded default (SQLite and
//!   the in-process broker) under injected faults and audits every order's charges.
//!
//! The benchmarks and the chaos campaign are the team's tools, not the operator's: they
//! live in the crate `oncebox-bench`, a binary of its own.
//!
//! Exit status: 0 on success, 1 when the work failed, 2 when the configuration cannot
//! work (a bad key, an unreachable store or broker, an unusable listen address), with
//! one line on stderr naming the key or the cause; 3 when a service's stop was cut short
//! by its deadline or a second signal.
//!
//! # The library
//!
//! The command lives in this library, and the binary calls its [`main`], so that the
//! fuzz targets (`fuzz/` at the repository root) reach the configuration's decoding and
//! `oncebox-bench` runs the services as the binary does. The library is not published
//! and promises no stability; what it makes public is what `oncebox-bench` needs:
//!
//! - [`main_from`]: the whole command on a given command line (the chaos run's relays);
//! - [`Config`] with [`Overrides`] and [`ConfigError`]: the service configuration, loaded
//!   and checked as the command does;
//! - [`Database`] and [`Broker`]: the store and broker a configuration names, connected;
//! - [`stop`]: a service's graceful stop on SIGTERM and SIGINT;
//! - [`telemetry`]: logs, and the spans of the outbox hop as the services trace them.

mod admin;
mod config;
mod dashboard;
mod demo;
mod doctor;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod service;
pub mod telemetry;

pub use config::{Config, ConfigError, Overrides};
pub use service::backend::{AnyDelivery, AnySubscriber, Broker, Database};
pub use service::stop;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::LazyLock;

use clap::{Parser, Subcommand};

use telemetry::Tracing;

/// `--version`: the version, then the stores and brokers in this build.
static VERSION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}\n{}",
        env!("CARGO_PKG_VERSION"),
        service::backend::compiled_in()
    )
});

/// Effectively-once messaging: transactional outbox, inbox and idempotent receiver.
#[derive(Debug, Parser)]
#[command(name = "oncebox", version = VERSION.as_str(), about)]
struct Cli {
    #[command(flatten)]
    overrides: Overrides,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Publish the outbox table to the broker until stopped (SIGTERM or SIGINT).
    Relay,
    /// Store the broker's messages in the durable inbox table, each once, until stopped.
    Receive(service::ReceiveArgs),
    /// Create or upgrade oncebox's tables (or print their SQL).
    Migrate(admin::MigrateArgs),
    /// The configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The outbox: counts and rows.
    #[command(subcommand)]
    Outbox(admin::OutboxCommand),
    /// The outbox's dead letters: list, replay, purge.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(admin::DeadLetterCommand),
    /// The inbox tables.
    #[command(subcommand)]
    Inbox(admin::InboxCommand),
    /// Serve the web dashboard (`[dashboard]`) until stopped: what waits, what failed,
    /// and the repair of dead letters.
    Dashboard,
    /// Check the setup end to end: the store, its migrations and rights, log tailing's
    /// settings and slot, the broker and its stream, the clocks, the dashboard's token.
    Doctor(doctor::DoctorArgs),
    /// Run an order → payment system under injected faults and audit the charges.
    Demo(DemoArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Check the merged configuration (defaults < file < environment < flags) and print
    /// it as TOML, secrets hidden.
    Check,
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

/// How a command ended badly: the configuration (status 2) or the work (status 1).
#[derive(Debug)]
enum Failure {
    Config(ConfigError),
    Work(anyhow::Error),
}

impl From<ConfigError> for Failure {
    fn from(error: ConfigError) -> Self {
        Self::Config(error)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        // A configuration error raised deep in a command keeps its status.
        match error.downcast::<ConfigError>() {
            Ok(config) => Self::Config(config),
            Err(error) => Self::Work(error),
        }
    }
}

impl From<oncebox::Error> for Failure {
    fn from(error: oncebox::Error) -> Self {
        Self::Work(error.into())
    }
}

/// Runs the command line this process was started with: the binary's `main`.
pub fn main() -> ExitCode {
    main_from(std::env::args_os())
}

/// Runs the command on `args` (the program's name first, then its arguments, as
/// [`std::env::args_os`] gives them) and returns its exit status. It takes the process
/// over as the binary does: the tracing subscriber it installs stays the process's, and
/// help, a version or a bad flag print and exit.
pub fn main_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    // The demo takes its own flags, not the service configuration.
    let config = match cli.command {
        Command::Demo(_) => None,
        _ => match Config::load(&cli.overrides) {
            Ok(config) => Some(config),
            Err(error) => return configuration_error(&error),
        },
    };
    // The services report what they do, and export spans where configured; the one-shot
    // commands report only errors.
    let telemetry = match (&cli.command, &config) {
        (Command::Relay, Some(config)) => {
            telemetry::init("info", Tracing::Services(config, "oncebox-relay"))
        }
        (Command::Receive(_), Some(config)) => {
            telemetry::init("info", Tracing::Services(config, "oncebox-receive"))
        }
        (Command::Dashboard, _) => telemetry::init("info", Tracing::Off),
        _ => telemetry::init("error", Tracing::Off),
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
            eprintln!("oncebox: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli, config));
    // A stop cut short leaves work on blocking threads (a Kafka client's flush): exit
    // without waiting for it.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    // The last spans are exported outside the runtime.
    drop(telemetry);
    match result {
        Ok(code) => code,
        Err(Failure::Config(error)) => configuration_error(&error),
        Err(Failure::Work(error)) => {
            eprintln!("oncebox: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Reports a configuration that cannot work: one line, status 2.
fn configuration_error(error: &ConfigError) -> ExitCode {
    eprintln!("oncebox: configuration: {error}");
    ExitCode::from(2)
}

async fn run(cli: Cli, config: Option<Config>) -> Result<ExitCode, Failure> {
    let command = match cli.command {
        Command::Demo(args) => {
            let config = demo::DemoConfig {
                orders: args.orders,
                seed: args.seed.unwrap_or_else(|| fastrand::u64(..)),
                db: args.db,
                json: args.json,
            };
            return Ok(demo::run(config).await?);
        }
        command => command,
    };
    let Some(config) = config else {
        unreachable!("main loads the configuration of every command but demo")
    };
    let code = match command {
        Command::Relay => service::relay(&config).await?,
        Command::Receive(args) => service::receive(&config, &args).await?,
        Command::Migrate(args) => admin::migrate(&config, &args).await?,
        Command::Config(ConfigCommand::Check) => {
            print!("{}", config.to_toml());
            ExitCode::SUCCESS
        }
        Command::Outbox(command) => admin::outbox(&config, command).await?,
        Command::DeadLetters(command) => admin::dead_letters(&config, command).await?,
        Command::Inbox(command) => admin::inbox(&config, command).await?,
        Command::Dashboard => dashboard::run(&config).await?,
        Command::Doctor(args) => doctor::doctor(&config, &args).await?,
        Command::Demo(_) => unreachable!("handled above"),
    };
    Ok(code)
}
