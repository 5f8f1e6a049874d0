//! `oncebox-bench chaos-payments` (hidden): the chaos run's payment service, one process.
//! It charges each order through the transactional inbox on the configured PostgreSQL
//! store, until SIGTERM or SIGINT.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use oncebox::Backoff;
use oncebox::consumer::{Consumer, ConsumerOptions, TransactionalInbox};
use tokio::sync::watch;

use oncebox_cli::stop::{self, Signals};
use oncebox_cli::{Broker, Config, Database, Overrides};

use super::shop::ChargeOrder;

/// Flags of `oncebox-bench chaos-payments`.
#[derive(Debug, clap::Args)]
pub(crate) struct PaymentsArgs {
    /// The service configuration: the file, the store and the broker.
    #[command(flatten)]
    overrides: Overrides,
    /// The broker's destination the orders are published to.
    #[arg(long)]
    topic: String,
    /// The consumer group, whose inbox records the orders charged.
    #[arg(long)]
    group: String,
}

impl PaymentsArgs {
    /// The flags that override the configuration.
    pub(crate) fn overrides(&self) -> &Overrides {
        &self.overrides
    }
}

/// Runs the payment service on `config` until a signal stops it.
pub(crate) async fn run(config: &Config, args: &PaymentsArgs) -> anyhow::Result<ExitCode> {
    let signals = Signals::listen().context("cannot listen to SIGTERM and SIGINT")?;
    let Database::Postgres(store) = Database::connect(config).await? else {
        anyhow::bail!("the chaos payment service runs on PostgreSQL");
    };
    let broker = Broker::connect(config).await?;
    let group = args.group.clone();
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
