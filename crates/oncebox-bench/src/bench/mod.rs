//! The benchmarks of the engines, each measured against a baseline that does the same
//! work without the engine, in the same run.
//!
//! - `oncebox-bench relay`: drain a pre-filled outbox with the relay, against a plain loop
//!   of one claim-and-delete statement per batch publishing with the broker's own client
//!   (`--transport memory|nats|rabbitmq|kafka|redis`, the brokers behind this crate's
//!   cargo features of the same names, Redis's as `redis-streams`); `--mode cdc` adds the
//!   log-tailing relay on PostgreSQL.
//! - `oncebox-bench latency`: commit-to-publish latency at a fixed rate, woken by
//!   notification, by polling or by tailing PostgreSQL's log, several in the same run.
//! - `oncebox-bench enqueue`: the producer's business transaction with an outbox row,
//!   against the same with a logical decoding message (PostgreSQL).
//! - `oncebox-bench batch`: the producer's business transaction with many messages,
//!   enqueued one by one against one batch (`--store sqlite|postgres|mysql`).
//! - `oncebox-bench consumer`: the transactional inbox against the same handler in a
//!   plain transaction, through the same consumer lanes and broker.
//! - `oncebox-bench admin`: the dashboard's reads (pages of rows, filtered, at every
//!   depth) of a PostgreSQL outbox of millions of rows, timed on their own (there is no
//!   baseline).
//!
//! Every run isolates itself (a new SQLite file in a temporary directory, or a new
//! PostgreSQL schema) and removes what it created at the end, on error and on Ctrl-C
//! too. Baseline and engine runs alternate, and the best run of each side is reported, so
//! that a noisy neighbour does not decide the ratio; every run is listed in the report.

mod admin;
mod backend;
mod batch;
mod consumer;
mod dedup;
mod enqueue;
mod http;
mod latency;
mod measure;
mod probe;
mod processes;
mod relay;
mod report;
mod spans;
mod transport;
mod workload;

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use anyhow::Context as _;
use backend::Backend;
pub(crate) use backend::redact;
use report::Report;
pub(crate) use spans::init as init_spans;
use transport::BenchTransport;

/// Runs `work` traced when `side` is [`Side::Traced`](measure::Side::Traced), untraced
/// otherwise.
async fn traced<F: std::future::Future>(side: measure::Side, work: F) -> F::Output {
    #[cfg(feature = "otel")]
    return spans::traced(side == measure::Side::Traced, work).await;
    #[cfg(not(feature = "otel"))]
    {
        let _ = side;
        work.await
    }
}

/// After a run of `side`: when it was traced, checks that its spans reached the exporter
/// (`exported` is [`spans::exported`] before it).
fn ensure_traced(side: measure::Side, exported: u64) -> anyhow::Result<()> {
    if side == measure::Side::Traced {
        let now = spans::exported();
        anyhow::ensure!(now > exported, "the traced run exported no spans");
    }
    Ok(())
}

/// The PostgreSQL server used when neither `--database-url` nor `ONCEBOX_PG_URL` is set.
pub(crate) const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Relay throughput draining a pre-filled outbox, against a raw claim-and-delete loop.
    Relay(RelayArgs),
    /// Commit-to-publish latency at a fixed message rate.
    Latency(LatencyArgs),
    /// Transactional inbox throughput, against the same handler without deduplication.
    Consumer(ConsumerArgs),
    /// Requests/s through the Idempotency-Key layer, against the bare handler.
    Http(http::HttpArgs),
    /// Dedup store begin+complete cycles and duplicate checks per second.
    Dedup(dedup::DedupArgs),
    /// Producer transactions per second on PostgreSQL with an outbox row, against the
    /// same with a logical decoding message.
    Enqueue(enqueue::EnqueueArgs),
    /// Producer transactions per second with many messages each, enqueued one by one
    /// against one batch.
    Batch(batch::BatchArgs),
    /// The dashboard's listing of a PostgreSQL outbox of millions of rows: pages at every
    /// depth, with each filter.
    Admin(admin::AdminArgs),
}

/// Where the outbox and inbox live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StoreKind {
    /// SQLite, in a new file in a temporary directory.
    Sqlite,
    /// PostgreSQL, in a new schema of the `--database-url` database.
    Postgres,
    /// MySQL or MariaDB, in a new database on the `--database-url` server.
    #[cfg(feature = "mysql")]
    Mysql,
}

/// The broker messages go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TransportKind {
    /// The in-process broker.
    Memory,
    /// NATS JetStream (`--broker-url`, else `ONCEBOX_NATS_URL`, else the local server).
    #[cfg(feature = "nats")]
    Nats,
    /// RabbitMQ (`--broker-url`, else `ONCEBOX_AMQP_URL`, else the local server).
    #[cfg(feature = "rabbitmq")]
    Rabbitmq,
    /// Kafka (`--broker-url` as a broker list, else `ONCEBOX_KAFKA_BROKERS`, else
    /// 127.0.0.1:9092).
    #[cfg(feature = "kafka")]
    Kafka,
    /// Redis Streams (`--broker-url`, else `ONCEBOX_REDIS_URL`, else the local server).
    #[cfg(feature = "redis-streams")]
    Redis,
    /// Amazon SQS, a FIFO queue (`--broker-url` as the endpoint, else
    /// `ONCEBOX_SQS_ENDPOINT`, else the local server on port 4566).
    #[cfg(feature = "sqs")]
    Sqs,
}

/// How the relay learns of new messages in `oncebox-bench latency`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Wake {
    /// The producer wakes the relay at commit (PostgreSQL `NOTIFY`, or the in-process
    /// wake-up for SQLite); the relay polls only once a second as a fallback.
    Notify,
    /// The relay polls with its default adaptive interval (10 ms to 1 s).
    Poll,
    /// The log-tailing relay (PostgreSQL only), reading the logical messages the
    /// producer emits instead of writing outbox rows.
    Cdc,
    /// The log-tailing relay (PostgreSQL only), reading the producer's outbox rows as
    /// they are inserted, and deleting them once published.
    CdcTable,
}

/// The relays `oncebox-bench relay` compares with its baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RelayMode {
    /// The polling relay, bare, metered and (builds with `otel`) traced.
    Poll,
    /// The same, then the log-tailing relay on logical messages and on outbox rows
    /// (PostgreSQL only).
    Cdc,
}

/// Flags every benchmark takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct CommonArgs {
    /// Where the outbox and inbox live.
    #[arg(long, value_enum, default_value_t = StoreKind::Sqlite)]
    pub(crate) store: StoreKind,
    /// The broker messages go through.
    #[arg(long, value_enum, default_value_t = TransportKind::Memory)]
    pub(crate) transport: TransportKind,
    /// PostgreSQL connection URL (the run works in a schema of its own and drops it).
    /// Ignored for SQLite, which always uses a new temporary file.
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = DEFAULT_PG_URL, hide_env_values = true)]
    pub(crate) database_url: String,
    /// The broker's URL (`oncebox-bench relay` only); each broker has its own default, see
    /// `--transport`.
    #[arg(long)]
    pub(crate) broker_url: Option<String>,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Flags of `oncebox-bench relay`.
#[derive(Debug, Clone, Args)]
pub(crate) struct RelayArgs {
    #[command(flatten)]
    pub(crate) common: CommonArgs,
    /// Messages in the backlog drained by each run.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub(crate) messages: u64,
    /// Rows claimed per batch, by the relay and by the baseline loop alike.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) batch: u32,
    /// Distinct ordering keys the messages are spread over.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) keys: u32,
    /// Baseline/engine pairs to run; the best run of each side is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// The relays compared with the baseline.
    #[arg(long, value_enum, default_value_t = RelayMode::Poll)]
    pub(crate) mode: RelayMode,
    /// Instead of the comparison with the baseline: this many `oncebox relay` processes
    /// over one outbox, each count after the other (`1,2,4`), their throughput against
    /// the first count's (`--store postgres --transport nats`).
    #[arg(long, value_delimiter = ',', conflicts_with = "mode", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) processes: Option<Vec<u32>>,
    /// NATS: the servers of the cluster that keep the benchmark's stream (3 for an R3
    /// stream on a three-node cluster).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    pub(crate) stream_replicas: u8,
}

/// Flags of `oncebox-bench latency`.
#[derive(Debug, Clone, Args)]
pub(crate) struct LatencyArgs {
    #[command(flatten)]
    pub(crate) common: CommonArgs,
    /// Messages committed per second (one per transaction, on an open-loop schedule).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) rate: u32,
    /// Seconds measured, after one second of warm-up that is not.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub(crate) seconds: u32,
    /// How the relay learns of new messages; several, comma-separated
    /// (`notify,poll,cdc`), are measured one after the other in the same run.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "notify")]
    pub(crate) wake: Vec<Wake>,
    /// Most rows the relay claims at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) batch: u32,
}

/// Flags of `oncebox-bench consumer`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConsumerArgs {
    #[command(flatten)]
    pub(crate) common: CommonArgs,
    /// Messages consumed by each run.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(crate) messages: u64,
    /// Concurrent consumer lanes (deliveries of one key share a lane).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) lanes: u32,
    /// Distinct ordering keys the messages are spread over.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) keys: u32,
    /// Baseline/engine pairs to run; the best run of each side is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
}

impl BenchCommand {
    fn common(&self) -> &CommonArgs {
        match self {
            Self::Relay(args) => &args.common,
            Self::Latency(args) => &args.common,
            Self::Consumer(args) => &args.common,
            Self::Http(_) | Self::Dedup(_) | Self::Enqueue(_) | Self::Batch(_) | Self::Admin(_) => {
                unreachable!("http, dedup, enqueue, batch and admin run on their own")
            }
        }
    }
}

/// Runs the benchmark asked for and prints its report.
pub(crate) async fn run(command: BenchCommand) -> anyhow::Result<ExitCode> {
    // `http`, `dedup`, `enqueue`, `batch` and `admin` open their own stores (memory,
    // Redis, PostgreSQL).
    let command = match command {
        BenchCommand::Http(http) => return http::run(http).await,
        BenchCommand::Dedup(dedup) => return dedup::run(dedup).await,
        BenchCommand::Enqueue(enqueue) => return enqueue::run(enqueue).await,
        BenchCommand::Batch(batch) => return batch::run(batch).await,
        BenchCommand::Admin(admin) => return admin::run(admin).await,
        command => command,
    };
    let common = command.common().clone();
    let relays = matches!(command, BenchCommand::Relay(_));
    anyhow::ensure!(
        relays || common.transport == TransportKind::Memory,
        "latency and consumer run on --transport memory only"
    );
    let report = match common.store {
        StoreKind::Sqlite => {
            let backend = backend::sqlite::SqliteBench::open().await?;
            run_on(backend, &command).await?
        }
        StoreKind::Postgres => {
            let backend = backend::postgres::PgBench::open(&common.database_url).await?;
            run_on(backend, &command).await?
        }
        #[cfg(feature = "mysql")]
        StoreKind::Mysql => {
            let backend = backend::mysql::MySqlBench::open(&common.database_url).await?;
            run_on(backend, &command).await?
        }
    };
    if common.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `command` on `backend`, then removes what the backend created, whether the run
/// succeeded, failed or was interrupted with Ctrl-C.
async fn run_on<B: Backend>(backend: B, command: &BenchCommand) -> anyhow::Result<Report> {
    let body = async {
        match command {
            BenchCommand::Relay(args) => relay_on(&backend, args).await,
            BenchCommand::Latency(args) => latency::run(&backend, args).await.map(Report::Latency),
            BenchCommand::Consumer(args) => {
                consumer::run(&backend, args).await.map(Report::Consumer)
            }
            BenchCommand::Http(_)
            | BenchCommand::Dedup(_)
            | BenchCommand::Enqueue(_)
            | BenchCommand::Batch(_)
            | BenchCommand::Admin(_) => Err(anyhow::anyhow!(
                "http, dedup, enqueue, batch and admin run on their own"
            )),
        }
    };
    let result = tokio::select! {
        result = body => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let cleanup = backend.close().await;
    match (result, cleanup) {
        (Ok(report), Ok(())) => Ok(report),
        (Err(error), Ok(())) => Err(error),
        (Ok(_), Err(error)) => Err(error.context("cleaning up after the benchmark")),
        (Err(error), Err(cleanup)) => {
            eprintln!("oncebox-bench: cleaning up after the failure failed too: {cleanup:#}");
            Err(error)
        }
    }
}

/// Runs `oncebox-bench relay` on `backend`, publishing to the broker `args` name.
async fn relay_on<B: Backend>(backend: &B, args: &RelayArgs) -> anyhow::Result<Report> {
    #[cfg(any(
        feature = "nats",
        feature = "rabbitmq",
        feature = "kafka",
        feature = "redis-streams",
        feature = "sqs"
    ))]
    let url = args.common.broker_url.as_deref();
    match args.common.transport {
        TransportKind::Memory => {
            relay_through(backend, transport::memory::MemoryBench::open(), args).await
        }
        #[cfg(feature = "nats")]
        TransportKind::Nats => {
            let broker = transport::nats::NatsBench::open(url, args.stream_replicas).await?;
            relay_through(backend, broker, args).await
        }
        #[cfg(feature = "rabbitmq")]
        TransportKind::Rabbitmq => {
            let broker = transport::rabbitmq::RabbitMqBench::open(url).await?;
            relay_through(backend, broker, args).await
        }
        #[cfg(feature = "kafka")]
        TransportKind::Kafka => {
            relay_through(
                backend,
                transport::kafka::KafkaBench::open(url).await?,
                args,
            )
            .await
        }
        #[cfg(feature = "redis-streams")]
        TransportKind::Redis => {
            let broker = transport::redis::RedisStreamsBench::open(url).await?;
            relay_through(backend, broker, args).await
        }
        #[cfg(feature = "sqs")]
        TransportKind::Sqs => {
            let broker = transport::sqs::SqsBench::open(url).await?;
            relay_through(backend, broker, args).await
        }
    }
}

/// Runs `oncebox-bench relay` through `transport`, then removes what it created on the
/// broker, whether the run succeeded or not.
async fn relay_through<B: Backend, T: BenchTransport>(
    backend: &B,
    mut transport: T,
    args: &RelayArgs,
) -> anyhow::Result<Report> {
    let result = match &args.processes {
        Some(counts) => {
            let pg = backend
                .postgres()
                .context("--processes runs `oncebox relay` over --store postgres");
            match pg {
                Ok(pg) => processes::run(pg, &mut transport, args, counts)
                    .await
                    .map(Report::RelayProcesses),
                Err(error) => Err(error),
            }
        }
        None => relay::run(backend, &mut transport, args)
            .await
            .map(Report::Relay),
    };
    let cleanup = transport.close().await;
    match (result, cleanup) {
        (Ok(report), Ok(())) => Ok(report),
        (Ok(_), Err(error)) => Err(error.context("cleaning up the broker after the benchmark")),
        (Err(error), cleanup) => {
            if let Err(cleanup) = cleanup {
                eprintln!("oncebox-bench: cleaning up the broker failed too: {cleanup:#}");
            }
            Err(error)
        }
    }
}
