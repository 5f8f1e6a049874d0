//! `oncebox-bench chaos`: the order → payment system of `oncebox demo`, but as real
//! processes on a real PostgreSQL and a real broker, under faults from a seeded plan,
//! ending with an audit.
//!
//! - The **order service** (in this process) writes each order and its `OrderPlaced`
//!   event in one transaction, at `--rate` orders per second, one writer per share of the
//!   customers so that each customer's orders commit in order. A commit whose reply was
//!   lost is recognised, not written twice.
//! - `--relays` **`oncebox relay`** processes publish the outbox: with `--relay poll`,
//!   `FOR UPDATE SKIP LOCKED` claims with leases; with `--relay cdc-messages` or
//!   `cdc-table`, by tailing the log through one replication slot that one of them reads
//!   while the others stand by (the order service then emits a logical decoding message,
//!   or inserts an outbox row, in each order's transaction). Each is this binary's
//!   `oncebox-bench oncebox relay`: the `oncebox` command from its library, so the run
//!   always exercises the relay built with it.
//! - `--consumers` **payment processes** (`oncebox-bench chaos-payments`) charge each
//!   order through the transactional inbox, in their own database transaction.
//! - **Faults**, drawn from `--seed` before the run: SIGKILL of relays (with CDC, the
//!   reader or a standby) and payment processes (started again at once), SIGSTOP past
//!   the relays' lease then SIGCONT, `pg_terminate_backend` of the relays' connections
//!   (with CDC, of the slot's walsender too, or alone), one process's connections to
//!   PostgreSQL or the broker cut, stalled past the lease or slowed (each process reaches
//!   them through TCP proxies of its own, its replication connection too; Kafka's
//!   clients follow the addresses of its metadata, so only their database link is
//!   proxied), and restarts of the broker and of PostgreSQL by the commands given
//!   (`scripts/services.sh restart nats` …), and a failover of PostgreSQL to its standby
//!   by the command given (`scripts/pg-pair.sh failover DIR`): every process, and the
//!   order service, reaches PostgreSQL through an address of the run's own that moves
//!   to the standby once the command promoted it.
//!
//! The **audit** then counts each order's charges (exactly once, never, twice, charges
//! of orders never committed) and reads the topic back from the broker in its log order:
//! every order published, each customer's orders in commit order by their first copy.
//! With CDC it also checks that the slot's confirmed position passed the last order's
//! commit once the run drained (nothing pinned) and, with the table source, that no
//! published row was left in the table. The run exits non-zero on any violation.
//! Everything it made (a PostgreSQL schema, the replication slot and its publication,
//! the NATS stream, temporary files) is removed at the end unless `--keep`.

mod cdc;
mod cluster;
mod config;
mod failover;
pub(crate) mod fleet;
mod payments;
mod plan;
mod report;
mod shop;
mod soak;
mod strike;
mod topic;

pub(crate) use soak::rss_kib;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use oncebox::postgres::PgStore;
use sqlx::AssertSqlSafe;

use cdc::RelayKind;
pub(crate) use config::split_password;
use config::{
    POOL_SIZE, config_toml, is_redis_cluster, named_store_url, relay_name_prefix, run_topic,
};
pub(crate) use payments::{PaymentsArgs, run as payments};
use plan::PlanSpec;
use report::{ChaosReport, print};
use shop::EventOutbox;
use topic::{create_topic, read_back, remove_topic};

use oncebox_cli::{Broker, Config, Overrides};

/// The relays' lease: short, so that a pause outlasts it within a short run.
const LEASE: Duration = Duration::from_secs(4);

/// How long a cut link refuses connections.
const CUT: Duration = Duration::from_secs(3);

/// How long a slowed link stays slow.
const SLOW: Duration = Duration::from_secs(10);

/// How long a fault that strikes the slot's reader (or its walsender) waits for one,
/// after a kill or a restart that left none for a moment.
const READER_WAIT: Duration = Duration::from_secs(5);

/// Flags of `oncebox-bench chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ChaosArgs {
    /// PostgreSQL URL (the run works in a schema of its own and drops it).
    #[arg(long, env = "ONCEBOX_PG_URL", default_value = crate::bench::DEFAULT_PG_URL, hide_env_values = true)]
    database_url: String,
    /// The broker: nats://…, amqp://…, kafka://HOST:PORT, redis://…, sqs://… (the run's
    /// queue a FIFO queue, credentials from the AWS chain). A NATS cluster
    /// takes its seeds separated by commas (nats://127.0.0.1:4251,nats://127.0.0.1:4252,…),
    /// a RabbitMQ cluster its nodes (amqp://guest:guest@127.0.0.1:5681/%2f,…).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    broker_url: String,
    /// NATS: the servers of the cluster that keep the run's stream (3 for an R3 stream).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=5))]
    stream_replicas: u8,
    /// Orders placed.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    orders: u64,
    /// Customers, that is ordering keys.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    customers: u32,
    /// Orders placed per second.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: u32,
    /// How the relays read the outbox: `poll` claims the table's rows; `cdc-messages`
    /// and `cdc-table` tail PostgreSQL's log through one replication slot (one relay
    /// reads it, the others stand by), for logical decoding messages the order service
    /// emits or for the outbox table's inserts.
    #[arg(long, value_enum, default_value_t = RelayKind::Poll)]
    relay: RelayKind,
    /// `oncebox relay` processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=32))]
    relays: u32,
    /// Payment processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=32))]
    consumers: u32,
    /// SIGKILLs of relays and payment processes, at random instants (with `cdc-*`: of
    /// the reader or a standby).
    #[arg(long, default_value_t = 10)]
    kills: u32,
    /// SIGSTOPs longer than the relays' lease, then SIGCONT (with `cdc-*`: of the
    /// reader or a payment process).
    #[arg(long, default_value_t = 2)]
    pauses: u32,
    /// `pg_terminate_backend` of every relay connection (with `cdc-*`, the walsender
    /// too; every other termination strikes the walsender alone, the first among them).
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
    /// Shell command that fails PostgreSQL over once during the run: kills the primary
    /// and promotes its standby (`scripts/pg-pair.sh failover DIR`; `scripts/services.sh
    /// postgres-pair` makes a pair). Everything reaches PostgreSQL through an address of
    /// the run's own, which then moves to `--standby-url`.
    #[arg(long, value_name = "COMMAND", requires = "standby_url")]
    failover: Option<String>,
    /// The standby that `--failover` promotes.
    #[arg(long, requires = "failover")]
    standby_url: Option<String>,
    /// How long after the last order every order must be charged.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Seed of the fault plan (timing still varies from run to run).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the schema, the broker's topic, the replication slot and the processes'
    /// logs.
    #[arg(long)]
    keep: bool,
    /// Remove what the run made even when its audit fails (a failed run keeps it as
    /// evidence otherwise): for runs expected to fail.
    #[arg(long, conflicts_with = "keep")]
    discard: bool,
    /// Print one JSON object with the audit on stdout instead of a report.
    #[arg(long)]
    json: bool,
    /// Run against the clustered services of `scripts/services.sh postgres-pair
    /// nats-cluster`, from the repository's root: PostgreSQL failed over once to its
    /// synchronous standby, the run's stream on the three NATS nodes with the node
    /// leading it killed twice (unless `--broker-restarts` says otherwise). Sets the
    /// database, the standby, the broker and their commands itself.
    #[arg(long, conflicts_with_all = ["standby_url", "failover", "broker_url", "stream_replicas", "restart_broker"])]
    cluster: bool,
    /// A soak instead of a campaign: orders at `--rate` for this long (`1h`) and no
    /// fault, each relay's and payment process's resident memory, open file descriptors
    /// and database connections sampled every `--sample-every`; the run fails if one of
    /// them grows after the warm-up (the report's soak section says which).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with_all = [
        "orders", "cluster", "failover", "kills", "pauses", "terminations", "cuts", "stalls",
        "slowdowns", "broker_restarts", "postgres_restarts",
    ])]
    soak: Option<Duration>,
    /// How often a soak samples its processes.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, requires = "soak")]
    sample_every: Duration,
}

/// Runs `oncebox-bench chaos` and prints its audit.
pub(crate) async fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let args = if args.cluster {
        cluster::clustered(args)?
    } else {
        args
    };
    let args = match args.soak {
        Some(length) => soak::campaign(args, length)?,
        None => args,
    };
    anyhow::ensure!(
        args.failover.is_none() || !args.relay.is_cdc(),
        "--failover with a log-tailing relay: PostgreSQL 15 carries no logical slot to the \
         standby, so the relays refuse to go on and the run could only fail; \
         oncebox-postgres's tests/failover.rs checks that refusal"
    );
    // With a failover, the database is reached through an address that moves.
    let database = match &args.standby_url {
        Some(standby) => Some(failover::MovingAddress::start(&args.database_url, standby).await?),
        None => None,
    };
    let args = match &database {
        Some(address) => ChaosArgs {
            database_url: address.url().to_owned(),
            ..args
        },
        None => args,
    };
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
    let outcome = run_in(
        &args,
        seed,
        &store,
        database.as_ref(),
        dir.path().to_owned(),
    )
    .await;
    // A slot left behind keeps WAL for good: a failed run drops it too (its confirmed
    // position is in the report), unless asked to keep it.
    if args.relay.is_cdc()
        && !args.keep
        && let Err(error) = cdc::drop_slot(&store, store.schema()).await
    {
        eprintln!("oncebox-bench chaos: {error:#}");
    }
    let keep = args.keep || !(args.discard || matches!(&outcome, Ok(report) if report.passed));
    let logs = if keep {
        let path = dir.keep();
        Some(path)
    } else {
        None
    };
    // A failed run keeps its schema too: the evidence.
    if !keep && let Err(error) = drop_schema(&store).await {
        eprintln!("oncebox-bench chaos: {error:#}");
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

async fn run_in(
    args: &ChaosArgs,
    seed: u64,
    store: &PgStore,
    database: Option<&failover::MovingAddress>,
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
    // The slot exists before the first order, or it would not see it.
    if args.relay.is_cdc() {
        cdc::prepare(&config, store, &args.database_url).await?;
    }
    let topic = run_topic(broker_kind, &schema);
    let payments_group = format!("{schema}-payments");
    let audit_group = format!("{schema}-audit");
    let broker = Broker::connect(&config).await?;
    create_topic(&broker, &topic).await?;
    // A RabbitMQ queue only gets what is published after it is bound: the payment
    // service's queue and the audit's are made before the first publish. (Elsewhere a
    // new group starts at the beginning of the topic, and a Kafka member subscribed and
    // dropped here would hold its partitions until its session timed out.)
    if broker.kind() == "rabbitmq" {
        for group in [&payments_group, &audit_group] {
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
        // Kafka's and Redis Cluster's clients follow the servers' own addresses, and an
        // SQS URL names a region, its endpoint a query parameter: their link faults
        // strike the database.
        broker_link: !matches!(broker_kind, "kafka" | "sqs") && !is_redis_cluster(&args.broker_url),
        broker_restarts: args.broker_restarts,
        postgres_restarts: args.postgres_restarts,
        failovers: u32::from(args.failover.is_some()),
        cdc: args.relay.is_cdc(),
    };
    let faults = plan::plan(&spec, seed);
    // The relays and the payment processes are this binary's hidden commands.
    let exe = std::env::current_exe().context("finding the oncebox-bench binary")?;
    let relay_names = relay_name_prefix(&schema);
    let targets = fleet::Targets {
        relay_store_urls: (0..args.relays)
            .map(|i| named_store_url(&args.database_url, &format!("{relay_names}{i}")))
            .collect(),
        payments_store_url: named_store_url(&args.database_url, &payments_group),
        broker_url: spec.broker_link.then(|| split_password(&args.broker_url).0),
    };
    let mut fleet = fleet::Fleet::start(
        exe,
        config_path,
        dir.clone(),
        topic.clone(),
        payments_group.clone(),
        &targets,
        args.consumers as usize,
    )
    .await?;
    let progress = !args.json;
    if progress {
        eprintln!(
            "chaos · {broker_kind} · {} orders at {}/s · {} relays ({}) · {} payment processes · {} faults · seed {seed} · logs in {}",
            args.orders,
            args.rate,
            args.relays,
            args.relay.name(),
            args.consumers,
            faults.len(),
            fleet.logs().display()
        );
    }
    let slot = args.relay.is_cdc().then(|| schema.clone());
    let mut striker = strike::Striker {
        args,
        store,
        relay_names,
        slot: slot.clone(),
        progress,
        struck: BTreeMap::new(),
        walsenders_terminated: 0,
        database,
        queue: payments_group.clone(),
        redis_key: match &broker {
            Broker::RedisStreams(streams) => Some(streams.stream_key(&topic)),
            _ => None,
        },
    };

    let started = Instant::now();
    let placed = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let outbox = match args.relay {
        RelayKind::CdcMessages => EventOutbox::Messages(store.message_outbox()),
        RelayKind::Poll | RelayKind::CdcTable => EventOutbox::Table(store.outbox()),
    };
    let mut orders = tokio::spawn(shop::place_orders(
        store.clone(),
        outbox,
        args.orders,
        args.customers,
        args.rate,
        Arc::clone(&placed),
        Arc::clone(&retries),
    ));
    let mut due = faults.into_iter().peekable();
    let mut sampler = args
        .soak
        .map(|_| soak::Sampler::new(args.sample_every, u64::from(POOL_SIZE)));
    let mut slot_audit = None;
    let result = async {
        // Faults, while the orders are placed.
        while !orders.is_finished() || due.peek().is_some() {
            while let Some((at, fault)) = due.next_if(|(at, _)| started + *at <= Instant::now()) {
                striker.strike(&mut fleet, at, fault).await?;
            }
            tokio::task::block_in_place(|| fleet.tick())?;
            if let Some(sampler) = &mut sampler {
                sampler.tick(&fleet);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Where the WAL was once the last order committed.
        let last_order_lsn = (&mut orders).await.context("the order service")?;
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
            if let Some(sampler) = &mut sampler {
                sampler.tick(&fleet);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The slot: its confirmed position passes the last order and the end of the
        // drain, with the relays still running.
        if let Some(slot) = &slot {
            let audit = cdc::audit_slot(store, slot, last_order_lsn, &mut fleet).await?;
            if progress {
                eprintln!(
                    "  {:>7.1} s  slot confirmed {} (last order {}, drained {})",
                    started.elapsed().as_secs_f64(),
                    audit.confirmed_lsn.as_deref().unwrap_or("gone"),
                    audit.last_order_lsn,
                    audit.drained_lsn
                );
            }
            slot_audit = Some(audit);
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
    if let Some(audit) = &mut slot_audit {
        (audit.outbox_pending, audit.outbox_dead) = cdc::outbox_rows(store).await?;
        audit.walsenders_terminated = striker.walsenders_terminated;
    }
    // A connection of its own for the audit: the setup's went through the broker's
    // restarts, and a Redis connection reports the first command after one as failed.
    drop(broker);
    let broker = Broker::connect(&config).await?;
    let committed = shop::committed_ids(store).await?;
    // SQS has no consumer groups: the payment processes delete what they consume, and
    // what reached them is read from their side.
    let published = if broker.kind() == "sqs" {
        let unreadable = topic::dead_lettered(&broker, &topic).await?;
        shop::delivered(store, &payments_group, &ledger, unreadable).await?
    } else {
        read_back(&broker, &topic, &audit_group, &committed).await?
    };
    let mut report = ChaosReport {
        passed: false,
        seed,
        broker: broker_kind,
        relay: args.relay,
        orders: args.orders,
        relays: args.relays,
        consumers: args.consumers,
        seconds,
        ledger,
        published,
        slot: slot_audit,
        faults: striker.struck,
        unplanned_exits,
        order_retries: retries.load(Ordering::Relaxed),
        soak: sampler.map(soak::Sampler::report),
        logs: None,
        schema: None,
    };
    report.passed = report.violations().is_empty();
    // A failed run keeps its topic, as it keeps its schema and logs.
    if (report.passed || args.discard)
        && !args.keep
        && let Err(error) = remove_topic(
            &broker,
            &args.broker_url,
            &schema,
            &topic,
            &[&payments_group, &audit_group],
        )
        .await
    {
        eprintln!("oncebox-bench chaos: {error:#}");
    }
    Ok(report)
}
