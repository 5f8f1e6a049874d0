//! `oncebox relay`: the outbox table → the broker, until stopped.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use oncebox::postgres::cdc::{CdcConnection, CdcRelay};
use oncebox::spool::{Relay, SpoolOptions};
use oncebox::{Backoff, Message, Publisher, Result};
use tokio::sync::watch;

use super::Started;
use super::backend::{AnyOutbox, AnyPublisher, Broker, Database};
use super::http::ReadinessCheck;
use super::stop::{self, Signals};
use crate::config::{Config, RelayMode};

/// Runs `oncebox relay` on `config` until a signal stops it.
pub(crate) async fn relay(config: &Config) -> anyhow::Result<ExitCode> {
    let signals = Signals::listen().context("cannot listen to SIGTERM and SIGINT")?;
    if config.relay.mode == RelayMode::Cdc {
        return cdc(config, signals).await;
    }
    let mut started = Started::new(config).await?;
    let (database, broker) = (Arc::clone(&started.database), Arc::clone(&started.broker));
    let outbox = database.outbox(config)?;
    let publisher = Arc::new(TopicMap::new(
        broker
            .publisher()
            .await
            .context("cannot open a publisher")?,
        config.topics.clone(),
    ));
    let options = spool_options(config);
    let relays = (0..config.relay.workers)
        .map(|_| Relay::new(outbox.clone(), Arc::clone(&publisher), options.clone()).map(Arc::new))
        .collect::<Result<Vec<_>>>()
        .context("relay settings")?;

    started.serve(readiness(config, &database, &broker, &relays), "relay");
    tracing::info!(
        store = database.kind(),
        broker = broker.kind(),
        workers = relays.len(),
        "relaying"
    );
    let (stopping, _) = watch::channel(false);
    let work = {
        let stopping = stopping.clone();
        async move {
            let runs = relays.iter().map(|relay| {
                let stopping = &stopping;
                let stopped = stop::stopped(stopping);
                async move {
                    let ended = relay.run_until(stopped).await;
                    if ended.is_err() {
                        // One loop failing for good stops the others cleanly: the
                        // process ends with its error instead of running short-handed.
                        stopping.send_replace(true);
                    }
                    ended
                }
            });
            for ended in futures_util::future::join_all(runs).await {
                ended.context("the relay stopped")?;
            }
            Ok(())
        }
    };
    stop::run_until_signal(signals, stopping, config.relay.stop_timeout.get(), work).await
}

/// `oncebox relay` with `relay.mode = "cdc"`: tails PostgreSQL's log through the
/// `[cdc]` slot; a second process with the same slot stands by.
async fn cdc(config: &Config, signals: Signals) -> anyhow::Result<ExitCode> {
    let mut started = Started::new(config).await?;
    let (database, broker) = (Arc::clone(&started.database), Arc::clone(&started.broker));
    let Database::Postgres(store) = &*database else {
        anyhow::bail!("relay.mode = \"cdc\" needs a PostgreSQL store");
    };
    let url = config.store_url()?;
    let mut connection = CdcConnection::from_url(url.as_str()).context("store.url")?;
    if let Some(password) = &config.store.password {
        connection = connection.with_password(password.expose());
    }
    let publisher = TopicMap::new(
        broker
            .publisher()
            .await
            .context("cannot open a publisher")?,
        config.topics.clone(),
    );
    let options = config.cdc_options().context("[cdc] settings")?;
    let relay = CdcRelay::new(store, connection, publisher, options).context("[cdc] settings")?;
    let database_check = Arc::clone(&database);
    let broker_check = Arc::clone(&broker);
    started.serve(
        Arc::new(move || {
            let (database, broker) = (Arc::clone(&database_check), Arc::clone(&broker_check));
            Box::pin(async move { super::reachable(&database, &broker).await })
        }),
        "relay",
    );
    tracing::info!(
        broker = broker.kind(),
        slot = relay.options().slot(),
        mode = ?relay.options().mode(),
        "relaying from the log"
    );
    let (stopping, _) = watch::channel(false);
    let work = {
        let stopping = stopping.clone();
        async move {
            relay
                .run_until(stop::stopped(&stopping))
                .await
                .context("the relay stopped")
        }
    };
    stop::run_until_signal(signals, stopping, config.relay.stop_timeout.get(), work).await
}

/// The relay's settings, from `[relay]`.
fn spool_options(config: &Config) -> SpoolOptions {
    let relay = &config.relay;
    let count = |value: i64| usize::try_from(value).unwrap_or(usize::MAX);
    SpoolOptions::new()
        .name(relay.name.clone())
        .batch_size(count(relay.batch_size))
        .concurrency(count(relay.concurrency))
        .max_attempts(u32::try_from(relay.max_attempts).unwrap_or(u32::MAX))
        .backoff(
            Backoff::new()
                .initial(relay.retry_initial.get())
                .max(relay.retry_max.get()),
        )
        .lease(relay.lease.get())
        .dispatch_timeout(relay.publish_timeout.get())
        .poll_interval(
            relay.poll_max.get().min(Duration::from_millis(10)),
            relay.poll_max.get(),
        )
        .retention(relay.retention.get())
        .cleanup_interval(relay.cleanup_interval.get())
        .stats_interval(relay.stats_interval.get())
}

/// Ready when the store answers, the broker's connection is up, every relay loop
/// claimed recently without error and its last batch reached the broker.
fn readiness(
    config: &Config,
    database: &Arc<Database>,
    broker: &Arc<Broker>,
    relays: &[Arc<Relay<AnyOutbox, Arc<TopicMap>>>],
) -> ReadinessCheck {
    // A loop claims at least every poll_max, and not while it publishes a batch, which
    // its lease bounds.
    let stale = config.relay.poll_max.get() + config.relay.lease.get() + Duration::from_secs(5);
    let database = Arc::clone(database);
    let broker = Arc::clone(broker);
    let relays: Vec<_> = relays.to_vec();
    Arc::new(move || {
        let database = Arc::clone(&database);
        let broker = Arc::clone(&broker);
        let relays = relays.clone();
        Box::pin(async move {
            super::reachable(&database, &broker).await?;
            for relay in &relays {
                let health = relay.health();
                if let Some(error) = health.claim_error {
                    return Err(format!("claiming fails: {error}"));
                }
                if let Some(error) = health.sink_outage {
                    return Err(format!("the broker is unreachable: {error}"));
                }
                match health.last_claim {
                    Some(at) if at.elapsed() <= stale => {}
                    Some(at) => return Err(format!("no claim for {:?}", at.elapsed())),
                    None => return Err("starting: no claim yet".to_owned()),
                }
            }
            Ok(())
        })
    })
}

/// The publisher with `[topics]` applied: an outbox topic listed there goes to the
/// destination it names (a subject, routing key, topic or stream, before the broker's
/// own prefix); others keep their name.
pub(crate) struct TopicMap {
    publisher: AnyPublisher,
    topics: BTreeMap<String, String>,
}

impl TopicMap {
    pub(crate) fn new(publisher: AnyPublisher, topics: BTreeMap<String, String>) -> Self {
        Self { publisher, topics }
    }
}

impl Publisher for TopicMap {
    async fn publish(&self, message: &Message) -> Result<()> {
        match self.topics.get(&message.topic) {
            None => self.publisher.publish(message).await,
            Some(destination) => {
                let mut mapped = message.clone();
                mapped.topic.clone_from(destination);
                self.publisher.publish(&mapped).await
            }
        }
    }

    fn messaging_system(&self) -> &'static str {
        self.publisher.messaging_system()
    }
}
