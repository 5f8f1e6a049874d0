//! The spans of the outbox hop, named as OpenTelemetry's messaging semantic conventions
//! (version [`SEMCONV_VERSION`]) name them, and, with the feature `otel`, the W3C trace
//! context that ties them into one trace.
//!
//! | span | kind | opened by | parent | links to |
//! |---|---|---|---|---|
//! | `create {topic}` | producer | an outbox's `enqueue` (`enqueue_batch`: one per message, all open while its statement runs) | the caller's current span | |
//! | `send {topic}` (`send` when a batch spans several topics) | client | the relay, once per claimed batch | the relay's current span | the creation context of each message in the batch |
//! | `process {topic}` | consumer | the [`Consumer`](crate::consumer::Consumer) for each delivery (transactional inbox, durable inbox's store step, idempotent receiver), and the durable inbox's processor for each row | the message's creation context | the message's creation context |
//!
//! The creation context is the `create` span's: at enqueue it is written into the
//! message's headers as [`TRACEPARENT`] and [`TRACESTATE`] (unless the message carries a
//! `traceparent` already), stored with the row, and put on the wire unchanged by every
//! transport. A producer outside Rust writes the same two headers into the row's
//! `headers` column. The relay's `send` span starts a trace of its own, since one batch
//! carries messages of many traces; the conventions ask for links there, and a
//! consumer's `process` span, which handles one message, continues the producer's trace
//! as its child. So a request that enqueued an order and the handler that charged it
//! share one trace id.
//!
//! Attributes: `messaging.system` (the broker: `kafka`, `rabbitmq`, `nats`, `redis`, or
//! `oncebox` for the outbox and inbox tables and the in-process broker),
//! `messaging.destination.name`, `messaging.operation.type` and `.name`,
//! `messaging.message.id`, `messaging.message.body.size`, `messaging.consumer.group.name`
//! (the consumer's name), `messaging.destination.partition.id`,
//! `messaging.batch.message_count`; and `oncebox.outcome` on `process` spans, the
//! [`Outcome::label`] (`duplicate` for a duplicate skipped by the inbox), failures with
//! `error.type` ([`Error::kind`](crate::Error::kind)) and an error status.
//!
//! All spans are `INFO` spans of the target `oncebox`. Without the feature `otel` they are
//! plain `tracing` spans, for logs; with it, and a `tracing-opentelemetry` layer installed,
//! they are exported as above. A stored `traceparent` that does not parse is never a
//! reason to refuse a message: it is published and handled in a fresh trace, with a
//! warning.

use std::borrow::Cow;

use tracing::Span;
use tracing::field::Empty;

use crate::consumer::Outcome;
use crate::{Headers, Message, Received};

/// The version of OpenTelemetry's semantic conventions the spans follow.
pub const SEMCONV_VERSION: &str = "1.42.0";

/// `messaging.system` of the outbox and inbox tables and the in-process broker.
pub const SYSTEM: &str = "oncebox";

pub use crate::headers::TRACEPARENT;

/// The W3C trace-context header carrying vendor state beside [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

/// The `create {topic}` span of an enqueue, and the headers to store with the message:
/// its own, plus the span's trace context when tracing is on (feature `otel`) and the
/// message carries no `traceparent` of its own.
///
/// Outbox stores call it in `enqueue`, run the insert in the span and store the
/// headers returned.
pub fn creation(message: &Message) -> (Span, Cow<'_, Headers>) {
    let span = tracing::info_span!(
        target: "oncebox",
        "create",
        otel.name = %format_args!("create {}", message.topic),
        otel.kind = "producer",
        messaging.system = SYSTEM,
        messaging.destination.name = %message.topic,
        messaging.operation.type = "create",
        messaging.operation.name = "create",
        otel.status_code = Empty,
        error.type = Empty,
        messaging.message.id = %message.id,
        messaging.message.body.size = message.payload.len() as u64,
    );
    #[cfg(feature = "otel")]
    if let Some(headers) = otel::with_context_of(&span, &message.headers) {
        return (span, Cow::Owned(headers));
    }
    (span, Cow::Borrowed(&message.headers))
}

/// The relay's `send` span for one claimed batch of `messages`, published through
/// `system`: linked to each message's creation context.
pub fn send<'m>(
    system: &'static str,
    messages: impl ExactSizeIterator<Item = &'m Message> + Clone,
) -> Span {
    let count = messages.len();
    let mut topics = messages.clone().map(|m| m.topic.as_str());
    let first = topics.next().unwrap_or_default();
    let topic = topics.all(|t| t == first).then_some(first);
    let span = tracing::info_span!(
        target: "oncebox",
        "send",
        otel.name = %match topic {
            Some(topic) => format!("send {topic}"),
            None => "send".to_owned(),
        },
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        messaging.system = system,
        messaging.destination.name = topic,
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        // The conventions leave it out for a single message.
        messaging.batch.message_count = (count > 1).then_some(count as u64),
    );
    #[cfg(feature = "otel")]
    if !span.is_disabled() {
        for message in messages {
            otel::link_creation(&span, &message.headers, &message.id.to_string());
        }
    }
    span
}

/// The `process {topic}` span of one delivery (or stored row) of `received`, handled by
/// the consumer `group`: the creation context's child, linked to it too.
pub(crate) fn process(system: &'static str, group: &str, received: &Received) -> Span {
    let span = tracing::info_span!(
        target: "oncebox",
        "process",
        otel.name = %format_args!("process {}", received.topic),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = system,
        messaging.destination.name = %received.topic,
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.consumer.group.name = %group,
        messaging.message.id = Empty,
        messaging.message.body.size = received.payload.len() as u64,
        messaging.destination.partition.id = received.coordinates.partition.map(tracing::field::display),
        oncebox.outcome = Empty,
        error.type = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    // The producer's id, or one the wire kept because it is not a UUID.
    let id = received.id.map(|id| id.to_string()).or_else(|| {
        let kept = crate::wire::kept_header_name("id");
        received.headers.get(&kept).map(str::to_owned)
    });
    if let Some(id) = &id {
        span.record("messaging.message.id", id.as_str());
    }
    #[cfg(feature = "otel")]
    otel::continue_creation(&span, &received.headers, id.as_deref().unwrap_or("(no id)"));
    span
}

/// Records on a relay's `send` span the messages of its batch that were not published:
/// an error status saying how many.
pub(crate) fn record_batch(span: &Span, report: &crate::spool::BatchReport) {
    if report.retried + report.dead > 0 {
        span.record("otel.status_code", "error");
        span.record(
            "otel.status_description",
            format!(
                "{} of {} messages failed: {} to retry, {} dead-lettered",
                report.retried + report.dead,
                report.claimed,
                report.retried,
                report.dead
            ),
        );
    }
}

/// Records what became of a delivery on its `process` span.
pub(crate) fn record_outcome(span: &Span, outcome: &Outcome) {
    span.record("oncebox.outcome", outcome.label());
    if let Outcome::Retrying { .. } | Outcome::DeadLettered { .. } = outcome {
        span.record("otel.status_code", "error");
    }
}

/// Records a failure on a `create` or `process` span: an error status and the error's
/// kind.
pub fn record_error(span: &Span, error: &crate::Error) {
    span.record("otel.status_code", "error");
    span.record("error.type", error.kind());
}

#[cfg(feature = "otel")]
mod otel {
    //! W3C trace context in and out of [`Headers`].

    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::{SpanContext, TraceContextExt};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{TRACEPARENT, TRACESTATE};
    use crate::Headers;

    /// `headers` with the trace context of `span` (or, where oncebox's spans are not
    /// traced, of the caller's current span) added; `None` when they carry a
    /// `traceparent` already or nothing is traced.
    pub(super) fn with_context_of(span: &Span, headers: &Headers) -> Option<Headers> {
        if headers.get(TRACEPARENT).is_some() {
            return None;
        }
        let context = [span.clone(), Span::current()]
            .iter()
            .filter(|span| !span.is_disabled())
            .map(OpenTelemetrySpanExt::context)
            .find(|context| context.span().span_context().is_valid())?;
        let mut carrier = Carrier {
            headers: headers.clone(),
        };
        TraceContextPropagator::new().inject_context(&context, &mut carrier);
        Some(carrier.headers)
    }

    /// Makes `span` the child of the creation context in `headers`, and links it to it.
    pub(super) fn continue_creation(span: &Span, headers: &Headers, id: &str) {
        if let Some(creation) = creation_context(headers, id) {
            let context = opentelemetry::Context::new().with_remote_span_context(creation.clone());
            // Fails only for a span started already or not traced: then it stays a root.
            let _ = span.set_parent(context);
            span.add_link(creation);
        }
    }

    /// Links `span` to the creation context in `headers`.
    pub(super) fn link_creation(span: &Span, headers: &Headers, id: &str) {
        if let Some(creation) = creation_context(headers, id) {
            span.add_link(creation);
        }
    }

    /// The creation context carried in `headers`, if any; a warning naming message `id`
    /// when a `traceparent` is there but does not parse.
    fn creation_context(headers: &Headers, id: &str) -> Option<SpanContext> {
        let traceparent = headers.get(TRACEPARENT)?;
        let context = TraceContextPropagator::new().extract(&Reader(headers));
        let creation = context.span().span_context().clone();
        if creation.is_valid() {
            return Some(creation);
        }
        tracing::warn!(
            target: "oncebox",
            message_id = %id,
            traceparent = %crate::error::excerpt(traceparent),
            "the message's traceparent is malformed; it is traced without its producer's context"
        );
        None
    }

    struct Reader<'a>(&'a Headers);

    impl Extractor for Reader<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key)
        }

        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(name, _)| name).collect()
        }
    }

    struct Carrier {
        headers: Headers,
    }

    impl Injector for Carrier {
        fn set(&mut self, key: &str, value: String) {
            // The propagator writes only traceparent and tracestate, whose values are
            // visible ASCII: always valid headers. An empty tracestate is left out.
            debug_assert!(key == TRACEPARENT || key == TRACESTATE);
            if !value.is_empty() {
                let _ = self.headers.insert(key, value);
            }
        }
    }
}
