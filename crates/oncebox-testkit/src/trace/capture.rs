//! The spans, captured in memory, and what a check reads from them.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::trace::{SpanKind, TracerProvider};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;

use super::parts::RequestSpan;
use crate::support::within;

/// An OpenTelemetry pipeline into memory, installed as the global subscriber of the test
/// binary on first use (a subscriber per thread would share call sites with the tests
/// running beside it, whose interest tracing caches), with the `oncebox` warnings beside
/// it. It keeps the spans of the topics the checks watch, and the request spans.
pub(super) struct Capture {
    pub(super) kept: Kept,
    pub(super) warnings: Arc<Mutex<Vec<String>>>,
    pub(super) _provider: SdkTracerProvider,
}

static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();

impl Capture {
    /// The capture, watching `topic` from now on.
    pub(super) fn watching(topic: &str) -> &'static Self {
        let capture = CAPTURE.get_or_init(|| {
            let kept = Kept::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(kept.clone())
                .build();
            let warnings = Arc::new(Mutex::new(Vec::new()));
            let subscriber = tracing_subscriber::registry()
                .with(
                    tracing_opentelemetry::layer().with_tracer(provider.tracer("oncebox-testkit")),
                )
                .with(Warnings(Arc::clone(&warnings)));
            tracing::subscriber::set_global_default(subscriber).expect(
                "the trace checks install the test binary's global subscriber: no test of \
                 the binary may install another",
            );
            Self {
                kept,
                warnings,
                _provider: provider,
            }
        });
        lock(&capture.kept.topics).insert(topic.to_owned());
        capture
    }

    /// The finished spans, once a `create` and a `process` span of each message of `ids`
    /// have ended.
    pub(super) async fn spans_of(&self, ids: &[&str], patience: Duration) -> Spans {
        within("[trace] the spans of every message end", patience, async {
            loop {
                let spans = Spans(lock(&self.kept.spans).clone());
                let ended = |id: &str| {
                    !spans.of(id, "create").is_empty() && !spans.of(id, "process").is_empty()
                };
                if ids.iter().all(|id| ended(id)) {
                    return spans;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }

    pub(super) fn warnings(&self) -> Vec<String> {
        lock(&self.warnings).clone()
    }

    /// Whether one warning holds every one of `texts`.
    pub(super) fn warned_about(&self, texts: &[&str]) -> bool {
        self.warnings()
            .iter()
            .any(|warning| texts.iter().all(|text| warning.contains(text)))
    }
}

/// An exporter keeping the spans of watched topics, and server spans.
#[derive(Debug, Clone, Default)]
pub(super) struct Kept {
    pub(super) topics: Arc<Mutex<HashSet<String>>>,
    pub(super) spans: Arc<Mutex<Vec<SpanData>>>,
}

impl opentelemetry_sdk::trace::SpanExporter for Kept {
    async fn export(&self, batch: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        let topics = lock(&self.topics);
        let kept = batch.into_iter().filter(|span| {
            span.span_kind == SpanKind::Server
                || topics.contains(&attr(span, "messaging.destination.name"))
        });
        lock(&self.spans).extend(kept);
        Ok(())
    }
}

/// Records the text of every `WARN` event of the `oncebox` targets.
pub(super) struct Warnings(pub(super) Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let metadata = event.metadata();
        if *metadata.level() != tracing::Level::WARN || !metadata.target().starts_with("oncebox") {
            return;
        }
        let mut text = String::new();
        event.record(
            &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                use std::fmt::Write;
                let _ = write!(text, "{}={value:?} ", field.name());
            },
        );
        lock(&self.0).push(text);
    }
}

/// The finished spans.
pub(super) struct Spans(pub(super) Vec<SpanData>);

impl Spans {
    /// The `create` span of message `id`: the child of `request`.
    pub(super) fn creation_of(&self, id: &str, request: &RequestSpan) -> &SpanData {
        let creations = self.of(id, "create");
        assert_eq!(
            creations.len(),
            1,
            "[trace] one create span for {id}: {creations:?}"
        );
        let creation = creations[0];
        assert_eq!(
            creation.span_context.trace_id(),
            request.trace_id,
            "[trace] the enqueue left the request's trace"
        );
        assert_eq!(creation.span_kind, SpanKind::Producer);
        assert_eq!(
            creation.parent_span_id, request.span_id,
            "[trace] the create span is not the request's child"
        );
        assert!(creation.name.starts_with("create "), "{}", creation.name);
        assert_eq!(
            attr(creation, "messaging.system"),
            oncebox_core::trace::SYSTEM
        );
        creation
    }

    /// The relay's `send` span linked to `creation`: named for `topic`, through `system`.
    pub(super) fn check_send(&self, topic: &str, system: &str, creation: &SpanData) {
        let sends: Vec<&SpanData> = self
            .0
            .iter()
            .filter(|span| links_to(span, creation))
            .filter(|span| attr(span, "messaging.operation.type") == "send")
            .collect();
        assert!(
            !sends.is_empty(),
            "[trace] no send span links to the creation context"
        );
        for send in sends {
            assert_eq!(send.name, format!("send {topic}"));
            assert_eq!(send.span_kind, SpanKind::Client);
            assert_eq!(attr(send, "messaging.system"), system);
            assert_eq!(attr(send, "messaging.destination.name"), topic);
            // Left out for a batch of one, as the conventions ask.
            // (A message without a valid creation context has no link.)
            let count = match attr(send, "messaging.batch.message_count").as_str() {
                "" => 1,
                count => {
                    let count: usize = count.parse().expect("a count");
                    assert!(count >= 2, "[trace] a batch of one carries no count");
                    count
                }
            };
            assert!(
                send.links.len() <= count,
                "[trace] a link per message at most"
            );
            assert_eq!(attr(send, "messaging.operation.name"), "send");
        }
    }

    /// The spans of `operation` (`create`, `process`) on message `id`.
    pub(super) fn of(&self, id: &str, operation: &str) -> Vec<&SpanData> {
        self.0
            .iter()
            .filter(|span| attr(span, "messaging.operation.type") == operation)
            .filter(|span| attr(span, "messaging.message.id") == id)
            .collect()
    }
}

/// A consumer's `process` span: the child of `creation` and linked to it, with the
/// messaging attributes.
pub(super) fn check_process(
    span: &SpanData,
    topic: &str,
    system: &str,
    group: &str,
    creation: &SpanData,
) {
    assert_eq!(span.span_kind, SpanKind::Consumer, "[trace] {}", span.name);
    assert_eq!(span.name, format!("process {topic}"));
    assert_eq!(
        span.span_context.trace_id(),
        creation.span_context.trace_id(),
        "[trace] the process span is not in the producer's trace"
    );
    assert_eq!(
        span.parent_span_id,
        creation.span_context.span_id(),
        "[trace] the process span is not the create span's child"
    );
    assert!(
        links_to(span, creation),
        "[trace] the process span does not link to its creation"
    );
    assert_eq!(attr(span, "messaging.system"), system);
    assert_eq!(attr(span, "messaging.destination.name"), topic);
    assert_eq!(attr(span, "messaging.consumer.group.name"), group);
    assert_eq!(attr(span, "messaging.operation.type"), "process");
}

pub(super) fn links_to(span: &SpanData, creation: &SpanData) -> bool {
    span.links
        .iter()
        .any(|link| link.span_context.span_id() == creation.span_context.span_id())
}

/// The `traceparent` a span's context is written as.
pub(super) fn traceparent_of(span: &SpanData) -> String {
    format!(
        "00-{}-{}-{:02x}",
        span.span_context.trace_id(),
        span.span_context.span_id(),
        span.span_context.trace_flags().to_u8()
    )
}

/// The text of attribute `key` of `span`; empty when it has none.
pub(super) fn attr(span: &SpanData, key: &str) -> String {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(text) => text.to_string(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
