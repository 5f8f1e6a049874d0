//! The benchmarks' spans: `relay` and `consumer` measure a side with the engine's spans
//! built as the services build them (the layer of `oncebox_cli::telemetry`) and handed
//! to an exporter that drops them ([`traced`]), against the same engine untraced: the
//! cost of tracing without a collector's. Builds without the feature `otel` measure no
//! traced side.

use oncebox_cli::ConfigError;
use oncebox_cli::telemetry::{Telemetry, Tracing};

/// Installs the benchmarks' subscriber: errors logged, and (feature `otel`) the spans of
/// traced runs handed to the exporter that drops them.
///
/// # Errors
///
/// None in practice: the exporter has no settings to refuse.
pub(crate) fn init() -> Result<Telemetry, ConfigError> {
    #[cfg(feature = "otel")]
    let tracing = Tracing::Layer(Box::new(otel::discarding()));
    #[cfg(not(feature = "otel"))]
    let tracing = Tracing::Off;
    oncebox_cli::telemetry::init("error", tracing)
}

/// Whether this build can trace (the feature `otel`).
pub(crate) const fn can_trace() -> bool {
    cfg!(feature = "otel")
}

/// Runs `work` with its spans built and exported (to nowhere) when `on`, untraced
/// otherwise. Only one traced run at a time; [`exported`] tells whether it produced
/// spans.
#[cfg(feature = "otel")]
pub(crate) async fn traced<F: std::future::Future>(on: bool, work: F) -> F::Output {
    use std::sync::atomic::Ordering;
    otel::TRACING.store(on, Ordering::Relaxed);
    let output = work.await;
    otel::TRACING.store(false, Ordering::Relaxed);
    output
}

/// Flushes the exporter and returns how many spans it was handed so far (0 in a build
/// without the feature). Blocks until the flush is done.
pub(crate) fn exported() -> u64 {
    #[cfg(feature = "otel")]
    if let Some(provider) = otel::PROVIDER.get() {
        let _ = tokio::task::block_in_place(|| provider.force_flush());
        return otel::EXPORTED.load(std::sync::atomic::Ordering::Relaxed);
    }
    0
}

#[cfg(feature = "otel")]
mod otel {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use tracing::subscriber::Interest;
    use tracing_subscriber::filter::DynFilterFn;
    use tracing_subscriber::{Layer, Registry};

    /// Whether a traced run is going on.
    pub(super) static TRACING: AtomicBool = AtomicBool::new(false);

    /// The exporter's provider, for flushes between runs.
    pub(super) static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

    /// Spans the exporter was handed.
    pub(super) static EXPORTED: AtomicU64 = AtomicU64::new(0);

    /// The layer: the spans the services export, while [`TRACING`] is set, built and
    /// batched as for OTLP, then dropped by the exporter.
    pub(super) fn discarding() -> impl Layer<Registry> + Send + Sync {
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Discard)
            .with_max_links_per_span(1024)
            .build();
        let _ = PROVIDER.set(provider.clone());
        let spans = oncebox_cli::telemetry::exported_spans();
        // Asked at every span, not once per call site: the switch flips between runs.
        let filter = DynFilterFn::new(|_, _| TRACING.load(Ordering::Relaxed)).with_callsite_filter(
            move |metadata| {
                if spans.would_enable(metadata.target(), metadata.level()) {
                    Interest::sometimes()
                } else {
                    Interest::never()
                }
            },
        );
        oncebox_cli::telemetry::span_layer(provider.tracer("oncebox-bench")).with_filter(filter)
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
