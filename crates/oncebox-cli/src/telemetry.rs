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
//! - `oncebox bench relay` and `bench consumer` measure a side with the spans built and
//!   handed to an exporter that drops them ([`traced`]), against the same engine
//!   untraced.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::{Config, ConfigError};

/// What the command traces to.
pub(crate) enum Tracing<'c> {
    /// Logs only.
    Off,
    /// The services: OTLP to the configured endpoint, if any, as the service named
    /// (unless the configuration names it).
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    Services(&'c Config, &'static str),
    /// The benchmarks: spans dropped by the exporter, while [`traced`] says so.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    Bench,
}

/// Installs the subscriber: logs on stderr filtered by `RUST_LOG` (else `default_logs`),
/// and the OpenTelemetry layer `tracing` asks for. The exporter is flushed when the
/// returned guard is dropped.
///
/// # Errors
///
/// A configuration error when the exporter cannot be built (a bad endpoint).
pub(crate) fn init(default_logs: &str, tracing: Tracing<'_>) -> Result<Telemetry, ConfigError> {
    let levels = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_logs.into());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(levels);
    let registry = tracing_subscriber::registry().with(logs);
    match tracing {
        Tracing::Off => {
            registry.init();
            Ok(Telemetry::default())
        }
        #[cfg(feature = "otel")]
        Tracing::Services(config, service) => {
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
            registry.init();
            Ok(Telemetry::default())
        }
        #[cfg(feature = "otel")]
        Tracing::Bench => {
            let (layer, provider) = otel::discarding();
            registry.with(layer).init();
            Ok(Telemetry {
                provider: Some(provider),
            })
        }
        #[cfg(not(feature = "otel"))]
        Tracing::Bench => {
            registry.init();
            Ok(Telemetry::default())
        }
    }
}

/// Flushes and shuts the exporter down when dropped (outside the async runtime).
#[derive(Default)]
pub(crate) struct Telemetry {
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

/// Runs `work` with the benchmarks' spans built and exported (to nowhere) when `on`,
/// untraced otherwise. Only one traced run at a time; [`spans_exported`] tells whether
/// it produced spans.
#[cfg(feature = "otel")]
pub(crate) async fn traced<F: std::future::Future>(on: bool, work: F) -> F::Output {
    otel::BENCH_TRACING.store(on, std::sync::atomic::Ordering::Relaxed);
    let output = work.await;
    otel::BENCH_TRACING.store(false, std::sync::atomic::Ordering::Relaxed);
    output
}

/// Flushes the benchmarks' exporter and returns how many spans it was handed so far (0
/// in a build without the feature). Blocks until the flush is done.
pub(crate) fn spans_exported() -> u64 {
    #[cfg(feature = "otel")]
    if let Some(provider) = otel::BENCH_PROVIDER.get() {
        let _ = tokio::task::block_in_place(|| provider.force_flush());
        return otel::EXPORTED.load(std::sync::atomic::Ordering::Relaxed);
    }
    0
}

#[cfg(feature = "otel")]
mod otel {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig as _};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
    use tracing::Subscriber;
    use tracing::subscriber::Interest;
    use tracing_opentelemetry::OpenTelemetryLayer;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{DynFilterFn, LevelFilter, Targets};
    use tracing_subscriber::registry::LookupSpan;

    use crate::config::{Config, ConfigError};

    /// The layer over `tracer` as the services install it: the conventions' attributes
    /// only (no code location, thread, target or busy and idle times, each of which
    /// costs every span), and no OpenTelemetry context made current on entering a span
    /// (nothing else in the process reads it).
    fn layer<S>(tracer: SdkTracer) -> OpenTelemetryLayer<S, SdkTracer>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_context_activation(false)
    }

    /// The longest one export may take.
    const EXPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

    /// The spans exported: `oncebox`'s, from `INFO` up.
    fn oncebox_spans() -> Targets {
        Targets::new().with_target("oncebox", LevelFilter::INFO)
    }

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
        let layer = layer(provider.tracer("oncebox")).with_filter(oncebox_spans());
        Ok((layer, provider))
    }

    /// Whether the benchmark's traced side is running.
    pub(super) static BENCH_TRACING: AtomicBool = AtomicBool::new(false);

    /// The benchmarks' provider, for flushes between runs.
    pub(super) static BENCH_PROVIDER: std::sync::OnceLock<SdkTracerProvider> =
        std::sync::OnceLock::new();

    /// Spans the benchmarks' exporter was handed.
    pub(super) static EXPORTED: AtomicU64 = AtomicU64::new(0);

    /// The benchmarks' layer: `oncebox`'s spans while [`BENCH_TRACING`] is set, built
    /// and batched as for OTLP, then dropped by the exporter.
    pub(super) fn discarding<S>() -> (impl Layer<S> + use<S>, SdkTracerProvider)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Discard)
            .with_max_links_per_span(1024)
            .build();
        let _ = BENCH_PROVIDER.set(provider.clone());
        let spans = oncebox_spans();
        // Asked at every span, not once per call site: the switch flips between runs.
        let filter = DynFilterFn::new(|_, _| BENCH_TRACING.load(Ordering::Relaxed))
            .with_callsite_filter(move |metadata| {
                if spans.would_enable(metadata.target(), metadata.level()) {
                    Interest::sometimes()
                } else {
                    Interest::never()
                }
            });
        let layer = layer(provider.tracer("oncebox-bench")).with_filter(filter);
        (layer, provider)
    }

    /// An exporter that drops every span: the cost of tracing without a collector's.
    #[derive(Debug)]
    struct Discard;

    impl SpanExporter for Discard {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            EXPORTED.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }
}
