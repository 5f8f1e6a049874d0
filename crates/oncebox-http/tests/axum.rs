//! With the `axum` feature: route templates as scope under `route_layer`, and the
//! `IdempotencyKey` extractor.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use oncebox_core::memory::MemoryDedupStore;
use oncebox_http::{
    HeaderPrincipal, IdempotencyKey, IdempotencyLayer, IdempotencyOptions, problem,
};
use tower::ServiceExt;

async fn refund(key: IdempotencyKey, body: String) -> String {
    format!(
        "refund for key {key}, body {body}, {}",
        uuid::Uuid::new_v4()
    )
}

async fn call(app: &Router, path: &str, key: &str, body: &'static str) -> (StatusCode, String) {
    let request = Request::post(path)
        .header("authorization", "Bearer shop-1")
        .header("idempotency-key", key)
        .body(Body::from(body))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn layer() -> IdempotencyLayer<Arc<MemoryDedupStore>, HeaderPrincipal> {
    IdempotencyLayer::new(
        Arc::new(MemoryDedupStore::new(1000)),
        HeaderPrincipal::authorization(),
        IdempotencyOptions::new(),
    )
    .expect("valid options")
}

#[tokio::test]
async fn route_layer_scopes_keys_by_route_template() {
    let app = Router::new()
        .route("/orders/{id}/refund", post(refund))
        .route_layer(layer());
    let (status, body) = call(&app, "/orders/1/refund", "k", "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("refund for key k"), "{body}");
    // Same template, same key, another order: the key was used for another request.
    let (status, body) = call(&app, "/orders/2/refund", "k", "{}").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.contains(problem::KEY_REUSED));
}

#[tokio::test]
async fn router_layer_scopes_keys_by_route_template_too() {
    // `Router::layer` wraps each route after routing, so the template is known.
    let app = Router::new()
        .route("/orders/{id}/refund", post(refund))
        .layer(layer());
    let (first, _) = call(&app, "/orders/1/refund", "k", "{}").await;
    let (second, _) = call(&app, "/orders/2/refund", "k", "{}").await;
    assert_eq!(
        (first, second),
        (StatusCode::OK, StatusCode::UNPROCESSABLE_ENTITY)
    );
}

#[tokio::test]
async fn wrapping_the_router_scopes_keys_by_path() {
    use tower::Layer;
    // Around the whole router, the layer runs before routing: the path is the scope.
    let router = Router::new().route("/orders/{id}/refund", post(refund));
    let app = Router::new().fallback_service(layer().layer(router));
    let (first, _) = call(&app, "/orders/1/refund", "k", "{}").await;
    let (second, _) = call(&app, "/orders/2/refund", "k", "{}").await;
    assert_eq!((first, second), (StatusCode::OK, StatusCode::OK));
}

#[tokio::test]
async fn extractor_rejects_requests_without_a_key() {
    // Without the layer, the extractor reads and validates the header itself.
    let app = Router::new().route("/orders/{id}/refund", post(refund));
    let request = Request::post("/orders/1/refund")
        .body(Body::empty())
        .expect("request");
    let response = app.oneshot(request).await.expect("infallible");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.headers()["content-type"], problem::CONTENT_TYPE);
}
