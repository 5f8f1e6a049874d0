//! The RabbitMQ harness of the transport conformance suite, shared by the test files.
//!
//! Every harness uses an exchange of its own and queues named after its topics, so
//! tests run in parallel on one broker (`ONCEBOX_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`); dropping it deletes them.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncebox_core::{Error, MessageId, Received, Result};
use oncebox_rabbitmq::lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use oncebox_rabbitmq::lapin::{Connection, ConnectionProperties};
use oncebox_rabbitmq::{
    RabbitOptions, RabbitPublisher, RabbitSubscriber, dead_queue_name, peek_dead_letters,
};
use oncebox_testkit::transport::{Capabilities, TransportHarness};

pub fn amqp_url() -> String {
    std::env::var("ONCEBOX_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A name no other test (or earlier run) uses.
pub fn unique(label: &str) -> String {
    format!("{label}.{}", MessageId::new().as_uuid().simple())
}

/// The ack timeout the conformance checks run with.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(1);

pub struct RabbitHarness {
    pub options: RabbitOptions,
    pub exchange: String,
    /// Groups (queues) per topic, for dead-letter reading and cleanup.
    groups: Mutex<HashMap<String, Vec<String>>>,
    broker: Option<Arc<BrokerControl>>,
    patience: Duration,
}

impl RabbitHarness {
    /// A harness on an exchange of its own.
    pub fn new() -> Self {
        let exchange = unique("oncebox-test");
        let options = RabbitOptions::new(amqp_url())
            .exchange(exchange.clone())
            .ack_timeout(ACK_TIMEOUT)
            .connection_name("oncebox-rabbitmq tests");
        Self {
            options,
            exchange,
            groups: Mutex::new(HashMap::new()),
            broker: None,
            patience: Duration::from_secs(5),
        }
    }

    /// A harness that can restart the machine's RabbitMQ (`rabbitmqctl stop_app` /
    /// `start_app`), leaving it running when dropped whatever happened.
    pub fn restartable() -> Self {
        let mut harness = Self::new();
        harness.broker = Some(Arc::new(BrokerControl::default()));
        // Publishing must wait for the publisher's reconnection after the restart.
        harness.patience = Duration::from_secs(30);
        harness
    }

    pub fn with_options(mut self, edit: impl FnOnce(RabbitOptions) -> RabbitOptions) -> Self {
        self.options = edit(self.options.clone());
        self
    }

    fn groups(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn record_group(&self, topic: &str, group: &str) {
        let mut groups = self.groups();
        let list = groups.entry(topic.to_owned()).or_default();
        if !list.iter().any(|g| g == group) {
            list.push(group.to_owned());
        }
    }
}

impl TransportHarness for RabbitHarness {
    type Publisher = RabbitPublisher;
    type Subscriber = RabbitSubscriber;

    fn capabilities(&self) -> Capabilities {
        Capabilities::new()
            .per_key_order(true)
            .consumer_groups(true)
            .dead_letter_inspection(true)
            .delivery_count(true)
            .nack_delay(true)
            .restart(self.broker.is_some())
    }

    fn ack_timeout(&self) -> Duration {
        ACK_TIMEOUT
    }

    fn patience(&self) -> Duration {
        self.patience
    }

    async fn fresh_topic(&self, label: &str) -> Result<String> {
        Ok(unique(label))
    }

    async fn publisher(&self) -> Result<RabbitPublisher> {
        RabbitPublisher::connect(&self.options).await
    }

    async fn subscriber(&self, topic: &str, group: &str) -> Result<RabbitSubscriber> {
        self.record_group(topic, group);
        RabbitSubscriber::connect(&self.options, topic, group).await
    }

    async fn dead_letters(&self, topic: &str) -> Result<Vec<(Received, String)>> {
        let groups = self.groups().get(topic).cloned().unwrap_or_default();
        let mut dead = Vec::new();
        for group in groups {
            for letter in peek_dead_letters(&self.options, &group, 10_000).await? {
                if letter.received.topic == topic {
                    dead.push((letter.received, letter.reason));
                }
            }
        }
        Ok(dead)
    }

    async fn restart(&self) -> Result<()> {
        let Some(broker) = self.broker.clone() else {
            return Err(Error::transport_permanent(
                "this harness does not restart RabbitMQ",
            ));
        };
        tokio::task::spawn_blocking(move || broker.restart())
            .await
            .map_err(Error::transport_permanent)?
            .map_err(Error::transport_permanent)?;
        wait_until_up(Duration::from_secs(60)).await
    }
}

impl Drop for RabbitHarness {
    fn drop(&mut self) {
        let queues: Vec<String> = self
            .groups()
            .values()
            .flatten()
            .flat_map(|group| [group.clone(), dead_queue_name(group)])
            .collect();
        let exchange = self.exchange.clone();
        // Its own runtime on its own thread: this may run inside the test's runtime, or
        // while a failed test unwinds.
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(delete(queues, exchange));
        });
        let _ = cleanup.join();
    }
}

/// Deletes `queues` and `exchange`, best effort.
pub async fn delete(queues: Vec<String>, exchange: String) {
    let Ok(Ok(connection)) = tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(&amqp_url(), ConnectionProperties::default()),
    )
    .await
    else {
        eprintln!("cleanup: cannot connect to RabbitMQ; leaving {queues:?} and {exchange}");
        return;
    };
    for queue in queues {
        // A failed delete closes the channel: one channel per delete.
        if let Ok(channel) = connection.create_channel().await {
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
    if !exchange.is_empty()
        && let Ok(channel) = connection.create_channel().await
    {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = connection.close(200, "cleanup".into()).await;
}

/// Waits until RabbitMQ accepts AMQP connections again.
pub async fn wait_until_up(limit: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let attempt = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(&amqp_url(), ConnectionProperties::default()),
        )
        .await;
        if let Ok(Ok(connection)) = attempt {
            let _ = connection.close(200, "up".into()).await;
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::transport_transient(format!(
                "RabbitMQ did not accept connections within {limit:?} of starting"
            )));
        }
        // Nothing to await but the broker's listener: poll it.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops and starts the machine's RabbitMQ application; started again on drop if a
/// restart was cut short.
#[derive(Default)]
pub struct BrokerControl {
    stopped: AtomicBool,
}

impl BrokerControl {
    pub fn restart(&self) -> std::result::Result<(), String> {
        self.stopped.store(true, Ordering::SeqCst);
        rabbitmqctl(&["stop_app"])?;
        self.start()
    }

    fn start(&self) -> std::result::Result<(), String> {
        rabbitmqctl(&["start_app"]).or_else(|error| {
            eprintln!("rabbitmqctl start_app failed ({error}); starting rabbitmq-server");
            run("rabbitmq-server", &["-detached"])?;
            rabbitmqctl(&["await_startup"])
        })?;
        self.stopped.store(false, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for BrokerControl {
    fn drop(&mut self) {
        if self.stopped.load(Ordering::SeqCst)
            && let Err(error) = self.start()
        {
            eprintln!("could not start RabbitMQ again: {error}");
        }
    }
}

fn rabbitmqctl(args: &[&str]) -> std::result::Result<(), String> {
    run("rabbitmqctl", args)
}

fn run(program: &str, args: &[&str]) -> std::result::Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| format!("{program} {args:?}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
