//! `oncebox chaos`: the order → payment system of `oncebox demo`, but as real processes
//! on a real PostgreSQL and a real broker, under faults from a seeded plan, ending with
//! an audit.
//!
//! - The **order service** (in this process) writes each order and its `OrderPlaced`
//!   event in one transaction, at `--rate` orders per second, one writer per share of the
//!   customers so that each customer's orders commit in order. A commit whose reply was
//!   lost is recognised, not written twice.
//! - `--relays` **`oncebox relay`** processes publish the outbox (`FOR UPDATE SKIP
//!   LOCKED` claims with leases, per-key order).
//! - `--consumers` **payment processes** (`oncebox chaos-payments`) charge each order
//!   through the transactional inbox, in their own database transaction.
//! - **Faults**, drawn from `--seed` before the run: SIGKILL of relays and payment
//!   processes (started again at once), SIGSTOP past the relays' lease then SIGCONT,
//!   `pg_terminate_backend` of the relays' connections, one process's connections to
//!   PostgreSQL or the broker cut, stalled past the lease or slowed (each process reaches
//!   them through TCP proxies of its own; Kafka's clients follow the addresses of its
//!   metadata, so only their database link is proxied), and restarts of the broker and
//!   of PostgreSQL by the commands given (`scripts/services.sh restart nats` …).
//!
//! The **audit** then counts each order's charges (exactly once, never, twice, charges
//! of orders never committed) and reads the topic back from the broker in its log order:
//! every order published, each customer's orders in commit order by their first copy.
//! The run exits non-zero on any violation. Everything it made (a PostgreSQL schema, the
//! NATS stream, temporary files) is removed at the end unless `--keep`.

mod fleet;
mod payments;
mod plan;
mod shop;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use oncebox::postgres::PgStore;
use oncebox::{Delivery as _, Subscriber as _};
use serde::Serialize;
use sqlx::AssertSqlSafe;

pub(crate) use payments::{PaymentsArgs, run as payments};
use plan::{Fault, PlanSpec};
use shop::{Ledger, OrderPlaced};

use crate::config::{Config, Overrides};
use crate::service::backend::Broker;

/// The relays' lease: short, so that a pause outlasts it within a short run.
const LEASE: Duration = Duration::from_secs(4);

/// How long a cut link refuses connections.
const CUT: Duration = Duration::from_secs(3);

/// How long a slowed link stays slow.
const SLOW: Duration = Duration::from_secs(10);

/// Order writers, each owning a share of the customers.
const WRITERS: u32 = 8;

/// Flags of `oncebox chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ChaosArgs {
    /// PostgreSQL URL (the run works in a schema of its own and drops it).
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = crate::bench::DEFAULT_PG_URL, hide_env_values = true)]
    database_url: String,
    /// The broker: nats://…, amqp://…, kafka://HOST:PORT, redis://….
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    broker_url: String,
    /// Orders placed.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    orders: u64,
    /// Customers, that is ordering keys.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    customers: u32,
    /// Orders placed per second.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: u32,
    /// `oncebox relay` processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=32))]
    relays: u32,
    /// Payment processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=32))]
    consumers: u32,
    /// SIGKILLs of relays and payment processes, at random instants.
    #[arg(long, default_value_t = 10)]
    kills: u32,
    /// SIGSTOPs longer than the relays' lease, then SIGCONT.
    #[arg(long, default_value_t = 2)]
    pauses: u32,
    /// `pg_terminate_backend` of every relay connection.
    #[arg(long, default_value_t = 2)]
    terminations: u32,
    /// One process's connections to PostgreSQL or the broker dropped, and new ones
    /// closed, for 3 s.
    #[arg(long, default_value_t = 2)]
    cuts: u32,
    /// One process's connections to PostgreSQL or the broker held open with nothing
    /// forwarded, for twice the relays' lease.
    #[arg(long, default_value_t = 2)]
    stalls: u32,
    /// One process's connections to PostgreSQL or the broker slowed (each chunk 50 ms
    /// late), for 10 s.
    #[arg(long, default_value_t = 2)]
    slowdowns: u32,
    /// Shell command that restarts the broker (with `--broker-restarts`).
    #[arg(long, value_name = "COMMAND")]
    restart_broker: Option<String>,
    /// Broker restarts.
    #[arg(long, default_value_t = 0, requires = "restart_broker")]
    broker_restarts: u32,
    /// Shell command that restarts PostgreSQL (with `--postgres-restarts`).
    #[arg(long, value_name = "COMMAND")]
    restart_postgres: Option<String>,
    /// PostgreSQL restarts.
    #[arg(long, default_value_t = 0, requires = "restart_postgres")]
    postgres_restarts: u32,
    /// How long after the last order every order must be charged.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Seed of the fault plan (timing still varies from run to run).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the schema, the broker's topic and the processes' logs.
    #[arg(long)]
    keep: bool,
    /// Print one JSON object with the audit on stdout instead of a report.
    #[arg(long)]
    json: bool,
}

/// The audit of a run.
#[derive(Debug, Serialize)]
struct ChaosReport {
    passed: bool,
    seed: u64,
    broker: &'static str,
    orders: u64,
    relays: u32,
    consumers: u32,
    seconds: f64,
    /// What the charges show.
    ledger: Ledger,
    /// What the broker's log shows.
    published: Published,
    /// Faults injected, by kind.
    faults: BTreeMap<&'static str, u64>,
    /// Processes that exited by themselves and were started again.
    unplanned_exits: u64,
    /// Failed attempts of the order service (each retried until committed).
    order_retries: u64,
    /// Where the logs are, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    logs: Option<PathBuf>,
    /// The PostgreSQL schema of the run, when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    schema: Option<String>,
}

/// The topic read back from the broker, in log order.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Published {
    /// Distinct orders found.
    orders: u64,
    /// Copies beyond the first (republished after a crash or a lost lease).
    duplicates: u64,
    /// Committed orders not found.
    missing: u64,
    /// Orders whose first copy came after a later order of the same customer.
    out_of_order: u64,
    /// Messages on the topic that are not orders.
    unreadable: u64,
}

impl ChaosReport {
    fn violations(&self) -> Vec<String> {
        let l = &self.ledger;
        let p = &self.published;
        let mut found = Vec::new();
        let mut check = |n: u64, what: &str| {
            if n > 0 {
                found.push(format!("{n} {what}"));
            }
        };
        check(l.never_charged, "orders never charged");
        check(l.charged_twice, "orders charged more than once");
        check(l.phantom_charges, "charges of orders never committed");
        check(p.missing, "committed orders missing from the broker");
        check(p.unreadable, "messages on the topic that are not orders");
        check(
            p.out_of_order,
            "orders published before an earlier order of their customer",
        );
        if l.committed != self.orders {
            found.push(format!(
                "{} orders committed, {} placed",
                l.committed, self.orders
            ));
        }
        found
    }
}

/// Runs `oncebox chaos` and prints its audit.
pub(crate) async fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let schema = format!("chaos_{:012x}", fastrand::u64(..) >> 16);
    let store = PgStore::connect(&args.database_url)
        .await
        .with_context(|| {
            format!(
                "connecting to PostgreSQL at {}",
                crate::bench::redact(&args.database_url)
            )
        })?
        .with_schema(&schema)?;
    store.migrate().await.context("creating oncebox's tables")?;
    let dir = tempfile::Builder::new()
        .prefix("oncebox-chaos-")
        .tempdir()?;
    let outcome = run_in(&args, seed, &store, dir.path().to_owned()).await;
    let keep = args.keep || !matches!(&outcome, Ok(report) if report.passed);
    let logs = if keep {
        let path = dir.keep();
        Some(path)
    } else {
        None
    };
    // A failed run keeps its schema too: the evidence.
    if !keep && let Err(error) = drop_schema(&store).await {
        eprintln!("oncebox chaos: {error:#}");
    }
    let mut report = outcome?;
    if keep {
        report.schema = Some(store.schema().to_owned());
    }
    report.logs = logs;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn drop_schema(store: &PgStore) -> anyhow::Result<()> {
    let schema = store.schema();
    sqlx::raw_sql(AssertSqlSafe(format!(
        r#"SET lock_timeout = '30s'; DROP SCHEMA IF EXISTS "{schema}" CASCADE"#
    )))
    .execute(store.pool())
    .await
    .with_context(|| format!("dropping schema {schema}"))?;
    Ok(())
}

/// The configuration file of the relays and the payment processes.
fn config_toml(args: &ChaosArgs, schema: &str) -> anyhow::Result<(String, &'static str)> {
    let scheme = args.broker_url.split("://").next().unwrap_or_default();
    let (broker, isolation) = match scheme {
        "nats" => (
            "nats",
            format!("subject_prefix = \"{schema}.\"\nstream = \"{schema}\"\n"),
        ),
        "amqp" | "amqps" => ("rabbitmq", format!("exchange = \"{schema}\"\n")),
        "kafka" => ("kafka", String::new()),
        "redis" | "rediss" => ("redis", format!("key_prefix = \"{schema}:\"\n")),
        _ => anyhow::bail!("--broker-url: nats://, amqp://, kafka:// or redis://, not {scheme}://"),
    };
    // The relays' connections carry a name of their own, so that the run can terminate
    // them and them only.
    let store_url = named_store_url(&args.database_url, &format!("{schema}-relay"));
    let (broker_url, password) = split_password(&args.broker_url);
    let password = password.map_or_else(String::new, |p| format!("password = {p:?}\n"));
    let toml = format!(
        r#"[store]
url = "{store_url}"
schema = "{schema}"
pool_size = 8

[broker]
url = "{broker_url}"
{password}{isolation}
[topics]
orders = "{schema}-orders"

[relay]
lease = "{lease}s"
publish_timeout = "2s"
retry_initial = "100ms"
retry_max = "2s"
max_attempts = 1000
poll_max = "200ms"
stop_timeout = "5s"

[receive]
consumer = "{schema}-payments"

[http]
listen = "off"
"#,
        lease = LEASE.as_secs(),
    );
    Ok((toml, broker))
}

/// `url` with connections named `name` (PostgreSQL's `application_name`).
fn named_store_url(url: &str, name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

/// `text` without its password, and the password (decoded): the services take it as a
/// setting of their own, never in a URL. The inverse of `config::url::with_password`.
fn split_password(text: &str) -> (String, Option<String>) {
    match ::url::Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let password = url.password().map(|p| {
                percent_encoding::percent_decode_str(p)
                    .decode_utf8_lossy()
                    .into_owned()
            });
            // A URL with a password has an authority, so removing it cannot fail.
            let _ = url.set_password(None);
            (url.to_string(), password)
        }
        _ => (text.to_owned(), None),
    }
}

async fn run_in(
    args: &ChaosArgs,
    seed: u64,
    store: &PgStore,
    dir: PathBuf,
) -> anyhow::Result<ChaosReport> {
    let schema = store.schema().to_owned();
    shop::create_tables(store).await?;
    let (toml, broker_kind) = config_toml(args, &schema)?;
    let config_path = dir.join("oncebox.toml");
    // The file may hold the broker's password: readable by its owner only.
    std::fs::write(&config_path, toml)?;
    std::fs::set_permissions(
        &config_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let config = Config::load(&Overrides {
        config: Some(config_path.clone()),
        store_url: None,
        broker_url: None,
        listen: None,
    })?;
    let topic = format!("{schema}-orders");
    let audit_group = format!("{schema}-audit");
    let broker = Broker::connect(&config).await?;
    create_topic(&broker, &topic).await?;
    // A RabbitMQ queue only gets what is published after it is bound: the payment
    // service's queue and the audit's are made before the first publish. (Elsewhere a
    // new group starts at the beginning of the topic, and a Kafka member subscribed and
    // dropped here would hold its partitions until its session timed out.)
    if broker.kind() == "rabbitmq" {
        for group in [&config.receive.consumer, &audit_group] {
            drop(broker.subscriber(&topic, group).await?);
        }
    }

    let window = Duration::from_secs_f64(args.orders as f64 / f64::from(args.rate));
    let spec = PlanSpec {
        window,
        relays: args.relays as usize,
        consumers: args.consumers as usize,
        kills: args.kills,
        pauses: args.pauses,
        pause: LEASE * 2,
        terminations: args.terminations,
        cuts: (args.cuts, CUT),
        stalls: (args.stalls, LEASE * 2),
        slowdowns: (args.slowdowns, SLOW),
        broker_link: broker_kind != "kafka",
        broker_restarts: args.broker_restarts,
        postgres_restarts: args.postgres_restarts,
    };
    let faults = plan::plan(&spec, seed);
    let exe = std::env::current_exe().context("finding the oncebox binary")?;
    let targets = fleet::Targets {
        relay_store_url: named_store_url(&args.database_url, &format!("{schema}-relay")),
        payments_store_url: named_store_url(&args.database_url, &format!("{schema}-payments")),
        broker_url: spec.broker_link.then(|| split_password(&args.broker_url).0),
    };
    let mut fleet = fleet::Fleet::start(
        exe,
        config_path,
        dir.clone(),
        topic.clone(),
        &targets,
        args.relays as usize,
        args.consumers as usize,
    )
    .await?;
    let progress = !args.json;
    if progress {
        eprintln!(
            "chaos · {broker_kind} · {} orders at {}/s · {} relays · {} payment processes · {} faults · seed {seed} · logs in {}",
            args.orders,
            args.rate,
            args.relays,
            args.consumers,
            faults.len(),
            fleet.logs().display()
        );
    }

    let started = Instant::now();
    let placed = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let orders = tokio::spawn(place_orders(
        store.clone(),
        args.orders,
        args.customers,
        args.rate,
        Arc::clone(&placed),
        Arc::clone(&retries),
    ));
    let mut injected: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut due = faults.into_iter().peekable();
    let result = async {
        // Faults, while the orders are placed.
        while !orders.is_finished() || due.peek().is_some() {
            while let Some((at, fault)) = due.next_if(|(at, _)| started + *at <= Instant::now()) {
                if progress {
                    let whom = fault
                        .process()
                        .map(|(role, index)| format!(" ({} {index})", fleet::name(role)))
                        .unwrap_or_default();
                    eprintln!("  {:>7.1} s  {}{whom}", at.as_secs_f64(), fault.kind());
                }
                inject(&mut fleet, fault, args, store, &schema).await?;
                *injected.entry(fault.kind()).or_default() += 1;
            }
            tokio::task::block_in_place(|| fleet.tick())?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let placed_at = started.elapsed();
        if progress {
            eprintln!(
                "  {:>7.1} s  all orders placed; draining",
                placed_at.as_secs_f64()
            );
        }
        // The drain: every committed order charged, or no progress for the timeout.
        let mut last = (0, Instant::now());
        loop {
            let charged = shop::charged(store).await?;
            if charged >= args.orders {
                break;
            }
            if charged > last.0 {
                last = (charged, Instant::now());
            } else if last.1.elapsed() > args.drain_timeout {
                break;
            }
            tokio::task::block_in_place(|| fleet.tick())?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::Ok(())
    }
    .await;
    let seconds = started.elapsed().as_secs_f64();
    orders.abort();
    let unplanned_exits = fleet.unplanned_exits;
    tokio::task::block_in_place(|| fleet.stop(Duration::from_secs(15)));
    result?;

    let ledger = shop::ledger(store).await?;
    // A connection of its own for the audit: the setup's went through the broker's
    // restarts, and a Redis connection reports the first command after one as failed.
    drop(broker);
    let broker = Broker::connect(&config).await?;
    let published = read_back(&broker, &topic, &audit_group, &ledger).await?;
    let mut report = ChaosReport {
        passed: false,
        seed,
        broker: broker_kind,
        orders: args.orders,
        relays: args.relays,
        consumers: args.consumers,
        seconds,
        ledger,
        published,
        faults: injected,
        unplanned_exits,
        order_retries: retries.load(Ordering::Relaxed),
        logs: None,
        schema: None,
    };
    report.passed = report.violations().is_empty();
    // A failed run keeps its topic, as it keeps its schema and logs.
    if report.passed
        && !args.keep
        && let Err(error) = remove_topic(
            &broker,
            &args.broker_url,
            &schema,
            &topic,
            &[&config.receive.consumer, &audit_group],
        )
        .await
    {
        eprintln!("oncebox chaos: {error:#}");
    }
    Ok(report)
}

/// The order service: `orders` orders spread over `customers` customers, order `i` due
/// at `i / rate` seconds; writer `w` places the orders of the customers `c` with
/// `c % WRITERS == w`, one at a time, so each customer's orders commit in order.
async fn place_orders(
    store: PgStore,
    orders: u64,
    customers: u32,
    rate: u32,
    placed: Arc<AtomicU64>,
    retries: Arc<AtomicU64>,
) {
    let outbox = store.outbox();
    let start = tokio::time::Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let (store, outbox) = (store.clone(), outbox.clone());
        let (placed, retries) = (Arc::clone(&placed), Arc::clone(&retries));
        writers.spawn(async move {
            for i in 0..orders {
                let customer = u32::try_from(i % u64::from(customers)).unwrap_or(0);
                if customer % WRITERS != writer {
                    continue;
                }
                let due = start + Duration::from_secs_f64(i as f64 / f64::from(rate));
                tokio::time::sleep_until(due).await;
                let seq = i64::try_from(i / u64::from(customers)).unwrap_or(i64::MAX) + 1;
                let order = OrderPlaced::new(customer, seq);
                let failed = shop::place(&store, &outbox, &order).await;
                retries.fetch_add(failed, Ordering::Relaxed);
                placed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while writers.join_next().await.is_some() {}
}

/// Injects `fault`.
async fn inject(
    fleet: &mut fleet::Fleet,
    fault: Fault,
    args: &ChaosArgs,
    store: &PgStore,
    schema: &str,
) -> anyhow::Result<()> {
    match fault {
        Fault::Kill { role, index } => tokio::task::block_in_place(|| fleet.kill(role, index)),
        Fault::Pause {
            role,
            index,
            millis,
        } => fleet.pause(role, index, Duration::from_millis(millis)),
        Fault::TerminateRelayConnections => {
            let terminated: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(format!("{schema}-relay"))
            .fetch_all(store.pool())
            .await
            .context("terminating the relays' connections")?;
            tracing::info!(
                connections = terminated.len(),
                "terminated the relays' connections"
            );
            Ok(())
        }
        Fault::Link {
            role,
            index,
            link,
            trouble,
            millis,
        } => fleet.trouble(role, index, link, trouble, Duration::from_millis(millis)),
        Fault::RestartBroker => restart(args.restart_broker.as_deref()).await,
        Fault::RestartPostgres => restart(args.restart_postgres.as_deref()).await,
    }
}

/// Runs a restart command with `sh -c`.
async fn restart(command: Option<&str>) -> anyhow::Result<()> {
    let command = command.context("a restart was planned without its command")?;
    let status = tokio::process::Command::new("sh")
        .args(["-c", command])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .with_context(|| format!("running {command:?}"))?;
    anyhow::ensure!(status.success(), "{command:?} failed: {status}");
    Ok(())
}

/// How long the audit's reader waits for its first delivery: a new Kafka consumer group
/// is assigned its partitions only after the group's join (seconds on tansu, more while
/// it is busy).
const FIRST_DELIVERY: Duration = Duration::from_secs(60);

/// How long the audit's reader waits for the next delivery once deliveries flow.
const NEXT_DELIVERY: Duration = Duration::from_secs(5);

/// Reads the topic back in the broker's order with a reader of its own, until every
/// committed order was found or nothing more came (see [`FIRST_DELIVERY`],
/// [`NEXT_DELIVERY`]).
async fn read_back(
    broker: &Broker,
    topic: &str,
    group: &str,
    ledger: &Ledger,
) -> anyhow::Result<Published> {
    let mut reader = broker.subscriber(topic, group).await?;
    let mut first: HashSet<String> = HashSet::new();
    let mut last_seq: HashMap<String, i64> = HashMap::new();
    let mut published = Published::default();
    while (first.len() as u64) < ledger.committed {
        let wait = if first.is_empty() {
            FIRST_DELIVERY
        } else {
            NEXT_DELIVERY
        };
        let delivery = match tokio::time::timeout(wait, reader.next()).await {
            Ok(delivery) => delivery?,
            Err(_) => break,
        };
        let order: Option<OrderPlaced> = delivery.received().payload_json().ok();
        delivery.ack().await?;
        let Some(order) = order else {
            published.unreadable += 1;
            continue;
        };
        if !first.insert(order.order_id.clone()) {
            published.duplicates += 1;
            continue;
        }
        let last = last_seq.entry(order.customer).or_insert(0);
        if order.seq <= *last {
            published.out_of_order += 1;
        }
        *last = (*last).max(order.seq);
    }
    published.orders = first.len() as u64;
    published.missing = ledger.committed.saturating_sub(published.orders);
    Ok(published)
}

/// Kafka's topics are not created by publishing to them: the run's is made here, with
/// partitions for the customers to spread over.
async fn create_topic(broker: &Broker, topic: &str) -> anyhow::Result<()> {
    #[cfg(feature = "kafka")]
    if let Broker::Kafka(options) = broker {
        oncebox::kafka::KafkaAdmin::new(options.clone())?
            .create_topic(topic, 3, 1)
            .await
            .with_context(|| format!("creating topic {topic}"))?;
    }
    let _ = (broker, topic);
    Ok(())
}

/// Removes what the run made on the broker at `url`: the NATS stream, the Kafka topic,
/// the Redis streams, or RabbitMQ's exchange and the queues of `groups`.
async fn remove_topic(
    broker: &Broker,
    url: &str,
    schema: &str,
    topic: &str,
    groups: &[&str],
) -> anyhow::Result<()> {
    let _ = (url, schema, topic, groups);
    match broker {
        Broker::RedisStreams(streams) => {
            let keys = [streams.stream_key(topic), streams.dead_letter_key(topic)];
            let mut connection = streams.connection().clone();
            oncebox::redis::redis::cmd("DEL")
                .arg(&keys)
                .query_async::<()>(&mut connection)
                .await
                .with_context(|| format!("deleting stream {}", keys[0]))?;
        }
        #[cfg(feature = "kafka")]
        Broker::Kafka(options) => {
            oncebox::kafka::KafkaAdmin::new(options.clone())?
                .delete_topics(&[topic])
                .await
                .with_context(|| format!("deleting topic {topic}"))?;
        }
        #[cfg(feature = "nats")]
        Broker::Nats(transport) => {
            oncebox::nats::async_nats::jetstream::new(transport.client().clone())
                .delete_stream(schema)
                .await
                .with_context(|| format!("deleting stream {schema}"))?;
        }
        #[cfg(feature = "rabbitmq")]
        Broker::RabbitMq(_) => {
            use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
            let connection =
                lapin::Connection::connect(url, lapin::ConnectionProperties::default())
                    .await
                    .context("connecting to RabbitMQ")?;
            let channel = connection.create_channel().await?;
            for group in groups {
                for queue in [
                    (*group).to_owned(),
                    oncebox::rabbitmq::dead_queue_name(group),
                ] {
                    channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await
                        .with_context(|| format!("deleting queue {queue}"))?;
                }
            }
            channel
                .exchange_delete(schema.into(), ExchangeDeleteOptions::default())
                .await
                .with_context(|| format!("deleting exchange {schema}"))?;
            let _ = connection.close(200, "done".into()).await;
        }
    }
    Ok(())
}

fn print(report: &ChaosReport) {
    let l = &report.ledger;
    let p = &report.published;
    println!(
        "chaos · {} · {} orders · {} relays · {} payment processes · seed {} · {:.1} s",
        report.broker, report.orders, report.relays, report.consumers, report.seed, report.seconds
    );
    let faults: Vec<String> = report
        .faults
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!("  faults: {}", faults.join(" · "));
    println!(
        "  unplanned exits {} · order service retries {}",
        report.unplanned_exits, report.order_retries
    );
    println!(
        "  charges: {} committed · {} charged once · {} never · {} twice · {} phantom · {} out of order at the payment service",
        l.committed,
        l.charged_once,
        l.never_charged,
        l.charged_twice,
        l.phantom_charges,
        l.charged_out_of_order
    );
    println!(
        "  broker: {} orders · {} duplicates · {} missing · {} out of order · {} not orders",
        p.orders, p.duplicates, p.missing, p.out_of_order, p.unreadable
    );
    let violations = report.violations();
    if violations.is_empty() {
        println!("  PASSED: every committed order charged exactly once, published in order");
    } else {
        println!("  FAILED: {}", violations.join("; "));
    }
    if let Some(logs) = &report.logs {
        println!("  logs: {}", logs.display());
    }
    if let Some(schema) = &report.schema {
        println!("  tables: schema {schema}");
    }
}

#[cfg(test)]
mod tests {
    use super::split_password;

    #[test]
    fn a_password_leaves_the_url_decoded() {
        assert_eq!(
            split_password("amqp://guest:p%40ss@127.0.0.1:5672/%2f"),
            (
                "amqp://guest@127.0.0.1:5672/%2f".to_owned(),
                Some("p@ss".to_owned())
            )
        );
        for bare in [
            "nats://127.0.0.1:4222",
            "kafka://127.0.0.1:9092",
            "redis://u@h:1",
        ] {
            assert_eq!(split_password(bare), (bare.to_owned(), None));
        }
    }
}
