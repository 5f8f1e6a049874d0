//! `oncebox demo`: an order → payment system on SQLite and the in-process broker, run
//! under injected faults, ending with an audit of every order's charges.
//!
//! - The **order service** writes each order and its `OrderPlaced` event in one
//!   transaction through the outbox; a few checkouts are rolled back late.
//! - The **relay** publishes the outbox through the in-process broker. It is killed at
//!   random between publishing and marking rows published, and restarted.
//! - The **payment service** charges each order through a transactional inbox. It is
//!   killed at random after its commit and before its ack, and restarted.
//! - The **broker** drops, duplicates and delays deliveries and goes down twice.
//!
//! The audit then counts each order's charges. The demo exits non-zero unless every
//! committed order was charged exactly once and no rolled-back order was charged.

mod audit;
mod chaos;
mod shop;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use oncebox::Backoff;
use oncebox::consumer::{Consumer, ConsumerOptions, Outcome, TransactionalInbox};
use oncebox::memory::{Faults, MemoryBroker};
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::sqlite::{SqliteOutbox, SqliteStore};
use serde::Serialize;
use tokio::sync::watch;

use audit::Charges;
use chaos::{CrashSwitch, CrashingPublisher, CrashingSubscriber};
use shop::{ChargeOrder, Checkout, OrderPlaced};

/// What `oncebox demo` was asked to do.
pub(crate) struct DemoConfig {
    pub(crate) orders: u32,
    pub(crate) seed: u64,
    pub(crate) db: Option<PathBuf>,
    pub(crate) json: bool,
}

const TOPIC: &str = "orders";
const CONSUMER: &str = "payments";
/// Customers, that is ordering keys: each customer's orders are published in order.
const CUSTOMERS: u32 = 100;
/// Share of checkouts rolled back after writing the order and its event.
const ROLLBACK_SHARE: f64 = 0.03;

/// Counters the services bump while the demo runs.
#[derive(Default)]
struct Counters {
    placed: AtomicU64,
    rolled_back: AtomicU64,
    handled: AtomicU64,
    duplicates: AtomicU64,
    retries: AtomicU64,
    dead_letters: AtomicU64,
    relay_crashes: AtomicU64,
    consumer_crashes: AtomicU64,
    broker_outages: AtomicU64,
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The JSON report (`--json`).
#[derive(Debug, Serialize)]
struct Report {
    seed: u64,
    orders: u64,
    rolled_back_checkouts: u64,
    charged_once: u64,
    charged_more_than_once: u64,
    never_charged: u64,
    charges_without_order: u64,
    duplicate_deliveries: u64,
    faults_injected: u64,
    faults: FaultCounts,
    published: u64,
    republished: u64,
    deliveries: u64,
    dead_letters: u64,
    elapsed_ms: u64,
    exactly_once: bool,
}

#[derive(Debug, Serialize)]
struct FaultCounts {
    relay_crashes: u64,
    consumer_crashes: u64,
    broker_outages: u64,
    dropped_deliveries: u64,
    duplicated_deliveries: u64,
    delayed_deliveries: u64,
}

impl FaultCounts {
    fn total(&self) -> u64 {
        self.relay_crashes
            + self.consumer_crashes
            + self.broker_outages
            + self.dropped_deliveries
            + self.duplicated_deliveries
            + self.delayed_deliveries
    }
}

/// Runs the demo; the exit code says whether the audit passed.
pub(crate) async fn run(config: DemoConfig) -> anyhow::Result<ExitCode> {
    let (path, _temp_dir) = database_path(config.db.as_deref())?;
    let store = SqliteStore::connect(&path)
        .await
        .with_context(|| format!("opening {}", path.display()))?;
    store
        .migrate()
        .await
        .context("migrating the oncebox tables")?;
    shop::create_tables(&store)
        .await
        .context("creating the demo tables")?;
    if !config.json {
        eprintln!(
            "oncebox demo: {} orders, seed {}, database {}",
            config.orders,
            config.seed,
            path.display()
        );
    }

    let orders = u64::from(config.orders);
    // About one crash per 500 messages on each side, and one forced crash early on.
    let crash_probability = 1.0 / 500.0;
    let relay_switch = Arc::new(CrashSwitch::new(
        config.seed ^ 0x5eed_0001,
        crash_probability,
        orders / 3,
    ));
    let consumer_switch = Arc::new(CrashSwitch::new(
        config.seed ^ 0x5eed_0002,
        crash_probability,
        orders / 2,
    ));
    let broker = MemoryBroker::with_ack_timeout(Duration::from_millis(300));
    broker.set_seed(config.seed);
    broker.set_faults(Faults {
        drop: 0.01,
        duplicate: 0.05,
        delay: 0.05,
        max_delay: Duration::from_millis(50),
    });

    let counters = Arc::new(Counters::default());
    let (stop, stopped) = watch::channel(false);
    let started = Instant::now();
    let outbox = store.outbox();
    let relay = tokio::spawn(supervise_relay(
        outbox.clone(),
        broker.clone(),
        Arc::clone(&relay_switch),
        stopped.clone(),
        Arc::clone(&counters),
    ));
    let consumer = tokio::spawn(supervise_consumer(
        store.clone(),
        broker.clone(),
        Arc::clone(&consumer_switch),
        stopped.clone(),
        Arc::clone(&counters),
    ));
    let outages = tokio::spawn(broker_outages(
        broker.clone(),
        orders,
        Arc::clone(&counters),
    ));
    let progress = (!config.json).then(|| {
        tokio::spawn(print_progress(
            store.clone(),
            broker.clone(),
            orders,
            Arc::clone(&counters),
        ))
    });

    place_orders(&store, &outbox, config.orders, config.seed, &counters).await?;
    let placed = get(&counters.placed);
    let deadline = started + Duration::from_secs(60) + Duration::from_millis(20 * orders);
    let charges = wait_for_charges(&store, placed, deadline).await?;
    if charges.charged() < placed {
        eprintln!(
            "oncebox demo: gave up waiting; {} of {placed} orders charged",
            charges.charged()
        );
    }

    // Drain: no more faults, then a graceful stop of the relay and the consumer.
    relay_switch.disable();
    consumer_switch.disable();
    broker.set_faults(Faults::none());
    outages.abort();
    if let Some(progress) = progress {
        progress.abort();
    }
    let _ = stop.send(true);
    relay.await.context("relay task")?;
    consumer.await.context("consumer task")?;

    let charges = Charges::read(&store).await?;
    let stats = broker.stats();
    let faults = FaultCounts {
        relay_crashes: get(&counters.relay_crashes),
        consumer_crashes: get(&counters.consumer_crashes),
        broker_outages: get(&counters.broker_outages),
        dropped_deliveries: stats.dropped,
        duplicated_deliveries: stats.duplicated,
        delayed_deliveries: stats.delayed,
    };
    let report = Report {
        seed: config.seed,
        orders: charges.orders,
        rolled_back_checkouts: get(&counters.rolled_back),
        charged_once: charges.charged_once,
        charged_more_than_once: charges.charged_more_than_once,
        never_charged: charges.never_charged,
        charges_without_order: charges.charges_without_order,
        duplicate_deliveries: get(&counters.duplicates),
        faults_injected: faults.total(),
        published: stats.published,
        republished: stats.published.saturating_sub(charges.orders),
        deliveries: stats.delivered,
        dead_letters: get(&counters.dead_letters),
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        exactly_once: charges.exactly_once(),
        faults,
    };
    if config.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(if report.exactly_once {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The database to use: the one asked for (which must not exist yet), or a new one in a
/// temporary directory that is removed at the end.
fn database_path(
    asked: Option<&std::path::Path>,
) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match asked {
        Some(path) if path.exists() => anyhow::bail!(
            "{} already exists; the demo audits a fresh database, give it a new path",
            path.display()
        ),
        Some(path) => Ok((path.to_owned(), None)),
        None => {
            let dir = tempfile::Builder::new().prefix("oncebox-demo-").tempdir()?;
            Ok((dir.path().join("demo.db"), Some(dir)))
        }
    }
}

/// The order service: places `count` orders, a few of them rolled back late.
async fn place_orders(
    store: &SqliteStore,
    outbox: &SqliteOutbox,
    count: u32,
    seed: u64,
    counters: &Counters,
) -> anyhow::Result<()> {
    let mut rng = fastrand::Rng::with_seed(seed);
    for n in 0..count {
        let order = OrderPlaced {
            order_id: format!("order-{n:07}"),
            customer: format!("customer-{:03}", rng.u32(..CUSTOMERS)),
            amount_cents: rng.i64(100..100_000),
        };
        let abandon = rng.f64() < ROLLBACK_SHARE;
        match shop::place_order(store, outbox, &order, abandon).await? {
            Checkout::Committed => counters.placed.fetch_add(1, Ordering::Relaxed),
            Checkout::RolledBack => counters.rolled_back.fetch_add(1, Ordering::Relaxed),
        };
    }
    Ok(())
}

/// Polls until `placed` orders are charged or the deadline passes.
async fn wait_for_charges(
    store: &SqliteStore,
    placed: u64,
    deadline: Instant,
) -> anyhow::Result<Charges> {
    loop {
        let charges = Charges::read(store).await?;
        if charges.charged() >= placed || Instant::now() >= deadline {
            return Ok(charges);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn relay_options() -> SpoolOptions {
    SpoolOptions::new()
        .name("demo-relay")
        .batch_size(128)
        .lease(Duration::from_millis(500))
        .dispatch_timeout(Duration::from_millis(250))
        .poll_interval(Duration::from_millis(5), Duration::from_millis(50))
        .backoff(
            Backoff::new()
                .initial(Duration::from_millis(20))
                .max(Duration::from_millis(200)),
        )
        // Broker outages must never dead-letter an order.
        .max_attempts(10_000)
}

/// Runs the relay; when the crash switch fires, drops it mid-flight (a kill -9) and
/// starts a new one. Rows the dead relay published but never marked are leased until
/// the lease ends, then published again.
async fn supervise_relay(
    outbox: SqliteOutbox,
    broker: MemoryBroker,
    switch: Arc<CrashSwitch>,
    stopped: watch::Receiver<bool>,
    counters: Arc<Counters>,
) {
    loop {
        let publisher = CrashingPublisher {
            inner: broker.publisher(),
            switch: Arc::clone(&switch),
        };
        let relay = match Relay::new(outbox.clone(), publisher, relay_options()) {
            Ok(relay) => relay,
            Err(error) => {
                eprintln!("oncebox demo: relay options rejected: {error}");
                return;
            }
        };
        tokio::select! {
            _ = relay.run_until(wait_for_stop(stopped.clone())) => return,
            () = switch.crashed() => {
                counters.relay_crashes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Runs the payment service's consumer; when the crash switch fires (after a commit,
/// before its ack), drops it with everything in flight and starts a new one.
async fn supervise_consumer(
    store: SqliteStore,
    broker: MemoryBroker,
    switch: Arc<CrashSwitch>,
    stopped: watch::Receiver<bool>,
    counters: Arc<Counters>,
) {
    let options = ConsumerOptions::new(CONSUMER)
        .backoff(
            Backoff::new()
                .initial(Duration::from_millis(20))
                .max(Duration::from_millis(200)),
        )
        .max_attempts(10_000);
    let inbox = match TransactionalInbox::new(store.inbox(), ChargeOrder, options) {
        Ok(inbox) => Arc::new(inbox),
        Err(error) => {
            eprintln!("oncebox demo: inbox options rejected: {error}");
            return;
        }
    };
    loop {
        let subscriber = CrashingSubscriber {
            inner: broker.subscribe(TOPIC, CONSUMER),
            switch: Arc::clone(&switch),
        };
        let observed = Arc::clone(&counters);
        let observe = move |_: &oncebox::Received, outcome: &Outcome| {
            let counter = match outcome {
                Outcome::Handled => &observed.handled,
                Outcome::Duplicate => &observed.duplicates,
                Outcome::DeadLettered { .. } => &observed.dead_letters,
                _ => &observed.retries,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        };
        let consumer = Consumer::new(subscriber, Arc::clone(&inbox))
            .lanes(8)
            .on_outcome(observe);
        tokio::select! {
            _ = consumer.run_until(wait_for_stop(stopped.clone())) => return,
            () = switch.crashed() => {
                counters.consumer_crashes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

async fn wait_for_stop(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Takes the broker down twice, at a quarter and at three fifths of the orders.
async fn broker_outages(broker: MemoryBroker, orders: u64, counters: Arc<Counters>) {
    for share in [0.25, 0.6] {
        let at = (orders as f64 * share) as u64;
        while get(&counters.placed) < at {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        broker.set_down(true);
        counters.broker_outages.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(250)).await;
        broker.set_down(false);
    }
}

async fn print_progress(
    store: SqliteStore,
    broker: MemoryBroker,
    orders: u64,
    counters: Arc<Counters>,
) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let charged = Charges::read(&store)
            .await
            .map(|c| c.charged())
            .unwrap_or(0);
        let faults = get(&counters.relay_crashes)
            + get(&counters.consumer_crashes)
            + get(&counters.broker_outages);
        eprintln!(
            "[{:>5.1}s] orders {}/{orders} · published {} · charged {charged} · duplicate deliveries {} · crashes+outages {faults}",
            started.elapsed().as_secs_f64(),
            get(&counters.placed) + get(&counters.rolled_back),
            broker.stats().published,
            get(&counters.duplicates),
        );
    }
}

fn print_report(r: &Report) {
    let f = &r.faults;
    println!();
    println!("Audit");
    println!(
        "  orders committed        {:>8}   ({} checkouts rolled back; charges for them: {})",
        r.orders, r.rolled_back_checkouts, r.charges_without_order
    );
    println!("  charged exactly once    {:>8}", r.charged_once);
    println!("  charged more than once  {:>8}", r.charged_more_than_once);
    println!("  never charged           {:>8}", r.never_charged);
    println!(
        "  duplicate deliveries    {:>8}   (skipped by the inbox)",
        r.duplicate_deliveries
    );
    println!(
        "  faults injected         {:>8}   (relay crashes {}, consumer crashes {}, broker outages {}, deliveries dropped {}, duplicated {}, delayed {})",
        r.faults_injected,
        f.relay_crashes,
        f.consumer_crashes,
        f.broker_outages,
        f.dropped_deliveries,
        f.duplicated_deliveries,
        f.delayed_deliveries
    );
    println!(
        "  published               {:>8}   ({} re-published after relay crashes), {} deliveries",
        r.published, r.republished, r.deliveries
    );
    println!(
        "  elapsed                 {:>7.1}s",
        r.elapsed_ms as f64 / 1000.0
    );
    if r.exactly_once {
        println!("PASS: every committed order was charged exactly once.");
    } else {
        println!("FAIL: some order was not charged exactly once.");
    }
}
