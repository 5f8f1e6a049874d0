//! The service's HTTP endpoint: `/metrics` (Prometheus text format), `/healthz` (the
//! process answers) and `/readyz` (store and broker reachable, the loop making
//! progress; 503 with the reason otherwise). Each scrape of `/metrics` and each
//! `/readyz` also sets the gauge `oncebox_ready{service}` (1 ready, 0 not), so that
//! Prometheus sees readiness where no orchestrator probes it.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::config::ConfigError;

/// Bucket bounds, in seconds, of every `_seconds` histogram: from a fast local publish
/// (sub-millisecond) to a message that waited minutes.
const BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// How often the exporter's histograms are maintained.
const UPKEEP: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder as the process's `metrics` recorder, before the
/// relays and consumers register their metrics.
pub(crate) fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)?
        .install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Why the service is not ready, or `Ok`.
pub(crate) type Readiness = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Checks whether the service is ready; called on each `/readyz` request.
pub(crate) type ReadinessCheck = Arc<dyn Fn() -> Readiness + Send + Sync>;

#[derive(Clone)]
struct Endpoint {
    metrics: PrometheusHandle,
    ready: ReadinessCheck,
    /// `relay` or `receive`: the `service` label of `oncebox_ready`.
    service: &'static str,
}

impl Endpoint {
    /// Runs the readiness check and records its answer in `oncebox_ready`.
    async fn check(&self) -> Result<(), String> {
        let answer = (self.ready)().await;
        metrics::gauge!("oncebox_ready", "service" => self.service).set(if answer.is_ok() {
            1.0
        } else {
            0.0
        });
        answer
    }
}

/// Binds `address` now (so an unusable address is a configuration error at start).
pub(crate) async fn bind(address: SocketAddr) -> Result<TcpListener, ConfigError> {
    TcpListener::bind(address).await.map_err(|error| {
        ConfigError::key(
            "http.listen",
            format!("cannot listen on {address}: {error}"),
        )
    })
}

/// Serves the endpoint of `service` (`relay`, `receive`) on `listener` until the
/// process ends.
pub(crate) fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    ready: ReadinessCheck,
    service: &'static str,
) {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(Endpoint {
            metrics,
            ready,
            service,
        });
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    }
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the HTTP endpoint stopped");
        }
    });
}

async fn render_metrics(State(endpoint): State<Endpoint>) -> Response {
    // The reason is /readyz's to give; the scrape carries the answer.
    let _ = endpoint.check().await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        endpoint.metrics.render(),
    )
        .into_response()
}

async fn readyz(State(endpoint): State<Endpoint>) -> Response {
    match endpoint.check().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response(),
    }
}
