//! One trace across the outbox hop (feature `otel`): an HTTP request handled by an axum
//! service enqueues an order; the relay publishes it through the transport under test; a
//! consumer handles it. The spans are captured by an in-memory OpenTelemetry exporter
//! and checked against the `oncebox_core::trace` table: the handler runs in the request's
//! trace, as the child of the enqueue's `create` span and linked to it; the relay's
//! `send` span links to the same creation context and the `traceparent` reaches the
//! consumer unchanged.
//!
//! | check | proves |
//! |---|---|
//! | [`request_to_handler`] | through a [`TransactionalInbox`]: the request's trace id in the handler, a redelivery (the first delivery is nacked after its commit) skipped as `duplicate` in the same trace, and a message whose stored `traceparent` is malformed published and handled in a fresh trace, with a warning |
//! | [`request_to_receiver`] | the same through an [`IdempotentReceiver`] |
//! | [`request_to_durable_handler`] | through a [`DurableInbox`] and its processor, with the relay stopped and a new one started between two requests: the context survives in the outbox and inbox tables |
//!
//! The spans are captured by the test binary's global subscriber, which the first check
//! installs: no other test of a binary running these checks may install one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use oncebox_core::consumer::{
    Consumer, ConsumerOptions, DurableInbox, Handler, IdempotentReceiver, Outcome, Process,
    TransactionalInbox, TxHandler,
};
use oncebox_core::memory::MemoryDedupStore;
use oncebox_core::spool::{Relay, SpoolOptions};
use oncebox_core::{
    Bytes, Delivery, Error, Message, Publisher, Received, Result, Subscriber, TRACEPARENT,
};
use opentelemetry::trace::{SpanId, SpanKind, TraceContextExt, TraceId, TracerProvider};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData};
use tokio::sync::watch;
use tower::ServiceExt;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use crate::inbox::{DurableInboxHarness, InboxHarness, TxOf};
use crate::outbox::OutboxHarness;
use crate::support::within;
use crate::transport::TransportHarness;

/// Checks the trace of one request through `transport` into a [`TransactionalInbox`] on
/// `inbox`, with a duplicate and a message carrying a malformed `traceparent`; see the
/// [module docs](self).
///
/// # Errors
///
/// A store or transport error.
///
/// # Panics
///
/// When a span is missing, misnamed, unlinked or in the wrong trace, or a step takes
/// longer than the harness's patience allows.
pub async fn request_to_handler<T, O, I>(transport: &T, outbox: Arc<O>, inbox: &I) -> Result<()>
where
    T: TransportHarness,
    O: OutboxHarness + 'static,
    I: InboxHarness + 'static,
{
    let (order, malformed) = hop(transport, outbox, "trace", |group, handled| {
        TransactionalInbox::new(
            inbox.store(),
            Recorder::<I>::new(handled),
            ConsumerOptions::new(group),
        )
    })
    .await?;
    for order in [order, malformed] {
        assert_eq!(
            inbox.count_effects(&order).await?,
            1,
            "[trace] the effect of {order} is not there exactly once"
        );
    }
    Ok(())
}

/// The same as [`request_to_handler`] through an [`IdempotentReceiver`] on an in-memory
/// dedup store.
///
/// # Errors
///
/// A store or transport error.
///
/// # Panics
///
/// As [`request_to_handler`].
pub async fn request_to_receiver<T, O>(transport: &T, outbox: Arc<O>) -> Result<()>
where
    T: TransportHarness,
    O: OutboxHarness + 'static,
{
    hop(transport, outbox, "trace-receiver", |group, handled| {
        IdempotentReceiver::new(
            MemoryDedupStore::new(1_000),
            RecordOnly(handled),
            ConsumerOptions::new(group),
        )
    })
    .await?;
    Ok(())
}

/// One request and one message with a malformed `traceparent` through `transport` into
/// the engine `engine` builds for a consumer group and a record of what it handled;
/// checks their spans and returns the two payloads.
async fn hop<T, O, P>(
    transport: &T,
    outbox: Arc<O>,
    label: &str,
    engine: impl FnOnce(String, Handled) -> Result<P>,
) -> Result<(String, String)>
where
    T: TransportHarness,
    O: OutboxHarness + 'static,
    P: Process + 'static,
{
    let patience = transport.patience() * 6;
    let topic = transport.fresh_topic(label).await?;
    let capture = Capture::watching(&topic);
    let group = format!("{topic}-billing");
    let publisher = transport.publisher().await?;
    let system = publisher.messaging_system();
    let subscriber = transport.subscriber(&topic, &group).await?;

    let handled = Handled::default();
    let engine = engine(group.clone(), handled.clone())?;
    let outcomes = Arc::new(Mutex::new(Vec::<(String, Outcome)>::new()));
    let subscriber = NackFirst {
        inner: subscriber,
        nacked: Arc::default(),
    };
    let consumer = Consumer::new(subscriber, engine).on_outcome({
        let outcomes = Arc::clone(&outcomes);
        move |received, outcome| {
            let order = String::from_utf8_lossy(&received.payload).into_owned();
            lock(&outcomes).push((order, outcome.clone()));
        }
    });
    let relay = Relay::new(outbox.store(), publisher, options("trace"))?;
    let stop = watch::Sender::new(false);

    let steps = async {
        let order = format!("order-{}", uuid_like());
        let request = place_order(Arc::clone(&outbox), &topic, &order).await;
        let malformed = format!("malformed-{}", uuid_like());
        let message = Message::new(topic.clone(), malformed.clone())
            .with_key(malformed.clone())
            .with_header(TRACEPARENT, MALFORMED)?;
        outbox.enqueue(&[message]).await?;
        let seen = handled.wait_for(&[&order, &malformed], patience).await;

        // The first delivery of the order was nacked after its commit, as by a consumer
        // that died before its ack: the broker delivers it again.
        let skipped = |order: &str| {
            lock(&outcomes)
                .iter()
                .any(|(o, outcome)| o == order && *outcome == Outcome::Duplicate)
        };
        within("[trace] the redeliveries are skipped", patience, async {
            while !(skipped(&order) && skipped(&malformed)) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        stop.send_replace(true);
        Ok::<_, Error>((order, request, malformed, seen))
    };
    let stopped = || {
        let mut stop = stop.subscribe();
        async move {
            let _ = stop.wait_for(|stop| *stop).await;
        }
    };
    let (relayed, consumed, steps) = tokio::join!(
        relay.run_until(stopped()),
        consumer.run_until(stopped()),
        steps
    );
    relayed?;
    consumed?;
    let (order, request, malformed, seen) = steps?;

    let first = &seen[&order];
    let id = message_id(first);
    let bad = &seen[&malformed];
    let spans = capture.spans_of(&[&id, &message_id(bad)], patience).await;
    assert_eq!(
        first.trace_id, request.trace_id,
        "[trace] the handler does not run in the request's trace"
    );
    let creation = spans.creation_of(&id, &request);
    assert_eq!(
        first.received.headers.get(TRACEPARENT),
        Some(traceparent_of(creation).as_str()),
        "[trace] the traceparent did not reach the consumer as the enqueue wrote it"
    );
    spans.check_send(&topic, system, creation);
    let processed = spans.of(&id, "process");
    for span in &processed {
        check_process(span, &topic, system, &group, creation);
    }
    let mut outcomes: Vec<String> = processed
        .iter()
        .map(|s| attr(s, "oncebox.outcome"))
        .collect();
    outcomes.sort();
    assert_eq!(
        outcomes,
        ["duplicate", "handled"],
        "[trace] the first delivery and the duplicate are not both on the trace"
    );

    // The malformed traceparent: published, handled in a fresh trace, a warning.
    assert_eq!(
        bad.received.headers.get(TRACEPARENT),
        Some(MALFORMED),
        "[trace] the malformed traceparent was not carried unchanged"
    );
    let mut fresh = spans.of(&message_id(bad), "process");
    fresh.sort_by_key(|span| attr(span, "oncebox.outcome"));
    let outcomes: Vec<String> = fresh
        .iter()
        .map(|span| attr(span, "oncebox.outcome"))
        .collect();
    assert_eq!(
        outcomes,
        ["duplicate", "handled"],
        "[trace] the malformed message"
    );
    for span in &fresh {
        assert_eq!(
            span.parent_span_id,
            SpanId::INVALID,
            "[trace] a fresh trace has no parent"
        );
        assert!(
            span.links.is_empty(),
            "[trace] nothing to link to: {:?}",
            span.links
        );
    }
    assert_eq!(fresh[1].span_context.trace_id(), bad.trace_id);
    assert!(
        capture.warned_about(&[&message_id(bad), "traceparent is malformed"]),
        "[trace] no warning named the malformed traceparent: {:?}",
        capture.warnings()
    );
    Ok((order, malformed))
}

/// Checks the trace of two requests through `transport` into a [`DurableInbox`] on
/// `inbox` and its processor, with the relay stopped after the first and a new relay
/// started after the second was enqueued; see the [module docs](self).
///
/// # Errors
///
/// A store or transport error.
///
/// # Panics
///
/// When a span is missing, misnamed, unlinked or in the wrong trace, or a step takes
/// longer than the harness's patience allows.
pub async fn request_to_durable_handler<T, O, I>(
    transport: &T,
    outbox: Arc<O>,
    inbox: &I,
) -> Result<()>
where
    T: TransportHarness,
    O: OutboxHarness + 'static,
    I: DurableInboxHarness + 'static,
{
    let patience = transport.patience() * 6;
    let topic = transport.fresh_topic("trace-durable").await?;
    let capture = Capture::watching(&topic);
    let group = format!("{topic}-billing");
    let system = transport.publisher().await?.messaging_system();
    let subscriber = transport.subscriber(&topic, &group).await?;

    let handled = Handled::default();
    let store = inbox.durable(&group);
    let durable = DurableInbox::new(store, ConsumerOptions::new(group.clone()))?;
    let processor = durable.processor(
        Recorder::<I>::new(handled.clone()),
        options("trace-durable-inbox"),
    )?;
    let consumer = Consumer::new(subscriber, durable);
    let stop = watch::Sender::new(false);
    let stopped = || {
        let mut stop = stop.subscribe();
        async move {
            let _ = stop.wait_for(|stop| *stop).await;
        }
    };

    let steps = async {
        let mut orders = Vec::new();
        for round in 0..2 {
            let order = format!("order-{round}-{}", uuid_like());
            let request = place_order(Arc::clone(&outbox), &topic, &order).await;
            // A relay of its own each round: the first is stopped for good before the
            // second order is enqueued, whose context waits in the table meanwhile.
            let relay = Relay::new(
                outbox.store(),
                transport.publisher().await?,
                options("trace"),
            )?;
            let done = handled.clone();
            let waited = order.clone();
            relay
                .run_until(async move {
                    done.wait_for(&[&waited], patience).await;
                })
                .await?;
            orders.push((order, request));
        }
        stop.send_replace(true);
        Ok::<_, Error>(orders)
    };
    let (processed, consumed, steps) = tokio::join!(
        processor.run_until(stopped()),
        consumer.run_until(stopped()),
        steps
    );
    processed?;
    consumed?;
    let orders = steps?;

    let seen = handled.seen.borrow().clone();
    let ids: Vec<String> = orders
        .iter()
        .map(|(order, _)| message_id(&seen[order]))
        .collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let spans = capture.spans_of(&ids, patience).await;
    for (order, request) in &orders {
        assert_eq!(
            seen[order].trace_id, request.trace_id,
            "[trace] the durable inbox's handler does not run in the request's trace"
        );
        assert_eq!(inbox.count_effects(order).await?, 1);
        let id = message_id(&seen[order]);
        let creation = spans.creation_of(&id, request);
        spans.check_send(&topic, system, creation);
        let processed = spans.of(&id, "process");
        let stored: Vec<&&SpanData> = processed
            .iter()
            .filter(|span| attr(span, "oncebox.outcome") == "stored")
            .collect();
        assert_eq!(
            stored.len(),
            1,
            "[trace] the store step of {order}: {processed:?}"
        );
        check_process(stored[0], &topic, system, &group, creation);
        let handled: Vec<&&SpanData> = processed
            .iter()
            .filter(|span| attr(span, "oncebox.outcome") == "handled")
            .collect();
        assert_eq!(
            handled.len(),
            1,
            "[trace] the processing of {order}: {processed:?}"
        );
        check_process(
            handled[0],
            &topic,
            oncebox_core::trace::SYSTEM,
            &group,
            creation,
        );
    }
    Ok(())
}

/// Nacks the first delivery of every message instead of acking it, as a consumer that
/// died between its commit and its ack: the broker redelivers, and the inbox skips the
/// copy as a duplicate.
struct NackFirst<S> {
    inner: S,
    nacked: Arc<Mutex<HashSet<String>>>,
}

impl<S: Subscriber> Subscriber for NackFirst<S> {
    type Delivery = MaybeNacked<S::Delivery>;

    async fn next(&mut self) -> Result<Self::Delivery> {
        let inner = self.inner.next().await?;
        let id = inner
            .received()
            .id
            .map(|id| id.to_string())
            .unwrap_or_default();
        let nack = lock(&self.nacked).insert(id);
        Ok(MaybeNacked { inner, nack })
    }
}

struct MaybeNacked<D> {
    inner: D,
    nack: bool,
}

impl<D: Delivery> Delivery for MaybeNacked<D> {
    fn received(&self) -> &Received {
        self.inner.received()
    }

    async fn ack(self) -> Result<()> {
        if self.nack {
            self.inner.nack(Duration::ZERO).await
        } else {
            self.inner.ack().await
        }
    }

    async fn nack(self, delay: Duration) -> Result<()> {
        self.inner.nack(delay).await
    }

    async fn dead_letter(self, reason: &str) -> Result<()> {
        self.inner.dead_letter(reason).await
    }

    fn messaging_system(&self) -> &'static str {
        self.inner.messaging_system()
    }
}

/// The id of the message the handler saw.
fn message_id(seen: &Seen) -> String {
    seen.received
        .id
        .map(|id| id.to_string())
        .expect("oncebox's own messages carry their id")
}

/// A `traceparent` that is not one (its trace id is not hex).
const MALFORMED: &str = "00-this-is-not-a-trace-id-01";

/// The spool options of the checks: quick polls.
fn options(name: &str) -> SpoolOptions {
    SpoolOptions::new()
        .name(name)
        .poll_interval(Duration::from_millis(5), Duration::from_millis(50))
}

fn uuid_like() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The server span of a request: its trace and its own id.
struct RequestSpan {
    trace_id: TraceId,
    span_id: SpanId,
}

/// Sends `POST /orders` with `order` as its body to an axum service whose handler
/// enqueues the order's event in `outbox`; returns the request's span.
async fn place_order<O: OutboxHarness + 'static>(
    outbox: Arc<O>,
    topic: &str,
    order: &str,
) -> RequestSpan {
    let app = Router::new()
        .route("/orders", post(enqueue_order::<O>))
        .layer(middleware::from_fn(request_span))
        .with_state((outbox, topic.to_owned()));
    let request = Request::post("/orders")
        .body(Body::from(order.to_owned()))
        .expect("a valid request");
    let response = app.oneshot(request).await.expect("axum is infallible");
    assert_eq!(
        response.status(),
        StatusCode::CREATED,
        "[trace] POST /orders failed"
    );
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let span = RequestSpan {
        trace_id: TraceId::from_hex(&header("x-trace-id")).unwrap_or(TraceId::INVALID),
        span_id: SpanId::from_hex(&header("x-span-id")).unwrap_or(SpanId::INVALID),
    };
    assert_ne!(
        span.trace_id,
        TraceId::INVALID,
        "[trace] the request was not traced"
    );
    span
}

/// The service's handler: the order's event, enqueued in a transaction of the outbox.
async fn enqueue_order<O: OutboxHarness>(
    State((outbox, topic)): State<(Arc<O>, String)>,
    order: String,
) -> StatusCode {
    let event = Message::new(topic, order.clone())
        .with_key(order)
        .with_kind("OrderPlaced");
    match outbox.enqueue(&[event]).await {
        Ok(()) => StatusCode::CREATED,
        Err(error) => {
            tracing::error!(%error, "enqueue failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// The server span of a request, as `tower-http`'s trace layer would open it; the
/// response tells its trace and span ids (the span itself may end after the response:
/// sqlx's SQLite worker keeps the span of a connection's last statement until the
/// connection is used again).
async fn request_span(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{} {}", request.method(), request.uri().path()),
        otel.kind = "server",
        http.request.method = %request.method(),
        url.path = %request.uri().path(),
    );
    let context = span.context().span().span_context().clone();
    let mut response = next.run(request).instrument(span).await;
    for (name, value) in [
        ("x-trace-id", context.trace_id().to_string()),
        ("x-span-id", context.span_id().to_string()),
    ] {
        if let Ok(value) = value.parse() {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// What the handler saw of one order.
#[derive(Debug, Clone)]
struct Seen {
    trace_id: TraceId,
    received: Received,
}

/// The orders handled so far, by payload.
#[derive(Clone, Default)]
struct Handled {
    seen: Arc<watch::Sender<HashMap<String, Seen>>>,
}

impl Handled {
    fn record(&self, received: &Received) {
        let seen = Seen {
            trace_id: tracing::Span::current()
                .context()
                .span()
                .span_context()
                .trace_id(),
            received: received.clone(),
        };
        let order = String::from_utf8_lossy(&received.payload).into_owned();
        self.seen.send_modify(|map| {
            map.entry(order).or_insert(seen);
        });
    }

    /// Waits until every one of `orders` was handled; returns what was seen.
    async fn wait_for(&self, orders: &[&str], patience: Duration) -> HashMap<String, Seen> {
        let mut seen = self.seen.subscribe();
        within("[trace] the orders are handled", patience, async {
            let _ = seen
                .wait_for(|map| orders.iter().all(|order| map.contains_key(*order)))
                .await;
        })
        .await;
        seen.borrow().clone()
    }
}

/// The idempotent receiver's handler: records what it saw.
struct RecordOnly(Handled);

impl Handler for RecordOnly {
    type Output = ();

    async fn handle(&self, message: &Received) -> Result<()> {
        self.0.record(message);
        Ok(())
    }
}

/// The handler: records what it saw and writes the order's effect.
struct Recorder<I> {
    handled: Handled,
    _harness: std::marker::PhantomData<fn() -> I>,
}

impl<I> Recorder<I> {
    fn new(handled: Handled) -> Self {
        Self {
            handled,
            _harness: std::marker::PhantomData,
        }
    }
}

impl<I: InboxHarness> TxHandler<TxOf<I>> for Recorder<I> {
    type Output = Bytes;

    async fn handle(&self, message: &Received, tx: &mut TxOf<I>) -> Result<Bytes> {
        I::insert_effect(tx, &String::from_utf8_lossy(&message.payload)).await?;
        self.handled.record(message);
        Ok(Bytes::new())
    }
}

/// An OpenTelemetry pipeline into memory, installed as the global subscriber of the test
/// binary on first use (a subscriber per thread would share call sites with the tests
/// running beside it, whose interest tracing caches), with the `oncebox` warnings beside
/// it. It keeps the spans of the topics the checks watch, and the request spans.
struct Capture {
    kept: Kept,
    warnings: Arc<Mutex<Vec<String>>>,
    _provider: SdkTracerProvider,
}

static CAPTURE: std::sync::OnceLock<Capture> = std::sync::OnceLock::new();

impl Capture {
    /// The capture, watching `topic` from now on.
    fn watching(topic: &str) -> &'static Self {
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
    async fn spans_of(&self, ids: &[&str], patience: Duration) -> Spans {
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

    fn warnings(&self) -> Vec<String> {
        lock(&self.warnings).clone()
    }

    /// Whether one warning holds every one of `texts`.
    fn warned_about(&self, texts: &[&str]) -> bool {
        self.warnings()
            .iter()
            .any(|warning| texts.iter().all(|text| warning.contains(text)))
    }
}

/// An exporter keeping the spans of watched topics, and server spans.
#[derive(Debug, Clone, Default)]
struct Kept {
    topics: Arc<Mutex<HashSet<String>>>,
    spans: Arc<Mutex<Vec<SpanData>>>,
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
struct Warnings(Arc<Mutex<Vec<String>>>);

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
struct Spans(Vec<SpanData>);

impl Spans {
    /// The `create` span of message `id`: the child of `request`.
    fn creation_of(&self, id: &str, request: &RequestSpan) -> &SpanData {
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
    fn check_send(&self, topic: &str, system: &str, creation: &SpanData) {
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
    fn of(&self, id: &str, operation: &str) -> Vec<&SpanData> {
        self.0
            .iter()
            .filter(|span| attr(span, "messaging.operation.type") == operation)
            .filter(|span| attr(span, "messaging.message.id") == id)
            .collect()
    }
}

/// A consumer's `process` span: the child of `creation` and linked to it, with the
/// messaging attributes.
fn check_process(span: &SpanData, topic: &str, system: &str, group: &str, creation: &SpanData) {
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

fn links_to(span: &SpanData, creation: &SpanData) -> bool {
    span.links
        .iter()
        .any(|link| link.span_context.span_id() == creation.span_context.span_id())
}

/// The `traceparent` a span's context is written as.
fn traceparent_of(span: &SpanData) -> String {
    format!(
        "00-{}-{}-{:02x}",
        span.span_context.trace_id(),
        span.span_context.span_id(),
        span.span_context.trace_flags().to_u8()
    )
}

/// The text of attribute `key` of `span`; empty when it has none.
fn attr(span: &SpanData, key: &str) -> String {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(text) => text.to_string(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
