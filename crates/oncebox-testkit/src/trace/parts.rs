//! The service under test: the order endpoint, a consumer that dies between its commit
//! and its ack, and handlers that record what they saw.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use oncebox_core::consumer::{Handler, TxHandler};
use oncebox_core::spool::SpoolOptions;
use oncebox_core::{Bytes, Delivery, Message, Received, Result, Subscriber};
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId};
use tokio::sync::watch;
use tower::ServiceExt;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::capture::lock;
use crate::inbox::{InboxHarness, TxOf};
use crate::outbox::OutboxHarness;
use crate::support::within;

/// Nacks the first delivery of every message instead of acking it, as a consumer that
/// died between its commit and its ack: the broker redelivers, and the inbox skips the
/// copy as a duplicate.
pub(super) struct NackFirst<S> {
    pub(super) inner: S,
    pub(super) nacked: Arc<Mutex<HashSet<String>>>,
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

pub(super) struct MaybeNacked<D> {
    pub(super) inner: D,
    pub(super) nack: bool,
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
pub(super) fn message_id(seen: &Seen) -> String {
    seen.received
        .id
        .map(|id| id.to_string())
        .expect("oncebox's own messages carry their id")
}

/// A `traceparent` that is not one (its trace id is not hex).
pub(super) const MALFORMED: &str = "00-this-is-not-a-trace-id-01";

/// The spool options of the checks: quick polls.
pub(super) fn options(name: &str) -> SpoolOptions {
    SpoolOptions::new()
        .name(name)
        .poll_interval(Duration::from_millis(5), Duration::from_millis(50))
}

pub(super) fn uuid_like() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The server span of a request: its trace and its own id.
pub(super) struct RequestSpan {
    pub(super) trace_id: TraceId,
    pub(super) span_id: SpanId,
}

/// Sends `POST /orders` with `order` as its body to an axum service whose handler
/// enqueues the order's event in `outbox`; returns the request's span.
pub(super) async fn place_order<O: OutboxHarness + 'static>(
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
pub(super) async fn enqueue_order<O: OutboxHarness>(
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
pub(super) async fn request_span(request: Request, next: Next) -> Response {
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
pub(super) struct Seen {
    pub(super) trace_id: TraceId,
    pub(super) received: Received,
}

/// The orders handled so far, by payload.
#[derive(Clone, Default)]
pub(super) struct Handled {
    pub(super) seen: Arc<watch::Sender<HashMap<String, Seen>>>,
}

impl Handled {
    pub(super) fn record(&self, received: &Received) {
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
    pub(super) async fn wait_for(
        &self,
        orders: &[&str],
        patience: Duration,
    ) -> HashMap<String, Seen> {
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
pub(super) struct RecordOnly(pub(super) Handled);

impl Handler for RecordOnly {
    type Output = ();

    async fn handle(&self, message: &Received) -> Result<()> {
        self.0.record(message);
        Ok(())
    }
}

/// The handler: records what it saw and writes the order's effect.
pub(super) struct Recorder<I> {
    pub(super) handled: Handled,
    pub(super) _harness: std::marker::PhantomData<fn() -> I>,
}

impl<I> Recorder<I> {
    pub(super) fn new(handled: Handled) -> Self {
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
