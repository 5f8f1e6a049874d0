//! A client that hangs up, and a response too large to store, on a plain tower service
//! over the in-memory store (the same scenarios over a real server and every store are
//! in `common/hang_up.rs`): the handler runs to its end once, and a retry gets what it
//! left, never a second run.

mod oneshot;

use std::time::Duration;

use http::StatusCode;
use oncebox_http::{IdempotencyOptions, problem};
use oneshot::{Answer, Handler, layer, memory, post, send, until_settled, until_started};
use tower::{Layer, ServiceExt};

/// The client hangs up while the handler runs (the usual reason it retries): the
/// handler runs to its end anyway, its response is stored, and the retry gets it, byte
/// for byte, from a handler that ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_gets_the_response_of_the_one_run_on_retry() {
    let (handler, open) = Handler::gated();
    let service = layer(memory(), IdempotencyOptions::new()).layer(handler.service());
    let mut first = Box::pin(service.clone().oneshot(post(Some("k-hang-up"), "{}")));
    until_started(&mut first, &handler).await;
    drop(first);

    // The handler still runs: a retry meanwhile gets 409, it does not run it again.
    let busy = tokio::time::timeout(
        Duration::from_secs(3),
        send(service.clone(), post(Some("k-hang-up"), "{}")),
    )
    .await
    .expect("the retry ran the handler again: the key was freed when the client hung up");
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert_eq!(busy.problem_type(), problem::KEY_IN_USE);

    open.send_replace(true);
    let retry = until_settled(
        &service,
        || post(Some("k-hang-up"), "{}"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(handler.calls(), 1, "the handler ran once");
    assert_eq!(handler.stopped(), 0, "the handler was not stopped");
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the retry is a replay");
    assert_eq!(
        retry.body,
        handler.bodies()[0],
        "the replay is the handler's response, byte for byte"
    );
}

/// A response over `max_response_bytes` reaches its client whole; what is stored is a
/// `410 response-not-stored` naming its status, so a retry learns that the request was
/// processed and the handler does not run again.
#[tokio::test]
async fn a_response_over_the_limit_is_sent_whole_and_not_run_again() {
    let mut handler = Handler::new();
    handler.body_len = 10_000;
    let service = layer(memory(), IdempotencyOptions::new().max_response_bytes(1000))
        .layer(handler.service());
    let first = send(service.clone(), post(Some("k-large"), "{}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(
        first.body,
        handler.bodies()[0],
        "the whole body reached the client"
    );
    assert!(first.body.len() >= 10_000);

    let second = send(service, post(Some("k-large"), "{}")).await;
    assert_eq!(
        handler.calls(),
        1,
        "the retry ran the handler again: the key was freed"
    );
    assert_response_not_stored(&second, 201);
}

/// The replay of a response too large to store.
fn assert_response_not_stored(answer: &Answer, original: u16) {
    assert!(answer.replayed(), "a replay");
    assert_eq!(answer.status, StatusCode::GONE);
    assert_eq!(answer.problem_type(), problem::RESPONSE_NOT_STORED);
    let json: serde_json::Value = serde_json::from_slice(&answer.body).expect("JSON");
    assert_eq!(json["original_status"], original, "{json}");
}

/// A client that hangs up before a response too large to store: the retry gets the
/// `410` too, and the handler ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_limit_after_a_hang_up_is_not_run_again() {
    let (mut handler, open) = Handler::gated();
    handler.body_len = 10_000;
    let service = layer(memory(), IdempotencyOptions::new().max_response_bytes(1000))
        .layer(handler.service());
    let mut first = Box::pin(service.clone().oneshot(post(Some("k-large-gone"), "{}")));
    until_started(&mut first, &handler).await;
    drop(first);
    open.send_replace(true);
    let retry = until_settled(
        &service,
        || post(Some("k-large-gone"), "{}"),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(handler.calls(), 1, "the handler ran once");
    assert_response_not_stored(&retry, 201);
}

/// A handler still running `hang_up_timeout` after its client hung up is stopped, and
/// only then is its key freed (as for a `5xx`): until then a retry gets `409`.
#[tokio::test(start_paused = true)]
async fn a_handler_running_past_the_hang_up_timeout_is_stopped_then_its_key_freed() {
    let mut handler = Handler::new();
    handler.delay = Duration::from_secs(3600);
    let timeout = Duration::from_secs(10);
    let options = IdempotencyOptions::new().hang_up_timeout(timeout);
    let service = layer(memory(), options).layer(handler.service());
    let mut first = Box::pin(service.clone().oneshot(post(Some("k-stop"), "{}")));
    until_started(&mut first, &handler).await;
    drop(first);

    tokio::time::sleep(timeout / 2).await;
    assert_eq!(handler.stopped(), 0, "stopped before hang_up_timeout");
    let busy = send(service.clone(), post(Some("k-stop"), "{}")).await;
    assert_eq!(
        busy.status,
        StatusCode::CONFLICT,
        "the key is held meanwhile"
    );

    tokio::time::sleep(timeout).await;
    assert_eq!(handler.stopped(), 1, "still running past hang_up_timeout");
    // The key is free: a retry takes it and runs the (hour-long) handler again.
    let retry = tokio::time::timeout(
        Duration::from_secs(1),
        send(service, post(Some("k-stop"), "{}")),
    )
    .await;
    assert!(
        retry.is_err(),
        "the retry was answered: {:?}",
        retry.ok().map(|a| a.status)
    );
    assert_eq!(handler.calls(), 2);
}

/// With `store_server_errors`, the stopped handler's key keeps a `504 handler-timeout`,
/// replayed to the retry: the handler does not run again.
#[tokio::test(start_paused = true)]
async fn a_handler_stopped_after_a_hang_up_is_replayed_as_504_where_5xx_are_stored() {
    let mut handler = Handler::new();
    handler.delay = Duration::from_secs(3600);
    let options = IdempotencyOptions::new()
        .hang_up_timeout(Duration::from_secs(10))
        .store_server_errors(true);
    let service = layer(memory(), options).layer(handler.service());
    let mut first = Box::pin(service.clone().oneshot(post(Some("k-504"), "{}")));
    until_started(&mut first, &handler).await;
    drop(first);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(handler.stopped(), 1);

    let retry = send(service, post(Some("k-504"), "{}")).await;
    assert!(retry.replayed());
    assert_eq!(retry.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(retry.problem_type(), problem::HANDLER_TIMEOUT);
    assert_eq!(handler.calls(), 1);
}

/// The timeout counts from the hang-up: a client that waits gets its answer from a
/// handler slower than `hang_up_timeout`.
#[tokio::test(start_paused = true)]
async fn a_client_that_waits_is_not_cut_off_by_the_hang_up_timeout() {
    let mut handler = Handler::new();
    handler.delay = Duration::from_secs(30);
    let options = IdempotencyOptions::new().hang_up_timeout(Duration::from_secs(10));
    let service = layer(memory(), options).layer(handler.service());
    let answer = send(service.clone(), post(Some("k-wait"), "{}")).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(answer.body, handler.bodies()[0]);
    assert_eq!(handler.stopped(), 0);
    let replay = send(service, post(Some("k-wait"), "{}")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, answer.body);
}
