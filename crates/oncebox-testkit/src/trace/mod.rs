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

mod capture;
mod parts;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use oncebox_core::consumer::{
    Consumer, ConsumerOptions, DurableInbox, IdempotentReceiver, Outcome, Process,
    TransactionalInbox,
};
use oncebox_core::memory::MemoryDedupStore;
use oncebox_core::spool::Relay;
use oncebox_core::{Error, Message, Publisher, Result, TRACEPARENT};
use opentelemetry::trace::SpanId;
use opentelemetry_sdk::trace::SpanData;
use tokio::sync::watch;

use crate::inbox::{DurableInboxHarness, InboxHarness};
use crate::outbox::OutboxHarness;
use crate::support::within;
use crate::transport::TransportHarness;
use capture::{Capture, attr, check_process, lock, traceparent_of};
use parts::{
    Handled, MALFORMED, NackFirst, RecordOnly, Recorder, message_id, options, place_order,
    uuid_like,
};

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
