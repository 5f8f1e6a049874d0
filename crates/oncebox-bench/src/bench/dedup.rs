//! `oncebox-bench dedup`: the idempotent receiver's dedup store, begin+complete cycles
//! and duplicate checks per second, against the plainest duplicate check the same
//! backend offers (a `HashSet` insert, `SET NX PX`, `INSERT ... ON CONFLICT DO NOTHING`).
//!
//! Also the store setup shared with `oncebox-bench http`: every run isolates itself (a new
//! in-memory store, a unique Redis prefix, a new PostgreSQL schema) and removes what it
//! created at the end.

use std::collections::HashSet;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use oncebox::memory::{LayeredDedupStore, MemoryDedupStore};
use oncebox::postgres::{PgDedupStore, PgStore};
use oncebox::redis::RedisDedupStore;
use oncebox::store::{Begin, DedupStore};
use serde::Serialize;

use super::measure::{highest, per_second, ratio};

/// The Redis server used when neither `--redis-url` nor `ONCEBOX_REDIS_URL` is set.
pub(crate) const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

const LEASE: Duration = Duration::from_secs(30);
/// Long enough for the run; short enough that a run killed before cleanup leaves
/// nothing behind for long.
const TTL: Duration = Duration::from_secs(600);

/// Which dedup store to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DedupStoreKind {
    /// `MemoryDedupStore`, in process.
    Memory,
    /// `RedisDedupStore`, under a unique prefix of the `--redis-url` server.
    Redis,
    /// `PgDedupStore`, in a new schema of the `--database-url` database.
    Postgres,
}

/// Where the stores live (flags shared with `oncebox-bench http`).
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreArgs {
    /// The dedup store.
    #[arg(long, value_enum, default_value_t = DedupStoreKind::Memory)]
    pub(crate) store: DedupStoreKind,
    /// Redis URL (the run works under a prefix of its own and deletes it).
    #[arg(long, env = "ONCEBOX_REDIS_URL", default_value = DEFAULT_REDIS_URL, hide_env_values = true)]
    pub(crate) redis_url: String,
    /// PostgreSQL URL (the run works in a schema of its own and drops it).
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = super::DEFAULT_PG_URL, hide_env_values = true)]
    pub(crate) database_url: String,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Flags of `oncebox-bench dedup`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DedupArgs {
    #[command(flatten)]
    pub(crate) stores: StoreArgs,
    /// Operations per run (default: 1,000,000 in memory, 20,000 otherwise).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub(crate) ops: Option<u64>,
    /// Concurrent callers (default: 1 in memory, for the cost of one check; 32 otherwise).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) concurrency: Option<u32>,
    /// Rounds; the best run of each measurement is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
}

/// A store opened for a run, and how to remove what it created.
pub(crate) enum BenchStore {
    /// In process.
    Memory(Arc<MemoryDedupStore>),
    /// Under a unique prefix.
    Redis {
        /// The store.
        store: RedisDedupStore,
        /// The prefix to delete at the end.
        prefix: String,
    },
    /// In a new schema.
    Postgres {
        /// The store.
        store: PgDedupStore,
        /// Its `PgStore`, for the baseline table and the cleanup.
        pg: PgStore,
    },
}

impl BenchStore {
    /// Opens the store `args` asks for; `capacity` sizes an in-memory store.
    pub(crate) async fn open(args: &StoreArgs, capacity: usize) -> anyhow::Result<Self> {
        Ok(match args.store {
            DedupStoreKind::Memory => Self::Memory(Arc::new(MemoryDedupStore::new(capacity))),
            DedupStoreKind::Redis => {
                let prefix = format!("oncebox-bench:{:016x}:", fastrand::u64(..));
                let store = RedisDedupStore::connect(&args.redis_url)
                    .await
                    .context("connecting to Redis (--redis-url)")?
                    .with_prefix(&prefix);
                Self::Redis { store, prefix }
            }
            DedupStoreKind::Postgres => {
                let schema = format!("bench_{:016x}", fastrand::u64(..));
                let pg = PgStore::connect(&args.database_url)
                    .await
                    .context("connecting to PostgreSQL (--database-url)")?
                    .with_schema(&schema)?;
                if let Err(error) = pg.migrate().await {
                    let _ = drop_schema(&pg).await;
                    return Err(error.into());
                }
                Self::Postgres {
                    store: pg.dedup(),
                    pg,
                }
            }
        })
    }

    /// Removes what the run created.
    pub(crate) async fn close(self) -> anyhow::Result<()> {
        match self {
            Self::Memory(_) => Ok(()),
            Self::Redis { store, prefix } => delete_prefix(&store, &prefix).await,
            Self::Postgres { pg, .. } => drop_schema(&pg).await,
        }
    }
}

async fn delete_prefix(store: &RedisDedupStore, prefix: &str) -> anyhow::Result<()> {
    let mut connection = store.connection().clone();
    let pattern = format!("{prefix}*");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = oncebox::redis::redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut connection)
            .await
            .context("scanning the benchmark's Redis keys")?;
        if !keys.is_empty() {
            let _: i64 = oncebox::redis::redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut connection)
                .await
                .context("deleting the benchmark's Redis keys")?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

async fn drop_schema(pg: &PgStore) -> anyhow::Result<()> {
    let sql = format!(
        "SET lock_timeout = '30s'; DROP SCHEMA IF EXISTS \"{}\" CASCADE",
        pg.schema()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pg.pool())
        .await
        .with_context(|| format!("dropping schema {}", pg.schema()))?;
    Ok(())
}

/// One measured pass.
#[derive(Debug, Clone, Serialize)]
struct Pass {
    /// What was measured.
    what: &'static str,
    /// Which round, from 1.
    round: u32,
    /// Operations.
    ops: u64,
    /// Operations per second.
    ops_per_s: f64,
}

/// The report of `oncebox-bench dedup`.
#[derive(Debug, Serialize)]
struct DedupReport {
    bench: &'static str,
    store: DedupStoreKind,
    ops: u64,
    concurrency: u32,
    /// Best begin+complete cycles per second on fresh ids.
    cycles_per_s: f64,
    /// Best duplicate checks (`begin` on a completed id) per second.
    checks_per_s: f64,
    /// Best duplicate checks per second through a `LayeredDedupStore` in front.
    layered_checks_per_s: f64,
    /// The plainest duplicate check of the backend, per second (best run).
    baseline_per_s: f64,
    /// What the baseline is.
    baseline: &'static str,
    /// `cycles_per_s / baseline_per_s`.
    ratio: f64,
    /// Wall-clock nanoseconds per duplicate check, one caller (memory only).
    #[serde(skip_serializing_if = "Option::is_none")]
    ns_per_check: Option<f64>,
    runs: Vec<Pass>,
}

/// Runs `oncebox-bench dedup`.
pub(crate) async fn run(args: DedupArgs) -> anyhow::Result<ExitCode> {
    let memory = args.stores.store == DedupStoreKind::Memory;
    let ops = args.ops.unwrap_or(if memory { 1_000_000 } else { 20_000 });
    let concurrency = args.concurrency.unwrap_or(if memory { 1 } else { 32 });
    // Every round keeps the ids it completes (for longer than the run), so an in-memory
    // store holds `ops` per round; one sized for fewer refuses new ids at capacity.
    let capacity =
        usize::try_from(ops.saturating_mul(u64::from(args.rounds))).unwrap_or(usize::MAX);
    let store = BenchStore::open(&args.stores, capacity).await?;
    let body = async {
        match &store {
            BenchStore::Memory(memory) => {
                let baseline = Arc::new(HashSetBaseline::default());
                measure(
                    memory,
                    baseline,
                    "HashSet insert under a mutex",
                    ops,
                    concurrency,
                    args.rounds,
                )
                .await
            }
            BenchStore::Redis { store, prefix } => {
                let baseline = Arc::new(RedisBaseline {
                    store: store.clone(),
                    prefix: format!("{prefix}baseline:"),
                });
                measure(
                    store,
                    baseline,
                    "SET key 1 NX PX",
                    ops,
                    concurrency,
                    args.rounds,
                )
                .await
            }
            BenchStore::Postgres { store, pg } => {
                let baseline = Arc::new(PgBaseline::create(pg).await?);
                measure(
                    store,
                    baseline,
                    "INSERT ... ON CONFLICT DO NOTHING",
                    ops,
                    concurrency,
                    args.rounds,
                )
                .await
            }
        }
    };
    let result = tokio::select! {
        result = body => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let cleanup = store.close().await;
    let mut report = result?;
    cleanup.context("cleaning up after the benchmark")?;
    report.store = args.stores.store;
    if memory && concurrency == 1 && report.checks_per_s > 0.0 {
        report.ns_per_check = Some(1e9 / report.checks_per_s);
    }
    if args.stores.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print(report: &DedupReport) {
    println!(
        "bench dedup  store={:?}  ops={}  concurrency={}",
        report.store, report.ops, report.concurrency
    );
    for pass in &report.runs {
        println!(
            "  round {}  {:<18} {:>12.0} /s",
            pass.round, pass.what, pass.ops_per_s
        );
    }
    println!("  begin+complete cycles/s   {:>12.0}", report.cycles_per_s);
    println!("  duplicate checks/s        {:>12.0}", report.checks_per_s);
    println!(
        "  layered checks/s          {:>12.0}",
        report.layered_checks_per_s
    );
    println!(
        "  baseline/s                {:>12.0}   ({})",
        report.baseline_per_s, report.baseline
    );
    println!("  ratio (cycles / baseline) {:>12.3}", report.ratio);
    if let Some(ns) = report.ns_per_check {
        println!("  ns per check              {ns:>12.0}");
    }
}

/// The plainest duplicate check of a backend: insert `id`, tell whether it was new.
trait Baseline: Sync {
    fn check(&self, id: &str) -> impl Future<Output = anyhow::Result<bool>> + Send;
}

#[derive(Default)]
struct HashSetBaseline(Mutex<HashSet<String>>);

impl Baseline for HashSetBaseline {
    async fn check(&self, id: &str) -> anyhow::Result<bool> {
        let mut set = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(set.insert(id.to_owned()))
    }
}

struct RedisBaseline {
    store: RedisDedupStore,
    prefix: String,
}

impl Baseline for RedisBaseline {
    async fn check(&self, id: &str) -> anyhow::Result<bool> {
        let mut connection = self.store.connection().clone();
        let set: Option<String> = oncebox::redis::redis::cmd("SET")
            .arg(format!("{}{id}", self.prefix))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut connection)
            .await?;
        Ok(set.is_some())
    }
}

struct PgBaseline {
    pool: sqlx::PgPool,
    insert: String,
}

impl PgBaseline {
    async fn create(pg: &PgStore) -> anyhow::Result<Self> {
        let table = format!("\"{}\".bench_seen", pg.schema());
        let create = format!("CREATE TABLE {table} (id TEXT PRIMARY KEY)");
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(pg.pool())
            .await
            .context("creating the baseline table")?;
        Ok(Self {
            pool: pg.pool().clone(),
            insert: format!("INSERT INTO {table} (id) VALUES ($1) ON CONFLICT DO NOTHING"),
        })
    }
}

impl Baseline for PgBaseline {
    async fn check(&self, id: &str) -> anyhow::Result<bool> {
        let done = sqlx::query(sqlx::AssertSqlSafe(self.insert.as_str()))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

/// Runs `ops` operations of `op(i)` on `concurrency` tasks; returns the elapsed time.
async fn drive<F, Fut>(ops: u64, concurrency: u32, op: F) -> anyhow::Result<Duration>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    if concurrency == 1 {
        // One caller, no task hand-offs: the cost of the operation itself.
        for i in 0..ops {
            op(i).await?;
        }
        return Ok(start.elapsed());
    }
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (op, next) = (Arc::clone(&op), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    return Ok::<_, anyhow::Error>(());
                }
                op(i).await?;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    Ok(start.elapsed())
}

async fn measure<S, B>(
    store: &S,
    baseline: Arc<B>,
    baseline_name: &'static str,
    ops: u64,
    concurrency: u32,
    rounds: u32,
) -> anyhow::Result<DedupReport>
where
    S: DedupStore + Clone + 'static,
    B: Baseline + Send + 'static,
{
    let mut runs = Vec::new();
    let layered = Arc::new(LayeredDedupStore::new(
        store.clone(),
        usize::try_from(ops).unwrap_or(usize::MAX),
    ));
    for round in 1..=rounds {
        // Baseline: the plainest insert-if-absent.
        let check = Arc::clone(&baseline);
        let elapsed = drive(ops, concurrency, move |i| {
            let baseline = Arc::clone(&check);
            async move {
                let id = format!("r{round}-{i}");
                anyhow::ensure!(baseline.check(&id).await?, "baseline id {id} was not new");
                Ok(())
            }
        })
        .await?;
        runs.push(pass("baseline", round, ops, elapsed));

        // Cycles: begin on a fresh id, then complete it.
        let cycle_store = store.clone();
        let elapsed = drive(ops, concurrency, move |i| {
            let store = cycle_store.clone();
            async move {
                let id = format!("r{round}-{i}");
                match store.begin(&id, LEASE).await? {
                    Begin::Started(token) => store.complete(&id, token, b"ok", TTL).await?,
                    other => anyhow::bail!("fresh id {id} answered {other:?}"),
                }
                Ok(())
            }
        })
        .await?;
        runs.push(pass("cycles", round, ops, elapsed));

        // Checks: begin on the ids just completed: every one a duplicate.
        let check_store = store.clone();
        let elapsed = drive(ops, concurrency, move |i| {
            let store = check_store.clone();
            async move {
                let id = format!("r{round}-{i}");
                match store.begin(&id, LEASE).await? {
                    Begin::Completed(_) => Ok(()),
                    other => anyhow::bail!("completed id {id} answered {other:?}"),
                }
            }
        })
        .await?;
        runs.push(pass("checks", round, ops, elapsed));

        // Layered checks: the same ids through the in-memory window (its first pass
        // fills the window from the backing store, so warm it first).
        let warm = Arc::clone(&layered);
        drive(ops, concurrency, move |i| {
            let store = Arc::clone(&warm);
            async move {
                store.begin(&format!("r{round}-{i}"), LEASE).await?;
                Ok(())
            }
        })
        .await?;
        let hot = Arc::clone(&layered);
        let elapsed = drive(ops, concurrency, move |i| {
            let store = Arc::clone(&hot);
            async move {
                let id = format!("r{round}-{i}");
                match store.begin(&id, LEASE).await? {
                    Begin::Completed(_) => Ok(()),
                    other => anyhow::bail!("completed id {id} answered {other:?}"),
                }
            }
        })
        .await?;
        runs.push(pass("layered checks", round, ops, elapsed));
    }
    let best = |what: &str| highest(&runs, |p| (p.what == what).then_some(p.ops_per_s));
    let cycles = best("cycles");
    let baseline = best("baseline");
    Ok(DedupReport {
        bench: "dedup",
        store: DedupStoreKind::Memory,
        ops,
        concurrency,
        cycles_per_s: cycles,
        checks_per_s: best("checks"),
        layered_checks_per_s: best("layered checks"),
        baseline_per_s: baseline,
        baseline: baseline_name,
        ratio: ratio(cycles, baseline),
        ns_per_check: None,
        runs,
    })
}

fn pass(what: &'static str, round: u32, ops: u64, elapsed: Duration) -> Pass {
    Pass {
        what,
        round,
        ops,
        ops_per_s: per_second(ops, elapsed),
    }
}
