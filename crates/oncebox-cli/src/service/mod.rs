//! `oncebox relay` and `oncebox receive`: the long-running services.
//!
//! Both connect to the store and the broker first (either unreachable is a configuration
//! error, status 2), install the Prometheus recorder before the engines register their
//! metrics, serve `/metrics`, `/healthz` and `/readyz`, and stop gracefully on SIGTERM
//! or SIGINT (see [`stop`]).

pub(crate) mod backend;
mod http;
mod receive;
mod relay;
pub mod stop;

pub(crate) use receive::{ReceiveArgs, receive};
pub(crate) use relay::relay;

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::Config;
use backend::{Broker, Database};

/// What both services start with, in the order that keeps a bad start harmless: the
/// listen address bound (an unusable one is a configuration error before anything
/// connects), the recorder installed (before the engines register their metrics), then
/// the store and the broker connected (either unreachable: a configuration error), the
/// dashboard bound if `dashboard.listen` is set.
struct Started {
    listener: Option<TcpListener>,
    metrics: PrometheusHandle,
    database: Arc<Database>,
    broker: Arc<Broker>,
    dashboard: Option<crate::dashboard::Server>,
}

impl Started {
    async fn new(config: &Config) -> anyhow::Result<Self> {
        let listener = match config.http.address()? {
            Some(address) => Some(http::bind(address).await?),
            None => None,
        };
        let metrics = http::install_recorder()?;
        let database = Arc::new(Database::connect(config).await?);
        let broker = Arc::new(Broker::connect(config).await?);
        let dashboard = match config.dashboard.address()? {
            Some(address) => {
                Some(crate::dashboard::Server::new(config, Arc::clone(&database), address).await?)
            }
            None => None,
        };
        Ok(Self {
            listener,
            metrics,
            database,
            broker,
            dashboard,
        })
    }

    /// Serves the HTTP endpoint of `service` (`relay`, `receive`), if one is configured,
    /// with `ready` behind `/readyz` and `oncebox_ready`, and the dashboard, if one is.
    fn serve(&mut self, ready: http::ReadinessCheck, service: &'static str) {
        if let Some(listener) = self.listener.take() {
            http::serve(listener, self.metrics.clone(), ready, service);
        }
        if let Some(dashboard) = self.dashboard.take() {
            dashboard.spawn();
        }
    }
}

/// How long a readiness check waits for the store or the broker.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The part of readiness both services share: the store answers, and the broker's
/// connection is up where its client keeps one.
async fn reachable(database: &Database, broker: &Broker) -> Result<(), String> {
    database.ping(CHECK_TIMEOUT).await?;
    broker.check(CHECK_TIMEOUT).await
}
