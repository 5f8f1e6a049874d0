//! `oncebox-peer-bench`: oncebox's polling relay against the best Rust peer's, on one
//! PostgreSQL, in one process, in alternating runs.
//!
//! The peer is `outbox-core` 0.6 with `outbox-postgres` 0.3 (its migration's table, its
//! processor; see [`peer`]); oncebox is `PgStore`'s outbox with its defaults (held
//! claims; a published row is marked done and left to retention, as the peer marks its
//! rows sent) and a [`Relay`](oncebox::spool::Relay) ([`ours`]). Each side runs its
//! drain loop, the one its long-running worker runs on each wake-up, until a claim finds
//! nothing; neither listens for notifications or collects garbage meanwhile. Both
//! publish to oncebox's in-process broker, a new one per run, so the figures are the
//! relays' and the database's, not a broker's.
//!
//! Each run drains a backlog of `--messages` filled before it, from a table vacuumed and
//! checkpointed after the fill (none of which is timed), and is checked: the broker
//! received every message, each once. A run's table is emptied after it, so that
//! autovacuum has nothing of it to do during the other side's run. The rounds alternate
//! which side goes first. The report gives the best and the median run of each side and
//! their ratios.
//!
//! Each side commits as it does by default: oncebox's claims and settlements do not wait
//! for the WAL flush (a lost settlement means a message published again, which the
//! relay promises anyway), the peer's wait for it, twice a batch.
//! `--peer-async-commit` turns the wait off for the peer too, to show how much of the
//! difference that is.
//!
//! Both live in a schema of their own (`peer_bench_<random>`), dropped at the end, also
//! after an error or Ctrl-C.
//!
//! ```sh
//! cargo run --release --manifest-path peer-bench/Cargo.toml --target-dir target -- --rounds 3
//! ```

mod ours;
mod peer;
mod workload;

use std::collections::HashSet;
use std::str::FromStr as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use oncebox::memory::MemoryBroker;
use serde::Serialize;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};

/// The server the project's services script starts.
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// oncebox's polling relay against outbox-core's, draining the same backlog.
#[derive(Debug, Parser)]
#[command(name = "oncebox-peer-bench", version, about)]
struct Args {
    /// The PostgreSQL server; the run works in a schema of its own and drops it.
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = DEFAULT_PG_URL, hide_env_values = true)]
    url: String,
    /// Messages in the backlog drained by each run (each run's broker keeps them all in
    /// memory).
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    messages: u64,
    /// Rows claimed per batch, by both relays (oncebox's default; the peer's is 100).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Distinct ordering keys oncebox's messages are spread over (the peer has no
    /// ordering keys).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    keys: u32,
    /// oncebox deletes a row when its message is published, instead of marking it done
    /// for retention (`PgOutbox::delete_on_publish`; the peer marks its rows sent either
    /// way).
    #[arg(long)]
    delete_on_publish: bool,
    /// The peer's commits do not wait for the WAL flush either (`synchronous_commit =
    /// off` on its connections), as oncebox's claims and settlements do not.
    #[arg(long)]
    peer_async_commit: bool,
    /// Rounds, each one run of each side, in turn first; the best and median runs of
    /// each side are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Which relay a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Side {
    /// oncebox's relay.
    Oncebox,
    /// outbox-core's processor with outbox-postgres.
    Peer,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Oncebox => "oncebox",
            Self::Peer => "peer",
        }
    }
}

/// One timed drain (`oncebox-bench`'s `Run`, without its steps).
#[derive(Debug, Serialize)]
struct Run {
    side: Side,
    /// From 1.
    round: u32,
    /// Messages the broker received.
    messages: u64,
    seconds: f64,
    msgs_per_s: f64,
}

impl Run {
    fn new(side: Side, round: u32, messages: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        Self {
            side,
            round,
            messages,
            seconds,
            msgs_per_s: if seconds > 0.0 {
                messages as f64 / seconds
            } else {
                0.0
            },
        }
    }
}

/// The report, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    /// `"peer"`.
    bench: &'static str,
    /// The peer's crates and versions.
    peer: &'static str,
    /// The run's schema (dropped).
    schema: String,
    messages: u64,
    batch: u32,
    keys: u32,
    delete_on_publish: bool,
    peer_async_commit: bool,
    /// oncebox's best run.
    msgs_per_s: f64,
    /// The peer's best run.
    peer_msgs_per_s: f64,
    /// `msgs_per_s / peer_msgs_per_s`.
    ratio: f64,
    /// oncebox's median run.
    median_msgs_per_s: f64,
    /// The peer's median run.
    peer_median_msgs_per_s: f64,
    /// `median_msgs_per_s / peer_median_msgs_per_s`.
    median_ratio: f64,
    /// Every run, in the order they ran.
    runs: Vec<Run>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let schema = format!("peer_bench_{:016x}", fastrand::u64(..));
    let admin = Admin::connect(&args.url, &schema).await?;
    let measured = tokio::select! {
        measured = measure(&args, &admin, &schema) => measured,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let dropped = admin.drop_schema(&schema).await;
    let report = measured?;
    dropped?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report.print();
    }
    Ok(())
}

/// Opens both sides in `schema` (which exists), runs the rounds, closes both.
async fn measure(args: &Args, admin: &Admin, schema: &str) -> anyhow::Result<Report> {
    let ours = ours::Ours::open(&args.url, schema, args.batch, args.delete_on_publish).await?;
    let peer =
        match peer::PeerOutbox::open(&args.url, schema, args.batch, args.peer_async_commit).await {
            Ok(peer) => peer,
            Err(error) => {
                ours.close().await;
                return Err(error);
            }
        };
    let runs = rounds(args, &admin.pool, &ours, &peer).await;
    ours.close().await;
    peer.close().await;
    let runs = runs?;
    let stat = |side, of: fn(Vec<f64>) -> f64| {
        of(runs
            .iter()
            .filter(|run| run.side == side)
            .map(|run| run.msgs_per_s)
            .collect())
    };
    let ratio = |part: f64, whole: f64| if whole > 0.0 { part / whole } else { 0.0 };
    let (best_ours, best_peer) = (stat(Side::Oncebox, best), stat(Side::Peer, best));
    let (median_ours, median_peer) = (stat(Side::Oncebox, median), stat(Side::Peer, median));
    Ok(Report {
        bench: "peer",
        peer: peer::NAME,
        schema: schema.to_owned(),
        messages: args.messages,
        batch: args.batch,
        keys: args.keys,
        delete_on_publish: args.delete_on_publish,
        peer_async_commit: args.peer_async_commit,
        msgs_per_s: best_ours,
        peer_msgs_per_s: best_peer,
        ratio: ratio(best_ours, best_peer),
        median_msgs_per_s: median_ours,
        peer_median_msgs_per_s: median_peer,
        median_ratio: ratio(median_ours, median_peer),
        runs,
    })
}

/// The rounds: in odd ones oncebox runs first, in even ones the peer.
async fn rounds(
    args: &Args,
    admin: &PgPool,
    ours: &ours::Ours,
    peer: &peer::PeerOutbox,
) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    for round in 1..=args.rounds {
        let mut sides = [Side::Oncebox, Side::Peer];
        if round % 2 == 0 {
            sides.reverse();
        }
        for side in sides {
            let broker = MemoryBroker::new();
            let run = match side {
                Side::Oncebox => run_once(ours, admin, &broker, args, round).await?,
                Side::Peer => run_once(peer, admin, &broker, args, round).await?,
            };
            check(&broker, side, args.messages)?;
            // The progress line of `oncebox-bench`'s throughput benches.
            if !args.json {
                eprintln!(
                    "  round {round} {:<8} {:>10.0} msg/s  ({:.2} s)",
                    side.name(),
                    run.msgs_per_s,
                    run.seconds
                );
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

/// One side of the comparison: an outbox table that a relay drains.
trait Contender {
    /// Its table, as the bench's own connection names it.
    fn table(&self) -> &str;
    /// Fills the (empty) table with `messages` messages over `keys` ordering keys (where
    /// the side has keys).
    async fn prefill(&self, messages: u64, keys: u32) -> anyhow::Result<()>;
    /// Times the relay draining the table into `broker`.
    async fn drain(&self, broker: &MemoryBroker, round: u32) -> anyhow::Result<Run>;
}

/// One run of `side`: fill its table, vacuum and checkpoint, time the drain, empty the
/// table.
async fn run_once(
    side: &impl Contender,
    admin: &PgPool,
    broker: &MemoryBroker,
    args: &Args,
    round: u32,
) -> anyhow::Result<Run> {
    side.prefill(args.messages, args.keys).await?;
    settle(admin, side.table()).await?;
    let run = side.drain(broker, round).await?;
    empty(admin, side.table()).await?;
    Ok(run)
}

/// The broker received `messages` messages, each once.
fn check(broker: &MemoryBroker, side: Side, messages: u64) -> anyhow::Result<()> {
    let published = broker.published(workload::TOPIC);
    let distinct: HashSet<_> = published.iter().map(|message| message.id).collect();
    anyhow::ensure!(
        published.len() as u64 == messages && distinct.len() == published.len(),
        "{} published {} messages ({} distinct) of {messages}",
        side.name(),
        published.len(),
        distinct.len()
    );
    Ok(())
}

fn best(rates: Vec<f64>) -> f64 {
    rates.into_iter().fold(0.0, f64::max)
}

/// The middle rate (the mean of the two middle ones for an even count); 0 for none.
fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    match rates.len() {
        0 => 0.0,
        n if n % 2 == 1 => rates[n / 2],
        n => (rates[n / 2 - 1] + rates[n / 2]) / 2.0,
    }
}

impl Report {
    fn print(&self) {
        println!(
            "peer · PostgreSQL → memory · {} messages · batch {} · {} keys (oncebox's) · oncebox {} published rows · peer commits {}",
            self.messages,
            self.batch,
            self.keys,
            if self.delete_on_publish {
                "deletes"
            } else {
                "marks done"
            },
            if self.peer_async_commit {
                "without waiting for the WAL flush"
            } else {
                "waiting for the WAL flush"
            }
        );
        println!(
            "  best:   oncebox {:.0} msg/s · {} {:.0} msg/s · oncebox / peer {:.2}",
            self.msgs_per_s, self.peer, self.peer_msgs_per_s, self.ratio
        );
        println!(
            "  median: oncebox {:.0} msg/s · {} {:.0} msg/s · oncebox / peer {:.2}",
            self.median_msgs_per_s, self.peer, self.peer_median_msgs_per_s, self.median_ratio
        );
    }
}

/// Connects with `search_path` set to `schema`, for the bench's own statements and the
/// peer's connections.
fn connect_options(url: &str, schema: &str) -> anyhow::Result<PgConnectOptions> {
    Ok(PgConnectOptions::from_str(url)
        .context("parsing the PostgreSQL URL")?
        .options([("search_path", schema)]))
}

/// The run's schema and the statements around the timed part, on a connection of the
/// bench's own.
struct Admin {
    pool: PgPool,
}

impl Admin {
    /// Connects and creates `schema`.
    async fn connect(url: &str, schema: &str) -> anyhow::Result<Self> {
        let options = connect_options(url, schema)?;
        // One connection first: a pool reports a server it cannot reach as a timeout,
        // a connection says why.
        PgConnection::connect_with(&options)
            .await
            .context("connecting to PostgreSQL")?
            .close()
            .await?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .context("connecting to PostgreSQL")?;
        sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
            .execute(&pool)
            .await
            .with_context(|| format!("creating schema {schema}"))?;
        Ok(Self { pool })
    }

    async fn drop_schema(self, schema: &str) -> anyhow::Result<()> {
        let dropped = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .execute(&self.pool)
            .await
            .with_context(|| format!("dropping schema {schema}"));
        self.pool.close().await;
        dropped.map(drop)
    }
}

/// The same start for every run: `table` (filled) vacuumed, its statistics and
/// visibility map fresh, and no checkpoint debt left to the timed part where the server
/// allows a `CHECKPOINT` (a role without the right runs without it, with a warning).
async fn settle(pool: &PgPool, table: &str) -> anyhow::Result<()> {
    sqlx::raw_sql(&format!("VACUUM (ANALYZE) {table}"))
        .execute(pool)
        .await
        .with_context(|| format!("vacuuming {table}"))?;
    if let Err(error) = sqlx::raw_sql("CHECKPOINT").execute(pool).await {
        eprintln!("oncebox-peer-bench: CHECKPOINT refused ({error}); runs may differ more");
    }
    Ok(())
}

/// Empties `table` after a run.
async fn empty(pool: &PgPool, table: &str) -> anyhow::Result<()> {
    sqlx::raw_sql(&format!("TRUNCATE {table}"))
        .execute(pool)
        .await
        .with_context(|| format!("emptying {table}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_or_the_mean_of_the_two_middle_rates() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
