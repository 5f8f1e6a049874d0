//! Who may see a stored response: tried as a new user would, an axum app with the layer
//! as the documentation shows it, and two callers with their own credentials.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use oncebox_core::memory::MemoryDedupStore;
use oncebox_http::{HeaderPrincipal, IdempotencyLayer, IdempotencyOptions, SharedScope, problem};
use tower::ServiceExt;

/// Charges the caller named by the bearer token, and says whose payment it made.
fn payments(calls: Arc<AtomicUsize>) -> Router {
    Router::new().route(
        "/payments",
        post(move |headers: HeaderMap, body: String| {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let payer = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .and_then(|token| token.strip_suffix("-token"))
                    .unwrap_or("nobody")
                    .to_owned();
                (
                    StatusCode::CREATED,
                    format!("{{\"payer\":\"{payer}\",\"request\":{body}}}"),
                )
            }
        }),
    )
}

async fn pay(app: &Router, token: &str, key: &str) -> (StatusCode, String) {
    let request = Request::post("/payments")
        .header("authorization", format!("Bearer {token}"))
        .header("idempotency-key", key)
        .body(Body::from("{\"amount_cents\":4200}"))
        .expect("request");
    send(app, request).await
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// As the crate's first example builds it: keys kept per `Authorization` header.
#[tokio::test]
async fn a_caller_never_gets_another_callers_response() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(
        MemoryDedupStore::default(),
        HeaderPrincipal::authorization(),
        IdempotencyOptions::new().required(true),
    )
    .expect("valid options");
    let app = payments(Arc::clone(&calls)).layer(layer);

    let (status, alice) = pay(&app, "alice-token", "order-17").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(alice.contains("\"payer\":\"alice\""), "{alice}");

    // Bob happens to use (or guesses) the same key.
    let (status, bob) = pay(&app, "bob-token", "order-17").await;
    assert!(
        !bob.contains("alice"),
        "Bob received Alice's stored response: {status} {bob}"
    );
    assert_eq!(status, StatusCode::CREATED, "{bob}");
    assert!(bob.contains("\"payer\":\"bob\""), "{bob}");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each caller's payment ran");

    // Each one's retry replays their own response, and runs nothing.
    assert_eq!(pay(&app, "alice-token", "order-17").await.1, alice);
    assert_eq!(pay(&app, "bob-token", "order-17").await.1, bob);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A request with a key `Authorization` and `x-api-key` headers as given.
fn keyed(authorization: Option<&str>, api_keys: &[&str]) -> Request<Body> {
    let mut request = Request::post("/payments").header("idempotency-key", "order-17");
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    for api_key in api_keys {
        request = request.header("x-api-key", *api_key);
    }
    request.body(Body::from("{}")).expect("request")
}

/// As the payments example builds it: keys kept per `X-Api-Key`. Callers who send none
/// (they authenticate otherwise, or the route is open), an empty one, or two of them
/// (which one did authentication check?) must not share a scope: they are refused.
#[tokio::test]
async fn a_request_without_a_principal_is_refused_not_shared() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(
        MemoryDedupStore::default(),
        HeaderPrincipal::new(http::HeaderName::from_static("x-api-key")),
        IdempotencyOptions::new(),
    )
    .expect("valid options");
    let app = payments(Arc::clone(&calls)).layer(layer);

    for request in [
        keyed(Some("Bearer alice-token"), &[]),
        keyed(Some("Bearer bob-token"), &[]),
        keyed(None, &[""]),
        keyed(None, &["bob", "alice"]),
    ] {
        let (status, body) = send(&app, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains(problem::PRINCIPAL_MISSING), "{body}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no payment ran unscoped");

    // Identified, the same request runs.
    let (status, body) = send(&app, keyed(None, &["alice"])).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A closure that finds no subject (`None`, or an empty one) refuses the request too.
#[tokio::test]
async fn a_closure_without_a_subject_refuses_the_request() {
    let calls = Arc::new(AtomicUsize::new(0));
    let subject = |parts: &http::request::Parts| {
        let user = parts.headers.get("x-user")?.to_str().ok()?;
        Some(user.to_owned())
    };
    let layer = IdempotencyLayer::new(
        MemoryDedupStore::default(),
        subject,
        IdempotencyOptions::new(),
    )
    .expect("valid options");
    let app = payments(Arc::clone(&calls)).layer(layer);
    for user in [None, Some("")] {
        let mut request = keyed(None, &[]);
        if let Some(user) = user {
            request
                .headers_mut()
                .insert("x-user", http::HeaderValue::from_static(user));
        }
        let (status, body) = send(&app, request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{user:?}: {body}");
        assert!(body.contains(problem::PRINCIPAL_MISSING), "{body}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Only requests with a key need a principal: without one, a request passes through
/// (or, where keys are required, is refused for its missing key).
#[tokio::test]
async fn requests_without_a_key_need_no_principal() {
    let calls = Arc::new(AtomicUsize::new(0));
    let optional = IdempotencyLayer::new(
        MemoryDedupStore::default(),
        HeaderPrincipal::authorization(),
        IdempotencyOptions::new(),
    )
    .expect("valid options");
    let app = payments(Arc::clone(&calls)).layer(optional);
    let request = Request::post("/payments")
        .body(Body::from("{}"))
        .expect("request");
    assert_eq!(send(&app, request).await.0, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let required = IdempotencyLayer::new(
        MemoryDedupStore::default(),
        HeaderPrincipal::authorization(),
        IdempotencyOptions::new().required(true),
    )
    .expect("valid options");
    let app = payments(Arc::clone(&calls)).layer(required);
    let request = Request::post("/payments")
        .body(Body::from("{}"))
        .expect("request");
    let (status, body) = send(&app, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains(problem::KEY_MISSING), "{body}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The explicit opt-in does what its name says, risk included: every caller shares one
/// scope, so Bob gets Alice's response.
#[tokio::test]
async fn the_shared_scope_shares_responses_as_documented() {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(
        MemoryDedupStore::default(),
        SharedScope,
        IdempotencyOptions::new(),
    )
    .expect("valid options");
    let app = payments(Arc::clone(&calls)).layer(layer);
    let (_, alice) = pay(&app, "alice-token", "order-17").await;
    let (status, bob) = pay(&app, "bob-token", "order-17").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(bob, alice, "one scope for everyone");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // A request without credentials joins it too.
    let (_, anyone) = send(&app, keyed(None, &[])).await;
    assert!(
        anyone.contains(problem::KEY_REUSED),
        "other body, same scope: {anyone}"
    );
}
