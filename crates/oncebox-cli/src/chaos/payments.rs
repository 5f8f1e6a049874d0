//! `oncebox chaos-payments` (hidden): the chaos run's payment service, one process. It
//! charges each order through the transactional inbox on the configured PostgreSQL
//! store, until SIGTERM or SIGINT.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use oncebox::Backoff;
use oncebox::consumer::{Consumer, ConsumerOptions, TransactionalInbox};
use tokio::sync::watch;

use super::shop::ChargeOrder;
use crate::config::Config;
use crate::service::backend::{Broker, Database};
use crate::service::stop::{self, Signals};

/// Flags of `oncebox chaos-payments`.
#[derive(Debug, clap::Args)]
pub(crate) struct PaymentsArgs {
    /// The broker's destination the orders are published to.
    #[arg(long)]
    topic: String,
}

/// Runs the payment service on `config` until a signal stops it.
pub(crate) async fn run(config: &Config, args: &PaymentsArgs) -> anyhow::Result<ExitCode> {
    let signals = Signals::listen().context("cannot listen to SIGTERM and SIGINT")?;
    let Database::Postgres(store) = Database::connect(config).await? else {
        anyhow::bail!("the chaos payment service runs on PostgreSQL");
    };
    let broker = Broker::connect(config).await?;
    let group = config.receive.consumer.clone();
    let subscriber = broker
        .subscriber(&args.topic, &group)
        .await
        .with_context(|| format!("cannot subscribe to {} as {group}", args.topic))?;
    // Rides out the restarts of the run (seconds each) instead of dead-lettering.
    let options = ConsumerOptions::new(group)
        .backoff(
            Backoff::new()
                .initial(Duration::from_millis(100))
                .max(Duration::from_secs(2)),
        )
        .max_attempts(1000);
    let inbox = TransactionalInbox::new(store.inbox(), ChargeOrder::new(store.schema()), options)?;
    let consumer = Consumer::new(subscriber, inbox).lanes(8);
    let (stopping, _) = watch::channel(false);
    let stopped = stop::stopped(&stopping);
    stop::run_until_signal(signals, stopping, Duration::from_secs(10), async move {
        consumer.run_until(stopped).await.map_err(Into::into)
    })
    .await
}
