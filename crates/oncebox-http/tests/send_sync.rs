//! Compile-time checks: the layer and its services are `Send + Sync + Clone`, their
//! futures and bodies `Send`, so they fit axum and multi-threaded runtimes.

use std::sync::Arc;

use axum::body::Body;
use http::Request;
use oncebox_core::memory::{LayeredDedupStore, MemoryDedupStore};
use oncebox_http::{
    HeaderPrincipal, Idempotency, IdempotencyKey, IdempotencyLayer, IdempotencyOptions,
    RequestBody, ResponseBody, SharedScope,
};
use oncebox_redis::RedisDedupStore;
use oncebox_sqlite::SqliteDedupStore;
use tower::Layer;
use tower_service::Service;

fn send_sync_clone<T: Send + Sync + Clone>() {}
fn send<T: Send>(_: &T) {}

#[allow(dead_code)]
fn future_is_send(
    mut service: Idempotency<axum::routing::Route, Arc<MemoryDedupStore>, HeaderPrincipal>,
) {
    send(&service.call(Request::new(Body::empty())));
}

#[test]
fn handles_are_send_sync_and_clone() {
    send_sync_clone::<IdempotencyLayer<Arc<MemoryDedupStore>, SharedScope>>();
    send_sync_clone::<IdempotencyLayer<RedisDedupStore, HeaderPrincipal>>();
    send_sync_clone::<IdempotencyLayer<SqliteDedupStore, HeaderPrincipal>>();
    send_sync_clone::<IdempotencyLayer<Arc<LayeredDedupStore<RedisDedupStore>>, HeaderPrincipal>>();
    send_sync_clone::<IdempotencyKey>();
    fn send_only<T: Send>() {}
    send_only::<RequestBody<Body>>();
    send_only::<ResponseBody<Body>>();
    let layer = IdempotencyLayer::new(
        MemoryDedupStore::new(10),
        HeaderPrincipal::authorization(),
        IdempotencyOptions::new(),
    )
    .expect("valid options");
    let service = layer.layer(tower::service_fn(|_: Request<RequestBody<Body>>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    }));
    let _ = service.clone();
}
