//! `oncebox receive`: the broker → the durable inbox table, each message id stored once
//! and acked once stored, until stopped. Services in any language then take rows from
//! the table with plain SQL (docs/service.md, "The inbox contract").

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use oncebox::consumer::{Consumer, ConsumerHealthHandle, ConsumerOptions, DurableInbox};
use oncebox::spool::SpoolStore;
use oncebox::store::DurableInboxStore;
use tokio::sync::watch;

use super::Started;
use super::backend::{AnySubscriber, Broker, Database};
use super::http::ReadinessCheck;
use super::stop::{self, Signals};
use crate::config::{Config, ConfigError};

/// Processed rows deleted per statement by the retention cleanup.
const CLEANUP_BATCH: usize = 1000;

/// Flags of `oncebox receive` (they win over `[receive]`).
#[derive(Debug, clap::Args)]
pub(crate) struct ReceiveArgs {
    /// `receive.topic`: the topic received from.
    #[arg(long)]
    topic: Option<String>,
    /// `receive.consumer`: the consumer group on the broker and the rows' `consumer`.
    #[arg(long)]
    consumer: Option<String>,
}

/// Runs `oncebox receive` on `config` until a signal stops it.
pub(crate) async fn receive(config: &Config, args: &ReceiveArgs) -> anyhow::Result<ExitCode> {
    let signals = Signals::listen().context("cannot listen to SIGTERM and SIGINT")?;
    let topic = args
        .topic
        .clone()
        .or_else(|| config.receive.topic.clone())
        .ok_or_else(|| {
            ConfigError::key(
                "receive.topic",
                "missing: set it in the file, ONCEBOX_RECEIVE__TOPIC or --topic",
            )
        })?;
    let consumer = args
        .consumer
        .clone()
        .unwrap_or_else(|| config.receive.consumer.clone());
    let options = ConsumerOptions::new(consumer.clone())
        .dedup_window(config.receive.dedup_window.get())
        .max_attempts(u32::try_from(config.receive.max_attempts).unwrap_or(u32::MAX));
    options
        .validate()
        .map_err(|error| ConfigError::key("receive", error))?;
    let mut started = Started::new(config).await?;
    let (database, broker) = (Arc::clone(&started.database), Arc::clone(&started.broker));
    let subscriber = broker
        .subscriber(&topic, &consumer)
        .await
        .with_context(|| format!("cannot subscribe to {topic} as {consumer}"))?;
    let health = Arc::new(OnceLock::new());
    started.serve(readiness(&database, &broker, &health), "receive");
    tracing::info!(
        store = database.kind(),
        broker = broker.kind(),
        %topic,
        %consumer,
        "receiving into the durable inbox"
    );
    let inbox = Inbox {
        health,
        subscriber,
        options,
        lanes: usize::try_from(config.receive.lanes).unwrap_or(usize::MAX),
        cleanup_interval: config.receive.cleanup_interval.get(),
    };
    let (stopping, _) = watch::channel(false);
    let stopped = stop::stopped(&stopping);
    let deadline = config.receive.stop_timeout.get();
    match &*database {
        Database::Sqlite(store) => {
            let work = inbox.run(store.durable_inbox(&consumer), stopped);
            stop::run_until_signal(signals, stopping, deadline, work).await
        }
        Database::Postgres(store) => {
            let work = inbox.run(store.durable_inbox(&consumer), stopped);
            stop::run_until_signal(signals, stopping, deadline, work).await
        }
        #[cfg(feature = "mysql")]
        Database::Mysql(store) => {
            let work = inbox.run(store.durable_inbox(&consumer), stopped);
            stop::run_until_signal(signals, stopping, deadline, work).await
        }
    }
}

/// What the receiving loop needs besides the store.
struct Inbox {
    /// Where the consumer's health handle goes once the consumer is built.
    health: Arc<OnceLock<ConsumerHealthHandle>>,
    subscriber: AnySubscriber,
    options: ConsumerOptions,
    lanes: usize,
    cleanup_interval: Duration,
}

impl Inbox {
    /// Stores deliveries in `store` until `stopped`, and deletes processed rows older
    /// than the dedup window every `cleanup_interval`.
    async fn run<S>(
        self,
        store: S,
        stopped: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()>
    where
        S: DurableInboxStore + Clone + 'static,
    {
        let window = self.options.window();
        let inbox = DurableInbox::new(store.clone(), self.options).context("receive settings")?;
        let (done, _) = watch::channel(false);
        let cleanup = cleanup(store, window, self.cleanup_interval, stop::stopped(&done));
        let consumer = Consumer::new(self.subscriber, inbox).lanes(self.lanes);
        let _ = self.health.set(consumer.health());
        let consumer = async {
            let ended = consumer.run_until(stopped).await;
            done.send_replace(true);
            ended
        };
        let (ended, ()) = tokio::join!(consumer, cleanup);
        ended.context("the receiver stopped")
    }
}

/// Deletes processed rows older than the dedup window, in bounded batches, until
/// `stopped`. A row younger than the window is what makes a redelivery a duplicate.
async fn cleanup<S: SpoolStore>(
    store: S,
    window: Duration,
    interval: Duration,
    stopped: impl std::future::Future<Output = ()>,
) {
    let mut stopped = std::pin::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => return,
            () = tokio::time::sleep(interval) => {}
        }
        let before = oncebox::time::ago(window);
        loop {
            match store.purge(before, CLEANUP_BATCH).await {
                Ok(deleted) if deleted == CLEANUP_BATCH as u64 => continue,
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(%error, "deleting processed inbox rows failed");
                    break;
                }
            }
        }
    }
}

/// How long a failed receive keeps the receiver unready when no delivery came since:
/// longer than the brokers' clients wait between reconnection attempts (RabbitMQ's 5 s).
const RECEIVE_FAILURE: Duration = Duration::from_secs(15);

/// Ready when the store answers, the broker's connection is up (where the client
/// keeps one) and the consumer's receives have not been failing lately.
fn readiness(
    database: &Arc<Database>,
    broker: &Arc<Broker>,
    health: &Arc<OnceLock<ConsumerHealthHandle>>,
) -> ReadinessCheck {
    let database = Arc::clone(database);
    let broker = Arc::clone(broker);
    let health = Arc::clone(health);
    Arc::new(move || {
        let database = Arc::clone(&database);
        let broker = Arc::clone(&broker);
        let health = health.get().map(ConsumerHealthHandle::get);
        Box::pin(async move {
            super::reachable(&database, &broker).await?;
            let Some(health) = health else {
                return Err("starting: not receiving yet".to_owned());
            };
            if let (Some(failed), Some(error)) = (health.last_failure, &health.receive_error)
                && health
                    .last_delivery
                    .is_none_or(|delivered| delivered < failed)
                && failed.elapsed() < RECEIVE_FAILURE
            {
                return Err(format!(
                    "receiving from the broker fails ({} in a row): {error}",
                    health.failures_in_a_row
                ));
            }
            Ok(())
        })
    })
}
