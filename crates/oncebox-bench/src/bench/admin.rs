//! `oncebox-bench admin`: the dashboard's reads of a large PostgreSQL outbox.
//!
//! Fills an outbox, in a schema of its own, as a busy service leaves it: `--rows` rows
//! created at 1,000 a second up to now, over `--keys` keys and four topics; the newest
//! 0.5 % pending, one in a thousand dead, the rest published and kept for retention.
//! Then times [`rows`](oncebox::spool::OutboxAdmin::rows) for pages of `--page` rows (the newest, mid depth,
//! the oldest) unfiltered and with each filter, and
//! [`published_per_minute`](oncebox::spool::OutboxAdmin::published_per_minute) over the
//! last hour of the fill: one untimed
//! call and `--runs` timed ones per case, the median reported. Prints the plan of the
//! deepest page (`EXPLAIN (ANALYZE, BUFFERS)`), and with `--explain` the plan of every
//! listing.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use clap::Args;
use oncebox::MessageId;
use oncebox::postgres::PgOutbox;
use oncebox::spool::{OutboxAdmin, RowFilter, RowStatus};
use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::backend::Backend as _;
use super::backend::postgres::PgBench;
use super::measure::millis;
use super::workload;

/// Rows per fill statement (each its own transaction).
const FILL_CHUNK: u64 = 1_000_000;

/// The topics the rows are spread over, in turn.
const TOPICS: [&str; 4] = ["orders", "payments", "shipments", "invoices"];

/// Flags of `oncebox-bench admin`.
#[derive(Debug, Clone, Args)]
pub(crate) struct AdminArgs {
    /// PostgreSQL connection URL (the run works in a schema of its own and drops it).
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = super::DEFAULT_PG_URL, hide_env_values = true)]
    pub(crate) database_url: String,
    /// Rows in the outbox.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(10_000..=100_000_000))]
    pub(crate) rows: u64,
    /// Distinct ordering keys the rows are spread over.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) keys: u32,
    /// Rows per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) page: u32,
    /// Timed calls per case; the median is reported.
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) runs: u32,
    /// Print the plan of every listing, not only of the deepest page.
    #[arg(long)]
    pub(crate) explain: bool,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `oncebox-bench admin`: the time of each read of the dashboard.
#[derive(Debug, Serialize)]
pub(crate) struct AdminReport {
    /// `"admin"`.
    pub(crate) bench: &'static str,
    /// Rows in the outbox.
    pub(crate) rows: u64,
    /// Pending rows among them (the newest).
    pub(crate) pending: u64,
    /// Dead rows among them.
    pub(crate) dead: u64,
    /// Ordering keys.
    pub(crate) keys: u32,
    /// Rows per page.
    pub(crate) page: u32,
    /// Timed calls per case.
    pub(crate) runs: u32,
    /// How long the fill took, vacuum and analyze included.
    pub(crate) fill_seconds: f64,
    /// Every case, in the order they ran.
    pub(crate) cases: Vec<CaseReport>,
    /// The plan of the deepest unfiltered page.
    pub(crate) deepest_plan: String,
}

/// The timings of one case.
#[derive(Debug, Serialize)]
pub(crate) struct CaseReport {
    /// What was read.
    pub(crate) case: String,
    /// Rows (or minutes) the call returned.
    pub(crate) returned: usize,
    /// Median of the timed calls, in milliseconds.
    pub(crate) median_ms: f64,
    /// Fastest timed call.
    pub(crate) min_ms: f64,
    /// Slowest timed call.
    pub(crate) max_ms: f64,
    /// The listing's plan (`--explain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) plan: Option<String>,
}

/// Runs `oncebox-bench admin` and prints its report.
pub(crate) async fn run(args: AdminArgs) -> anyhow::Result<ExitCode> {
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

/// A listing to time: `filter`, from the row before `before`.
struct Listing {
    name: String,
    filter: RowFilter,
    before: Option<i64>,
}

async fn measure(bench: &PgBench, args: &AdminArgs) -> anyhow::Result<AdminReport> {
    let outbox = bench.store().outbox();
    let started = Instant::now();
    let fill = Fill::new(bench, args).await?;
    fill.run(args.json).await?;
    let fill_seconds = started.elapsed().as_secs_f64();

    let listings = fill.listings(args).await?;
    let mut cases = Vec::new();
    for listing in &listings {
        let mut case = time(&listing.name, args.runs, || async {
            Ok(outbox
                .rows(&listing.filter, listing.before, args.page as usize)
                .await?
                .len())
        })
        .await?;
        if args.explain {
            case.plan = Some(explain(&outbox, listing, args).await?);
        }
        if !args.json {
            eprintln!("  {:<44} {:>8.2} ms", case.case, case.median_ms);
        }
        cases.push(case);
    }
    let since = fill.end - Duration::from_secs(3600);
    let counts = time("published per minute, last hour", args.runs, || async {
        Ok(outbox.published_per_minute(since).await?.len())
    })
    .await?;
    cases.push(counts);
    let deepest = listings
        .iter()
        .find(|listing| listing.name == DEEPEST)
        .context("the deepest page is among the cases")?;
    Ok(AdminReport {
        bench: "admin",
        rows: args.rows,
        pending: fill.pending,
        dead: fill.dead(),
        keys: args.keys,
        page: args.page,
        runs: args.runs,
        fill_seconds,
        cases,
        deepest_plan: explain(&outbox, deepest, args).await?,
    })
}

/// The name of the case whose plan is always printed.
const DEEPEST: &str = "no filter, oldest page";

/// Calls `call` once untimed, then `runs` times timed.
async fn time<F, Fut>(name: &str, runs: u32, call: F) -> anyhow::Result<CaseReport>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<usize>>,
{
    let returned = call().await?;
    let mut samples = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        call().await?;
        samples.push(started.elapsed());
    }
    samples.sort_unstable();
    let median = samples[samples.len() / 2];
    Ok(CaseReport {
        case: name.to_owned(),
        returned,
        median_ms: millis(median),
        min_ms: millis(samples[0]),
        max_ms: millis(samples[samples.len() - 1]),
        plan: None,
    })
}

async fn explain(outbox: &PgOutbox, listing: &Listing, args: &AdminArgs) -> anyhow::Result<String> {
    Ok(outbox
        .explain_rows(&listing.filter, listing.before, args.page as usize)
        .await?)
}

/// The outbox's rows: row `n` (from 1, which is also its `seq` in the new table) was
/// created `rows - n` milliseconds before `end`.
struct Fill<'b> {
    bench: &'b PgBench,
    table: String,
    rows: u64,
    keys: u32,
    /// The rows after `rows - pending` are pending.
    pending: u64,
    /// The creation time of the newest row: the database's time when the fill began.
    end: SystemTime,
    end_us: i64,
}

impl<'b> Fill<'b> {
    async fn new(bench: &'b PgBench, args: &AdminArgs) -> anyhow::Result<Self> {
        let end_us: i64 =
            sqlx::query_scalar("SELECT (extract(epoch FROM statement_timestamp()) * 1e6)::bigint")
                .fetch_one(bench.store().pool())
                .await
                .context("reading the database's clock")?;
        Ok(Self {
            bench,
            table: bench.store().outbox().table().to_owned(),
            rows: args.rows,
            keys: args.keys,
            pending: args.rows / 200,
            end: SystemTime::UNIX_EPOCH + Duration::from_micros(u64::try_from(end_us)?),
            end_us,
        })
    }

    /// Rows `n` with `n % 1000 == 500` are dead (outside the pending tail).
    fn dead(&self) -> u64 {
        let settled = self.rows - self.pending;
        settled / 1000 + u64::from(settled % 1000 >= 500)
    }

    /// The id of row `n`: a UUIDv7 layout whose low bits are `n`, so that ids grow with
    /// the rows as time-ordered ids do.
    fn id(n: u64) -> String {
        format!("018f0000-0000-7000-8000-{n:012x}")
    }

    /// Inserts the rows in chunks of [`FILL_CHUNK`], then vacuums and analyzes the
    /// table, as autovacuum would have done by the time a dashboard reads it.
    async fn run(&self, quiet: bool) -> anyhow::Result<()> {
        let insert = format!(
            "INSERT INTO {table} (id, topic, key, kind, headers, payload, created_at, status,
                     attempts, available_at, last_error, done_at, dead_at)
SELECT ('018f0000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid,
       (ARRAY['{topics}'])[(1 + n % 4)::int],
       'key-' || lpad((n % $3)::text, 5, '0'), $4, '{{}}'::jsonb, $5, c.at, s.status,
       CASE s.status WHEN 'dead' THEN 5 ELSE 0 END, c.at,
       CASE s.status WHEN 'dead' THEN 'refused by the broker' END,
       CASE s.status WHEN 'done' THEN c.at + interval '20 milliseconds' END,
       CASE s.status WHEN 'dead' THEN c.at + interval '1 second' END
FROM generate_series($1::bigint, $2::bigint) AS n,
     LATERAL (SELECT timestamptz 'epoch' + ($6 - ($7 - n) * 1000) * interval '1 microsecond'
              AS at) AS c,
     LATERAL (SELECT CASE WHEN n > $7 - $8 THEN 'pending'
                          WHEN n % 1000 = 500 THEN 'dead' ELSE 'done' END AS status) AS s
ORDER BY n",
            table = self.table,
            topics = TOPICS.join("','"),
        );
        let pool = self.bench.store().pool();
        let started = Instant::now();
        let mut first = 1;
        while first <= self.rows {
            let last = (first + FILL_CHUNK - 1).min(self.rows);
            sqlx::query(AssertSqlSafe(insert.clone()))
                .bind(i64::try_from(first)?)
                .bind(i64::try_from(last)?)
                .bind(i64::from(self.keys))
                .bind(workload::KIND)
                .bind(workload::payload())
                .bind(self.end_us)
                .bind(i64::try_from(self.rows)?)
                .bind(i64::try_from(self.pending)?)
                .execute(pool)
                .await
                .context("filling the outbox")?;
            if !quiet {
                eprintln!(
                    "  filled {last} of {} rows ({:.0} s)",
                    self.rows,
                    started.elapsed().as_secs_f64()
                );
            }
            first = last + 1;
        }
        sqlx::raw_sql(AssertSqlSafe(format!("VACUUM (ANALYZE) {}", self.table)))
            .execute(pool)
            .await
            .context("vacuuming the outbox")?;
        if let Err(error) = sqlx::raw_sql("CHECKPOINT").execute(pool).await {
            tracing::debug!(%error, "CHECKPOINT refused; the first cases may pay for it");
        }
        Ok(())
    }

    /// The `seq` before the oldest page of the rows `condition` selects (with `$2`
    /// bound to `value`): the seq of the row after the `page` oldest.
    async fn oldest_page(
        &self,
        condition: &str,
        value: Option<&str>,
        page: u32,
    ) -> anyhow::Result<Option<i64>> {
        let sql = format!(
            "SELECT seq FROM {} WHERE {condition} ORDER BY seq OFFSET $1 LIMIT 1",
            self.table
        );
        let mut query = sqlx::query_scalar(AssertSqlSafe(sql)).bind(i64::from(page));
        if let Some(value) = value {
            query = query.bind(value.to_owned());
        }
        query
            .fetch_optional(self.bench.store().pool())
            .await
            .with_context(|| format!("finding the oldest page where {condition}"))
    }

    /// The listings timed, each with the newest page, and the oldest or one mid depth.
    async fn listings(&self, args: &AdminArgs) -> anyhow::Result<Vec<Listing>> {
        let key = workload::key(7, self.keys);
        let topic = TOPICS[1];
        let mid = i64::try_from(self.rows / 2)?;
        let with = |set: &dyn Fn(&mut RowFilter)| {
            let mut filter = RowFilter::default();
            set(&mut filter);
            filter
        };
        let pending = with(&|f| f.status = Some(RowStatus::Pending));
        let dead = with(&|f| f.status = Some(RowStatus::Dead));
        let done = with(&|f| f.status = Some(RowStatus::Done));
        let by_key = with(&|f| f.key = Some(key.clone()));
        let by_topic = with(&|f| f.topic = Some(topic.to_owned()));
        let page = args.page;
        let listing = |name: &str, filter: &RowFilter, before| Listing {
            name: name.to_owned(),
            filter: filter.clone(),
            before,
        };
        let id = MessageId::parse(&Self::id(self.rows / 2))?;
        let minutes_ago = |minutes: u64| self.end - Duration::from_secs(60 * minutes);
        let within = |from: SystemTime| {
            with(&|f| {
                f.created_from = Some(from);
                f.created_until = Some(from + Duration::from_secs(60));
            })
        };
        Ok(vec![
            listing("no filter, newest page", &RowFilter::default(), None),
            listing("no filter, mid depth", &RowFilter::default(), Some(mid)),
            listing(
                DEEPEST,
                &RowFilter::default(),
                self.oldest_page("true", None, page).await?,
            ),
            listing("status pending, newest page", &pending, None),
            listing(
                "status pending, oldest page",
                &pending,
                self.oldest_page("status = 'pending'", None, page).await?,
            ),
            listing("status dead, newest page", &dead, None),
            listing(
                "status dead, oldest page",
                &dead,
                self.oldest_page("status = 'dead'", None, page).await?,
            ),
            listing("status done, mid depth", &done, Some(mid)),
            listing("key, newest page", &by_key, None),
            listing(
                "key, oldest page",
                &by_key,
                self.oldest_page("key = $2", Some(&key), page).await?,
            ),
            listing(
                "key and status pending, newest page",
                &with(&|f| {
                    f.key = Some(key.clone());
                    f.status = Some(RowStatus::Pending);
                }),
                None,
            ),
            listing("topic, newest page", &by_topic, None),
            listing("topic, mid depth", &by_topic, Some(mid)),
            listing(
                "topic, oldest page",
                &by_topic,
                self.oldest_page("topic = $2", Some(topic), page).await?,
            ),
            listing("id", &with(&|f| f.id = Some(id)), None),
            listing(
                "created in one minute, 10 minutes back",
                &within(minutes_ago(10)),
                None,
            ),
            listing(
                "created in one minute, mid depth",
                &within(self.end - Duration::from_millis(self.rows / 2)),
                None,
            ),
            listing(
                "created before mid depth",
                &with(&|f| f.created_until = Some(self.end - Duration::from_millis(self.rows / 2))),
                None,
            ),
        ])
    }
}

impl AdminReport {
    fn print(&self) {
        println!(
            "admin · store postgres · {} rows ({} pending, {} dead) · {} keys · pages of {} · \
             median of {} runs · filled in {:.0} s",
            self.rows, self.pending, self.dead, self.keys, self.page, self.runs, self.fill_seconds
        );
        println!(
            "  {:<44} {:>8} {:>10} {:>8} {:>8}",
            "case", "returned", "median ms", "min ms", "max ms"
        );
        for case in &self.cases {
            println!(
                "  {:<44} {:>8} {:>10.2} {:>8.2} {:>8.2}",
                case.case, case.returned, case.median_ms, case.min_ms, case.max_ms
            );
        }
        for case in &self.cases {
            if let Some(plan) = &case.plan {
                println!("\n{}, EXPLAIN (ANALYZE, BUFFERS):\n{plan}", case.case);
            }
        }
        println!(
            "\n{DEEPEST}, EXPLAIN (ANALYZE, BUFFERS):\n{}",
            self.deepest_plan
        );
    }
}
