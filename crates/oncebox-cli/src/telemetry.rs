//! What the command reports about itself: logs on stderr, and with the feature `otel`
//! the spans of the outbox hop (`oncebox::trace`) exported over OTLP.
//!
//! - Logs are events only (filtered by `RUST_LOG`): the spans' fields would widen every
//!   line, and formatting them would cost every delivery; spans are for the exporter.
//! - `oncebox relay` and `oncebox receive` export their spans to `otel.endpoint` when
//!   one is configured, and only then: OTLP over HTTP with protobuf, to
//!   `{endpoint}/v1/traces`, batched on a thread of the exporter's own. The spans of the
//!   target `oncebox` at level `INFO` are exported, whatever `RUST_LOG` says of logs; an
//!   export waits at most 3 s for the collector (so does the last one, at exit).
//! - A tool that traces the engines as the services do but hands the spans elsewhere
//!   (`oncebox-bench`, measuring what tracing costs) builds its layer with
//!   [`span_layer`] and [`exported_spans`] and installs it with [`Tracing::Layer`].

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::Registry;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::{Config, ConfigError};

/// What the process traces to, besides its logs.
pub enum Tracing<'c> {
    /// Logs only.
    Off,
    /// A service's spans: OTLP to the configured endpoint, if any, as the service named
    /// (unless the configuration names it).
    Services(&'c Config, &'static str),
    /// The spans `layer` takes, which filters and exports them itself.
    Layer(Box<dyn Layer<Registry> + Send + Sync>),
}

/// Installs the process's subscriber: logs on stderr filtered by `RUST_LOG` (else
/// `default_logs`), and the spans' layer `tracing` asks for. The services' exporter is
/// flushed when the returned guard is dropped.
///
/// # Errors
///
/// A configuration error when the exporter cannot be built (a bad endpoint).
///
/// # Panics
///
/// When the process has a subscriber already.
pub fn init(default_logs: &str, tracing: Tracing<'_>) -> Result<Telemetry, ConfigError> {
    let registry = tracing_subscriber::registry();
    match tracing {
        Tracing::Off => {
            registry.with(logs(default_logs)).init();
            Ok(Telemetry::default())
        }
        #[cfg(feature = "otel")]
        Tracing::Services(config, service) => {
            let registry = registry.with(logs(default_logs));
            let Some(endpoint) = config.otel.endpoint.as_deref() else {
                registry.init();
                return Ok(Telemetry::default());
            };
            let service = config.otel.service_name.as_deref().unwrap_or(service);
            let (layer, provider) = otel::otlp(endpoint, service, config)?;
            registry.with(layer).init();
            Ok(Telemetry {
                provider: Some(provider),
            })
        }
        #[cfg(not(feature = "otel"))]
        Tracing::Services(..) => {
            // Config::validate refuses an endpoint in a build without the feature.
            registry.with(logs(default_logs)).init();
            Ok(Telemetry::default())
        }
        Tracing::Layer(layer) => {
            // Beneath the logs: a boxed layer is one of the bare registry's.
            registry.with(layer).with(logs(default_logs)).init();
            Ok(Telemetry::default())
        }
    }
}

/// The logs: events on stderr, filtered by `RUST_LOG`, else `default_logs`.
fn logs<S>(default_logs: &str) -> impl Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let levels = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_logs.into());
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(levels)
}

/// Flushes and shuts the services' exporter down when dropped (outside the async
/// runtime).
#[derive(Default)]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("oncebox: exporting the last spans failed: {error}");
        }
    }
}

/// Whether this build can trace (the feature `otel`).
pub(crate) const fn can_trace() -> bool {
    cfg!(feature = "otel")
}

/// The layer over `tracer` as the services install it: the conventions' attributes
/// only (no code location, thread, target or busy and idle times, each of which costs
/// every span), and no OpenTelemetry context made current on entering a span (nothing
/// else in the process reads it).
#[cfg(feature = "otel")]
pub fn span_layer<S>(
    tracer: opentelemetry_sdk::trace::SdkTracer,
) -> tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
}

/// The spans the services export: `oncebox`'s, from `INFO` up.
#[cfg(feature = "otel")]
pub fn exported_spans() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new()
        .with_target("oncebox", tracing_subscriber::filter::LevelFilter::INFO)
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig as _};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing::Subscriber;
    use tracing_subscriber::Layer;
    use tracing_subscriber::registry::LookupSpan;

    use super::{exported_spans, span_layer};
    use crate::config::{Config, ConfigError};

    /// The longest one export may take.
    const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

    /// The layer exporting to `endpoint` over OTLP/HTTP, and its provider.
    pub(super) fn otlp<S>(
        endpoint: &str,
        service_name: &str,
        config: &Config,
    ) -> Result<(impl Layer<S> + use<S>, SdkTracerProvider), ConfigError>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            // An unreachable collector delays the exit by at most this much.
            .with_timeout(EXPORT_TIMEOUT)
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .build()
            .map_err(|error| ConfigError::key("otel.endpoint", error))?;
        // A relay's send span links to the creation context of every message of its
        // batch: keep a link for each (the SDK keeps 128 by default).
        let links = u32::try_from(config.relay.batch_size)
            .unwrap_or(u32::MAX)
            .max(128);
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_max_links_per_span(links)
            .with_resource(
                Resource::builder()
                    .with_service_name(service_name.to_owned())
                    .build(),
            )
            .build();
        let layer = span_layer(provider.tracer("oncebox")).with_filter(exported_spans());
        Ok((layer, provider))
    }
}
